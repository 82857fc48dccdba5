package httpgw

import (
	"net/http"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/front"
)

// resolveAdapter returns the route of a request whose model names no
// configured model, or answers the client with 404 and returns nil.
func (s *Server) resolveAdapter(c *call, st *fleet.State, name string) *fleet.AdapterRoute {
	r, err := st.AdapterRoute(name)
	if err != nil {
		c.oc.fail(c.w, http.StatusNotFound, front.TypeNotFound, "model_not_found", "model", err.Error())
		return nil
	}
	return r
}

// target returns the replicas a call may be routed to (gateway.Target):
// for an adapter, those whose engines serve it, its name the policy's to
// see; for a continued response, the replica holding it (call.pin);
// leaving out the replica failed ("" none), which a retry avoids; with
// the call's latency objective.
func (c *call) target(failed string) gateway.Target {
	t := gateway.Target{Exclude: failed}
	c.slo.Apply(&t)
	var eligible map[string]bool
	if c.lora != nil {
		t.Adapter, eligible = c.lora.Name, c.lora.Eligible
	}
	switch pin := c.pin; {
	case pin != "":
		// A continued response goes where its conversation is stored.
		t.Allow = func(name string) bool { return name == pin && (eligible == nil || eligible[name]) }
	case eligible != nil:
		t.Allow = func(name string) bool { return eligible[name] }
	}
	return t
}

// adapterName is the call's adapter, "" for the base model.
func (c *call) adapterName() string {
	if c.lora == nil {
		return ""
	}
	return c.lora.Name
}

package fleetpick

import (
	"net/http"
	"strconv"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/keys"
	"github.com/examlops/gateway/picker"
)

// stored picks for a request about a stored response (front.StoredPrefix:
// GET and DELETE /v1/responses/{id}, POST .../cancel, GET
// .../input_items), as the HTTP gateway routes it: the replica that
// produced the response (front.RouteStored, within the subset hint),
// with no fallbacks, since no other engine holds it; an unknown id gets
// 404 naming it, a replica not eligible 503. A response the engine
// deleted (a 200 to DELETE) is forgotten when the request is done.
func (r *Router) stored(req *picker.PickRequest, path string, start time.Time) (picker.Pick, error) {
	pr := pickRequest{r: r, kind: keys.Responses, start: start, fallback: -1}
	sr, serr := front.ParseStored(req.Method, path)
	if serr != nil {
		return pr.storedFail(serr)
	}
	st := r.fl.Snapshot()
	pr.tab, pr.sub = r.tableOf(st), req.Subset
	ms, d, ep, serr := front.RouteStored(st, &r.respIDs, sr, func(ms *fleet.Model, name string) bool {
		return pr.tab.allows(ms, pr.sub, name)
	})
	pr.ms = ms
	if serr != nil {
		return pr.storedFail(serr)
	}
	endpoint, err := pr.tab.endpointOf(ep.Base)
	if err != nil { // not reached: allows found its endpoint
		d.Done(gateway.DoneInfo{Err: err})
		return pr.storedFail(&front.StoredError{Status: http.StatusServiceUnavailable, Type: front.TypeUnavailable, Code: "no_healthy_replica", Err: err})
	}
	t := pr.trackPass(d, ep, endpoint, "responses")
	if req.Method == http.MethodDelete {
		t.forget = sr.ID
	}
	return picker.Pick{Endpoint: endpoint, ResponseHeaders: []picker.Header{{Name: front.HeaderReplica, Value: d.Replica}}, Tracker: t}, nil
}

// storedFail counts and returns the picker's own answer to a request
// about a stored response.
func (pr *pickRequest) storedFail(e *front.StoredError) (picker.Pick, error) {
	endpoint, model := "responses", ""
	if e.Code == "unknown_endpoint" {
		endpoint = "other"
	}
	if pr.ms != nil {
		model = pr.ms.Name
	}
	return pr.passFail(model, endpoint, &picker.StatusError{Status: e.Status, Type: e.Type, Code: e.Code, Param: e.Param, Err: e.Err, Allow: e.Allow})
}

// passFail counts a request without a prompt that the picker answers
// itself, under its endpoint label, and returns its error.
func (pr *pickRequest) passFail(model, endpoint string, e *picker.StatusError) (picker.Pick, error) {
	pr.r.metrics.Requests.WithLabelValues(model, endpoint, strconv.Itoa(e.Status)).Inc()
	return picker.Pick{}, e
}

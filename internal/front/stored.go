package front

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
)

// The Responses API's requests about a stored response, which only the
// engine that stored it can answer:
//
//	GET    /v1/responses/{id}              (retrieve)
//	DELETE /v1/responses/{id}              (delete)
//	POST   /v1/responses/{id}/cancel       (cancel)
//	GET    /v1/responses/{id}/input_items  (list input items)
//
// Both fronts send each to the replica that produced response id, as
// their ResponseIDs remembers it (RouteStored), with its query string and
// body as they are. An id the front does not know gets 404 naming it;
// a replica that is not eligible, 503.

// StoredPrefix is the path prefix of the requests about a stored response.
const StoredPrefix = "/v1/responses/"

// maxStoredID bounds a response id in a path (ResponseID learns none
// longer).
const maxStoredID = 256

// StoredRequest is a request about a stored response: its id and the
// operation (the path's last element, "" for retrieve and delete).
type StoredRequest struct {
	ID, Op string
}

// StoredError is why a request about a stored response is answered by the
// front itself: the status and the OpenAI error's type, code and param.
type StoredError struct {
	Status            int
	Type, Code, Param string
	// Allow, for a 405, lists the methods the path accepts.
	Allow string
	Err   error
}

func (e *StoredError) Error() string { return e.Err.Error() }

// ParseStored reads a request about a stored response from its method
// and path (without the query): the id and operation, or a 404
// (unknown_endpoint) for a path that names none, a 405 for a method the
// operation does not take.
func ParseStored(method, path string) (StoredRequest, *StoredError) {
	rest, ok := strings.CutPrefix(path, StoredPrefix)
	id, op, hasOp := strings.Cut(rest, "/")
	allow := ""
	switch {
	case !hasOp:
		allow = "GET, DELETE"
	case op == "cancel":
		allow = "POST"
	case op == "input_items":
		allow = "GET"
	}
	if !ok || id == "" || allow == "" {
		return StoredRequest{}, &StoredError{Status: http.StatusNotFound, Type: TypeNotFound, Code: "unknown_endpoint",
			Err: fmt.Errorf("gateway: no endpoint %s (a stored response is %s{id}, %s{id}/cancel or %s{id}/input_items)", path, StoredPrefix, StoredPrefix, StoredPrefix)}
	}
	if !slices.Contains(strings.Split(allow, ", "), method) {
		return StoredRequest{}, &StoredError{Status: http.StatusMethodNotAllowed, Type: TypeInvalidRequest, Code: "method_not_allowed", Allow: allow,
			Err: fmt.Errorf("gateway: %s accepts %s only, not %s", path, allow, method)}
	}
	return StoredRequest{ID: id, Op: op}, nil
}

// RouteStored routes a request about stored response sr.ID to the
// replica that produced it, by the library's decision (RouteWith, as a
// request without a prompt, allowing that replica alone and only if
// allow, when not nil, accepts it for the model): the model, the decision (whose Done
// the caller owes) and its engine. An id ids does not know gets a 404
// naming it (response_not_found), as does one whose replica is no
// longer configured (the id is forgotten: no engine can answer it); a
// replica not eligible (unhealthy, outside allow), a 503 naming it.
func RouteStored(st *fleet.State, ids *ResponseIDs, sr StoredRequest, allow func(ms *fleet.Model, replica string) bool) (*fleet.Model, gateway.Decision, *fleet.Endpoint, *StoredError) {
	model, replica, ok := "", "", len(sr.ID) <= maxStoredID
	if ok {
		model, replica, ok = ids.Lookup(sr.ID)
	}
	if ok && !configured(st, model, replica) {
		ids.Forget(sr.ID)
		return nil, gateway.Decision{}, nil, &StoredError{Status: http.StatusNotFound, Type: TypeInvalidRequest, Code: "response_not_found", Param: "response_id",
			Err: fmt.Errorf("gateway: response %q not found: replica %q of model %q, which stored it, is no longer configured", sr.ID, replica, model)}
	}
	if !ok {
		return nil, gateway.Decision{}, nil, &StoredError{Status: http.StatusNotFound, Type: TypeInvalidRequest, Code: "response_not_found", Param: "response_id",
			Err: fmt.Errorf("gateway: response %q not found: no request through this gateway produced it, or it was forgotten (the engine that stored it alone holds it)", sr.ID)}
	}
	unavailable := func(err error) *StoredError {
		return &StoredError{Status: http.StatusServiceUnavailable, Type: TypeUnavailable, Code: "no_healthy_replica",
			Err: fmt.Errorf("gateway: replica %q of model %q, which stored response %q, is not eligible: %w", replica, model, sr.ID, err)}
	}
	ms := st.Models[model]
	if ms == nil || ms.Gateway == nil {
		return nil, gateway.Decision{}, nil, unavailable(errors.New("the model is no longer configured"))
	}
	d, err := ms.Gateway.RouteWith(nil, gateway.Target{NoPrompt: true, Allow: func(name string) bool {
		return name == replica && (allow == nil || allow(ms, name))
	}})
	if err != nil {
		return ms, gateway.Decision{}, nil, unavailable(err)
	}
	ep := EndpointOf(st, ms, &d)
	if ep == nil {
		d.Done(gateway.DoneInfo{})
		return ms, gateway.Decision{}, nil, unavailable(errors.New("it is no longer configured"))
	}
	return ms, d, ep, nil
}

// StoredOwner returns the replica of model that stored response id, for a
// request continuing it (previous_response_id), when ids knows it and that
// replica is still configured in st; an id whose replica is gone is
// forgotten, so the request is routed as any other and the engine answers
// for the unknown id, rather than 503 until the id ages out.
func StoredOwner(st *fleet.State, ids *ResponseIDs, id, model string) (string, bool) {
	replica, ok := ids.Owner(id, model)
	if ok && !configured(st, model, replica) {
		ids.Forget(id)
		return "", false
	}
	return replica, ok
}

// configured reports whether replica is in model's table in st.
func configured(st *fleet.State, model, replica string) bool {
	ms := st.Models[model]
	if ms == nil {
		return false
	}
	_, ok := ms.ByName[replica]
	return ok
}

package httpgw

import (
	"net/http"
	"strconv"

	"github.com/examlops/gateway/internal/budget"
	"github.com/examlops/gateway/internal/front"
)

// serveStored handles the requests about a stored response
// (front.StoredPrefix: GET and DELETE /v1/responses/{id}, POST
// /v1/responses/{id}/cancel, GET /v1/responses/{id}/input_items): each
// goes to the replica that produced the response (front.RouteStored),
// forwarded as a pass-through request is (its query and body as they
// are, the answer relayed as it comes, not retried elsewhere: no other
// engine holds the response). A response the engine deleted (a 200 to
// DELETE) is forgotten.
func (s *Server) serveStored(w http.ResponseWriter, r *http.Request) {
	pc := &passCall{w: w, r: r, endpoint: "responses"}
	s.metrics.InFlight.Inc()
	defer func() {
		s.metrics.InFlight.Dec()
		s.metrics.Requests.WithLabelValues(pc.model, pc.endpoint, pc.code).Inc()
	}()
	if s.refused(w, r, pc.fail) {
		return
	}
	sr, serr := front.ParseStored(r.Method, r.URL.Path)
	var body []byte
	var in budget.Hold
	defer s.releaseBody(&in)
	if serr == nil && r.Method != http.MethodGet {
		// A body (cancel's, delete's) is forwarded as it is, within the
		// bound of any request's.
		var ok bool
		if body, ok = s.readRequest(w, r, &in, pc.fail); !ok {
			return
		}
	}
	if serr != nil {
		s.storedFail(pc, serr)
		return
	}
	ms, d, ep, serr := front.RouteStored(s.Snapshot(), &s.respIDs, sr, nil)
	if ms != nil {
		pc.model = ms.Name
	}
	if serr != nil {
		s.storedFail(pc, serr)
		return
	}
	s.passSend(pc, d, ep, body, false)
	if r.Method == http.MethodDelete && pc.code == strconv.Itoa(http.StatusOK) {
		s.respIDs.Forget(sr.ID)
	}
}

// storedFail answers a request about a stored response with the front's
// own error.
func (s *Server) storedFail(pc *passCall, e *front.StoredError) {
	if e.Allow != "" {
		pc.w.Header().Set("Allow", e.Allow)
	}
	pc.fail(e.Status, e.Type, e.Code, e.Param, e.Err.Error())
}

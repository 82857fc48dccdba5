package httpgw

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

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
	sr, serr := front.ParseStored(r.Method, r.URL.Path)
	var body []byte
	if serr == nil && r.Method != http.MethodGet {
		// A body (cancel's, delete's) is forwarded as it is, within the
		// bound of any request's.
		var err error
		body, err = readBody(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes), r.ContentLength, s.opts.MaxBodyBytes)
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			pc.fail(http.StatusRequestEntityTooLarge, front.TypeInvalidRequest, "request_too_large", "",
				fmt.Sprintf("%v: the body exceeds %d bytes", ErrBodyTooLarge, mbe.Limit))
			return
		case err != nil:
			pc.fail(http.StatusBadRequest, front.TypeInvalidRequest, "invalid_body", "", fmt.Sprintf("%v: reading the body: %v", ErrBadRequest, err))
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

package httpgw

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/examlops/gateway/internal/budget"
	"github.com/examlops/gateway/internal/front"
)

// requestCharge is what a request body costs against MaxRequestBytes,
// per byte of its buffer's capacity: the buffer and the parsed request's
// copy of the text (messages, prompt). TestRequestBodiesMemory measured
// the live heap at 2.15 times the bodies of 64 streamed requests of 7 MiB
// in flight at once, and 3.15 times for non-streamed ones, whose body the
// gateway rewrites to ask for a stream: each rewritten body is charged by
// its own capacity (makeBody).
const requestCharge = 2

// errBodiesOverBudget marks a request whose body the MaxRequestBytes
// budget cannot hold.
var errBodiesOverBudget = errors.New("the request bodies in flight hold the gateway's budget for them (MaxRequestBytes, --max-request-bytes)")

// failFunc answers the client with an error and records the outcome (a
// call's or a pass-through call's fail).
type failFunc func(status int, typ, code, param, msg string)

// readRequest reads r's body, at most MaxBodyBytes, into a buffer charged
// to h, a share of the MaxRequestBytes budget that the caller releases
// (releaseBody) once the call is done with the body. A body over
// MaxBodyBytes gets 413 (at once when its Content-Length says so), one
// the budget cannot hold 503 overloaded with
// Retry-After (as soon as its buffer would pass the budget, before the
// rest is read), one that cannot be read 400; then readRequest returns
// false, having answered.
func (s *Server) readRequest(w http.ResponseWriter, r *http.Request, h *budget.Hold, fail failFunc) ([]byte, bool) {
	h.B = s.bodies
	limit := s.opts.MaxBodyBytes
	if r.ContentLength > limit {
		// Refused for its size before any of it is read, whatever the
		// budget holds.
		fail(http.StatusRequestEntityTooLarge, front.TypeInvalidRequest, "request_too_large", "",
			fmt.Sprintf("%v: the body exceeds %d bytes", ErrBodyTooLarge, limit))
		return nil, false
	}
	body, err := h.ReadAllSize(http.MaxBytesReader(w, r.Body, limit), r.ContentLength, limit, requestCharge)
	if err == nil {
		return body, true
	}
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe), errors.Is(err, budget.ErrTooLong):
		fail(http.StatusRequestEntityTooLarge, front.TypeInvalidRequest, "request_too_large", "",
			fmt.Sprintf("%v: the body exceeds %d bytes", ErrBodyTooLarge, limit))
	case errors.Is(err, budget.ErrSpent):
		s.bodiesOverBudget(w, fail, err)
	default:
		fail(http.StatusBadRequest, front.TypeInvalidRequest, "invalid_body", "", fmt.Sprintf("%v: reading the body: %v", ErrBadRequest, err))
	}
	return nil, false
}

// makeBody makes a body from a request's (build) within the request's
// share h of MaxRequestBytes: it reserves n bytes, the most build is
// expected to allocate, before build runs, so that a request the budget
// cannot hold allocates nothing, then charges whatever the body holds
// beyond n. Past the budget the error wraps budget.ErrSpent (what it
// reserved stays in h until the call releases it).
func makeBody(h *budget.Hold, n int, build func() ([]byte, error)) ([]byte, error) {
	if err := h.Need(h.Held() + int64(n)); err != nil {
		return nil, err
	}
	b, err := build()
	if err != nil {
		return nil, err
	}
	if extra := int64(cap(b) - n); extra > 0 {
		if err := h.Need(h.Held() + extra); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// bodiesOverBudget answers a request whose body the MaxRequestBytes
// budget cannot hold with 503 overloaded and Retry-After: 1, as the
// picker answers one past its MaxBufferedBytes.
func (s *Server) bodiesOverBudget(w http.ResponseWriter, fail failFunc, err error) {
	w.Header().Set("Retry-After", "1")
	fail(http.StatusServiceUnavailable, front.TypeUnavailable, "overloaded", "",
		fmt.Sprintf("gateway: %v: %v; retry later", errBodiesOverBudget, err))
}

// releaseBody returns a call's share of the MaxRequestBytes budget; the
// memory of long bodies is given back to the OS as that of long answers
// is (memReturner).
func (s *Server) releaseBody(h *budget.Hold) {
	held := h.Held()
	h.Release()
	s.mem.ended(held / requestCharge)
}

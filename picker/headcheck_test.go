package picker

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// refusingRouter refuses requests whose x-refuse header is set, from the
// headers alone, and counts the Picks it is asked for.
type refusingRouter struct {
	*GatewayRouter
	checked, picked atomic.Int64
	body            atomic.Bool // CheckHead saw a body
}

func (r *refusingRouter) CheckHead(req *PickRequest) error {
	r.checked.Add(1)
	if req.Body != nil {
		r.body.Store(true)
	}
	if req.Header.Get("x-refuse") != "" {
		return &StatusError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "rate_limited", Err: errors.New("over its rate"), RetryAfter: 3 * time.Second}
	}
	return nil
}

func (r *refusingRouter) Pick(ctx context.Context, req *PickRequest) (Pick, error) {
	r.picked.Add(1)
	return r.GatewayRouter.Pick(ctx, req)
}

// A HeadChecker's refusal answers the request when its headers arrive,
// before any body is sent, with its status and Retry-After; Pick is not
// called. A request it lets through is picked as usual, and CheckHead
// never sees a body.
func TestHeadChecker(t *testing.T) {
	r := &refusingRouter{GatewayRouter: newRouter(t, newGateway(t, 2), 0)}
	h := startPicker(t, r, Options{})
	e := h.open(t)
	e.send(reqHeaders(false, nil, ":method", "POST", ":path", "/v1/chat/completions", "x-refuse", "1"))
	m := e.recv()
	im := m.GetImmediateResponse()
	if im == nil || im.GetStatus().GetCode() != 429 {
		t.Fatalf("got %v, want an immediate 429 at the headers", m)
	}
	ra := ""
	for _, o := range im.GetHeaders().GetSetHeaders() {
		if o.GetHeader().GetKey() == "retry-after" {
			ra = string(o.GetHeader().GetRawValue())
		}
	}
	if ra != "3" {
		t.Fatalf("retry-after %q, want 3", ra)
	}
	if got := r.picked.Load(); got != 0 {
		t.Fatalf("Pick called %d times for a refused request", got)
	}
	if res := h.open(t).request(nil, chat("s", "s", "q"), 0); res.immediate != nil {
		t.Fatalf("a request let through: immediate %v", res.immediate)
	}
	if r.picked.Load() != 1 || r.checked.Load() != 2 || r.body.Load() {
		t.Fatalf("picked %d, checked %d, body seen %v: want 1, 2, false", r.picked.Load(), r.checked.Load(), r.body.Load())
	}
}

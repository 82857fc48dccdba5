package picker

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
)

// refusingRouter refuses requests whose x-refuse header is set, from the
// headers alone, and counts the Picks it is asked for.
type refusingRouter struct {
	*GatewayRouter
	checked, picked atomic.Int64
	body            atomic.Bool // CheckHead saw a body
	client          atomic.Pointer[string]
}

func (r *refusingRouter) CheckHead(req *PickRequest) error {
	r.checked.Add(1)
	c := req.ClientAddress
	r.client.Store(&c)
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

// The source.address request attribute reaches the Router as
// PickRequest.ClientAddress: under the ext_proc filter's name, else under
// the first name that has it; a value that is not a string is none.
func TestSourceAddress(t *testing.T) {
	str := func(v string) *structpb.Struct {
		return &structpb.Struct{Fields: map[string]*structpb.Value{SourceAttribute: structpb.NewStringValue(v)}}
	}
	for _, tc := range []struct {
		attrs map[string]*structpb.Struct
		want  string
	}{
		{nil, ""},
		{map[string]*structpb.Struct{extProcFilter: str("10.0.0.1:5")}, "10.0.0.1:5"},
		{map[string]*structpb.Struct{"b": str("10.0.0.2:5"), "a": str("10.0.0.3:5")}, "10.0.0.3:5"},
		{map[string]*structpb.Struct{"a": str("10.0.0.3:5"), extProcFilter: str("10.0.0.1:5")}, "10.0.0.1:5"},
		{map[string]*structpb.Struct{extProcFilter: {Fields: map[string]*structpb.Value{SourceAttribute: structpb.NewNumberValue(1)}}}, ""},
		{map[string]*structpb.Struct{extProcFilter: {Fields: map[string]*structpb.Value{"request.path": structpb.NewStringValue("/x")}}}, ""},
	} {
		if got := sourceAddress(tc.attrs); got != tc.want {
			t.Errorf("sourceAddress(%v) = %q, want %q", tc.attrs, got, tc.want)
		}
	}
	r := &refusingRouter{GatewayRouter: newRouter(t, newGateway(t, 2), 0)}
	h := startPicker(t, r, Options{})
	e := h.open(t)
	m := reqHeaders(false, nil, ":method", "POST", ":path", "/v1/chat/completions", "x-refuse", "1")
	m.Attributes = map[string]*structpb.Struct{extProcFilter: str("192.0.2.9:4000")}
	e.send(m)
	e.recv()
	if got := r.client.Load(); got == nil || *got != "192.0.2.9:4000" {
		t.Fatalf("ClientAddress %v, want 192.0.2.9:4000", got)
	}
}

package picker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// fixedRouter answers every Pick with pick (and err), after recording
// the request's Received time.
type fixedRouter struct {
	pick     Pick
	err      error
	received chan time.Time
}

func (r *fixedRouter) Pick(_ context.Context, req *PickRequest) (Pick, error) {
	if r.received != nil {
		r.received <- req.Received
	}
	return r.pick, r.err
}

// TestReply: a Router's own answer goes to the client as an immediate
// response with its status, content type and body, and its Tracker hears
// Done at once; an invalid status is a 500.
func TestReply(t *testing.T) {
	for _, tc := range []struct {
		name   string
		reply  Reply
		status int
	}{
		{"ok", Reply{Status: 200, ContentType: "application/json", Body: []byte(`{"object":"list"}`)}, 200},
		{"no content type", Reply{Status: 404, Body: []byte("no")}, 404},
		{"bad status", Reply{Status: 99}, 500},
		{"undefined status", Reply{Status: 299}, 500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder("")
			r := &fixedRouter{pick: Pick{Endpoint: "10.0.0.1:80", Reply: &tc.reply, Tracker: (*recTracker)(rec)}}
			h := startPicker(t, r, Options{})
			e := h.open(t)
			e.send(reqHeaders(true, nil, ":method", "GET", ":path", "/v1/models"))
			im := e.recv().GetImmediateResponse()
			if im == nil {
				t.Fatal("want an immediate response")
			}
			if got := int(im.GetStatus().GetCode()); got != tc.status {
				t.Fatalf("status %d, want %d", got, tc.status)
			}
			o := rec.waitDone(t)
			if tc.status == 500 {
				if o.Err == nil || !strings.Contains(string(im.GetBody()), "not an HTTP status") {
					t.Fatalf("outcome %+v, body %s", o, im.GetBody())
				}
				return
			}
			if o.Status != tc.status || o.Err != nil {
				t.Fatalf("outcome %+v", o)
			}
			if string(im.GetBody()) != string(tc.reply.Body) {
				t.Fatalf("body %q", im.GetBody())
			}
			var ct string
			for _, o := range im.GetHeaders().GetSetHeaders() {
				if o.GetHeader().GetKey() == "content-type" {
					ct = string(o.GetHeader().GetRawValue())
				}
			}
			if ct != tc.reply.ContentType {
				t.Fatalf("content type %q, want %q", ct, tc.reply.ContentType)
			}
		})
	}
}

// TestPickHeaders: valid Headers let the request through (what they set is
// TestPickHeadersMutation's); invalid ones are a 500 and the Tracker
// hears Done.
func TestPickHeaders(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers []Header
		bad     bool
	}{
		{"set and remove", []Header{{"x-prefiller-host-port", "10.0.0.9:8000"}, {"x-other", ""}}, false},
		{"pseudo-header", []Header{{":path", "/x"}}, true},
		{"host", []Header{{"Host", "x"}}, true},
		{"space in name", []Header{{"a b", "x"}}, true},
		{"CRLF in value", []Header{{"x-a", "1\r\nx-b: 2"}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder("")
			r := &fixedRouter{pick: Pick{Endpoint: "10.0.0.1:80", Headers: tc.headers, Tracker: (*recTracker)(rec)}}
			h := startPicker(t, r, Options{})
			e := h.open(t)
			got := e.request(nil, chat("s", "", "u"), 0)
			if tc.bad {
				if got.immediate == nil || got.immediate.GetStatus().GetCode() != 500 {
					t.Fatalf("want a 500, got %+v", got)
				}
				if o := rec.waitDone(t); o.Err == nil {
					t.Fatal("the Tracker heard no error")
				}
				return
			}
			if got.dest != "10.0.0.1:80" {
				t.Fatalf("destination %q", got.dest)
			}
			e.respond("application/json", []byte("{}"))
			rec.waitDone(t)
		})
	}
}

// TestPickHeadersMutation reads the headers response itself.
func TestPickHeadersMutation(t *testing.T) {
	m := requestHeadersResponse("10.0.0.1:80", true, 3, []Header{{"x-prefiller-host-port", "h:1"}, {"x-gone", ""}})
	hm := m.GetRequestHeaders().GetResponse().GetHeaderMutation()
	got := map[string]string{}
	for _, o := range hm.GetSetHeaders() {
		got[o.GetHeader().GetKey()] = string(o.GetHeader().GetRawValue())
	}
	want := map[string]string{DestinationKey: "10.0.0.1:80", "Content-Length": "3", "x-prefiller-host-port": "h:1"}
	if len(got) != len(want) {
		t.Fatalf("set %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("set %v, want %v", got, want)
		}
	}
	if r := hm.GetRemoveHeaders(); len(r) != 1 || r[0] != "x-gone" {
		t.Fatalf("remove %v", r)
	}
}

// TestStatusError: a Router's StatusError chooses the status and the
// OpenAI error object; an out-of-range status falls back to the
// sentinels' mapping; every 429 carries Retry-After (1 s unless the
// StatusError's RetryAfter says), another status only when it says; a
// 405 carries its Allow.
func TestStatusError(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		status int
		code   *string
		param  *string
		retry  string // the Retry-After header, "" none
	}{
		{"status error", &StatusError{Status: 405, Type: "invalid_request_error", Code: "method_not_allowed", Err: errors.New("gateway: POST only")},
			405, ptr("method_not_allowed"), nil, ""},
		{"with param", &StatusError{Status: 404, Type: "not_found_error", Code: "model_not_found", Param: "model", Err: ErrUnknownModel},
			404, ptr("model_not_found"), ptr("model"), ""},
		{"no code", &StatusError{Status: 400, Type: "invalid_request_error", Err: errors.New("x")}, 400, nil, nil, ""},
		{"out of range", &StatusError{Status: 200, Err: ErrShed}, 429, ptr("shed"), nil, "1"},
		{"undefined status", &StatusError{Status: 499, Err: errors.New("x")}, 500, ptr("picker_error"), nil, ""},
		{"shed", fmt.Errorf("%w: full", ErrShed), 429, ptr("shed"), nil, "1"},
		{"429 retry after", &StatusError{Status: 429, Type: "rate_limit_error", Code: "shed", RetryAfter: 2500 * time.Millisecond, Err: ErrShed},
			429, ptr("shed"), nil, "3"},
		{"503 retry after", &StatusError{Status: 503, Type: "service_unavailable_error", Code: "busy", RetryAfter: time.Second, Err: errors.New("x")},
			503, ptr("busy"), nil, "1"},
		{"overloaded", fmt.Errorf("%w: stream budget", ErrOverloaded), 503, ptr("overloaded"), nil, "1"},
		{"no endpoint", fmt.Errorf("%w: none", ErrNoEndpoint), 503, ptr("no_eligible_endpoint"), nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			im := immediateResponse(tc.err).GetImmediateResponse()
			if got := int(im.GetStatus().GetCode()); got != tc.status {
				t.Fatalf("status %d, want %d", got, tc.status)
			}
			retry := ""
			for _, o := range im.GetHeaders().GetSetHeaders() {
				if o.GetHeader().GetKey() == "retry-after" {
					retry = string(o.GetHeader().GetRawValue())
				}
			}
			if retry != tc.retry {
				t.Fatalf("retry-after %q, want %q", retry, tc.retry)
			}
			var b struct {
				Error struct {
					Message string  `json:"message"`
					Code    *string `json:"code"`
					Param   *string `json:"param"`
				} `json:"error"`
			}
			if err := json.Unmarshal(im.GetBody(), &b); err != nil {
				t.Fatal(err)
			}
			if b.Error.Message != tc.err.Error() || !eqPtr(b.Error.Code, tc.code) || !eqPtr(b.Error.Param, tc.param) {
				t.Fatalf("body %s", im.GetBody())
			}
		})
	}
	// A 405's Allow is sent; another status's, or one with CR or LF, not.
	for _, tc := range []struct {
		err   *StatusError
		allow string
	}{
		{&StatusError{Status: 405, Allow: "POST", Err: errors.New("x")}, "POST"},
		{&StatusError{Status: 405, Allow: "GET, HEAD", Err: errors.New("x")}, "GET, HEAD"},
		{&StatusError{Status: 400, Allow: "POST", Err: errors.New("x")}, ""},
		{&StatusError{Status: 405, Allow: "POST\r\nx: y", Err: errors.New("x")}, ""},
	} {
		allow := ""
		for _, o := range immediateResponse(tc.err).GetImmediateResponse().GetHeaders().GetSetHeaders() {
			if o.GetHeader().GetKey() == "allow" {
				allow = string(o.GetHeader().GetRawValue())
			}
		}
		if allow != tc.allow {
			t.Errorf("status %d Allow %q: header %q, want %q", tc.err.Status, tc.err.Allow, allow, tc.allow)
		}
	}
	if !errors.Is(&StatusError{Status: 404, Err: ErrUnknownModel}, ErrUnknownModel) {
		t.Fatal("StatusError does not unwrap")
	}
	if (&StatusError{Status: http.StatusTeapot}).Error() == "" {
		t.Fatal("empty message")
	}
}

func ptr(s string) *string { return &s }

func eqPtr(a, b *string) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

// TestReceived: the Router learns when the request headers arrived, from
// Options.Clock.
func TestReceived(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1000, 0), step: time.Second}
	r := &fixedRouter{pick: Pick{Endpoint: "10.0.0.1:80"}, received: make(chan time.Time, 1)}
	h := startPicker(t, r, Options{Clock: clk.Now})
	e := h.open(t)
	e.request(nil, chat("s", "", "u"), 0)
	if got := <-r.received; !got.Equal(time.Unix(1001, 0)) {
		t.Fatalf("Received %v, want the first clock reading", got)
	}
}

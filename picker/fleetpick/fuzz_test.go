package fleetpick

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/picker"
)

// FuzzPick feeds Router.Pick arbitrary methods, paths, bodies, session
// headers and subset entries (a Responses API request continuing a stored
// response among them, its body read back as the answer's head; a session
// starting with a digit is also sent as x-slo-ttft-ms, over replicas whose
// speed is known, objectives refused when unmet): it never panics, every
// error is a picker.StatusError with an HTTP error status and leaves no
// load booked, and every pick names an ip:port endpoint within the
// subset, whose tracker releases the load.
func FuzzPick(f *testing.F) {
	f.Add("POST", "/v1/chat/completions", []byte(`{"model":"m1","messages":[{"role":"user","content":"hi"}]}`), "s", "10.0.0.1:8000")
	f.Add("POST", "/v1/completions?x=1", []byte(`{"model":"m1","prompt":["a","b"]}`), "", "")
	f.Add("GET", "/v1/models", []byte(nil), "", "10.0.0.2")
	f.Add("POST", "/v1/chat/completions", []byte(`{"model":"m2"}`), "", "")
	f.Add("PUT", "/x", []byte(`{`), "\x00", "::1")
	f.Add("POST", "/v1/responses", []byte(`{"model":"m1","instructions":"be terse","input":"hi"}`), "", "")
	f.Add("POST", "/v1/responses", []byte(`{"model":"m1","input":[{"role":"user","content":"hi"}],"previous_response_id":"resp_f"}`), "", "10.0.0.2:8000")
	f.Add("POST", "/v1/responses", []byte(`{"id":"resp_x","model":"m1","input":"hi","previous_response_id":"resp_f"}`), "", "10.0.0.1:8000")
	f.Add("GET", "/v1/responses/resp_f?include=x", []byte(nil), "", "10.0.0.2:8000")
	f.Add("DELETE", "/v1/responses/resp_unknown", []byte(nil), "", "")
	f.Add("POST", "/v1/responses/resp_f/cancel", []byte(nil), "", "10.0.0.1:8000")
	f.Add("POST", "/v1/embeddings", []byte(`{"model":"m1","input":[[1,2],[3]]}`), "", "")
	f.Add("POST", "/tokenize", []byte(`{"model":"m1","prompt":"a b"}`), "", "10.0.0.1:8000")
	f.Add("POST", "/v1/chat/completions", []byte(`{"model":"m1","messages":[{"role":"user","content":"a question of some words"}]}`), "1", "")
	f.Add("POST", "/v1/chat/completions", []byte(`{"model":"m1","messages":[{"role":"user","content":"hi"}]}`), "60000", "10.0.0.1:8000")
	f.Add("POST", "/v1/completions", []byte(`{"model":"m1","prompt":"hi"}`), "9999999999", "")
	s := pickServer(f, gateway.ModeCacheAware, "http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://engine:8000")
	p, err := New(s, Options{Fallbacks: 2, Objectives: front.Objectives{Unattainable: front.Reject}})
	if err != nil {
		f.Fatal(err)
	}
	for range 3 {
		teachAll(f, s.Snapshot().Models[testModel].Gateway)
	}
	p.respIDs.Add("resp_f", testModel, "r1", "") // a stored response, on 10.0.0.2
	f.Fuzz(func(t *testing.T, method, path string, body []byte, session, subset string) {
		req := &picker.PickRequest{Method: method, Path: path, Body: body, Header: picker.Headers{{Name: "x-session-id", Value: session}}}
		if session != "" && session[0] >= '0' && session[0] <= '9' {
			req.Header = append(req.Header, picker.Header{Name: "x-slo-ttft-ms", Value: session})
		}
		idle := func() {
			for _, r := range s.Snapshot().Models[testModel].Gateway.Replicas() {
				if r.InFlight != 0 || r.PendingPrefill != 0 {
					t.Fatalf("replica %s has %d in flight, %d blocks pending", r.Name, r.InFlight, r.PendingPrefill)
				}
			}
		}
		if subset != "" {
			req.Subset = picker.Subset{subset}
		}
		pk, err := p.Pick(context.Background(), req)
		if err != nil {
			var se *picker.StatusError
			if !errors.As(err, &se) || se.Status < 400 || se.Status > 599 || se.Err == nil {
				t.Fatalf("error %v (%T) is not a StatusError with an error status", err, err)
			}
			idle()
			return
		}
		if pk.Reply != nil {
			if pk.Reply.Status != 200 { // GET or HEAD /v1/models; another method is a 405 StatusError (with Allow)
				t.Fatalf("reply status %d", pk.Reply.Status)
			}
			return
		}
		if _, err := netip.ParseAddrPort(pk.Endpoint); err != nil || !req.Subset.Allows(pk.Endpoint) {
			t.Fatalf("endpoint %q (subset %v): %v", pk.Endpoint, req.Subset, err)
		}
		// The body stands for the answer's head too: a Responses API
		// request may learn an id from it.
		if ht, ok := pk.Tracker.(picker.HeadTracker); ok {
			for c := body; len(c) > 0 && !ht.ResponseHead(200, c[:min(len(c), 7)]); c = c[min(len(c), 7):] {
			}
		}
		pk.Tracker.Done(picker.Outcome{Status: 200, TTFT: time.Millisecond, Elapsed: 2 * time.Millisecond, OutputTokens: 3})
		idle()
	})
}

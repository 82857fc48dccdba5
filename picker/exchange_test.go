package picker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// TestExchange plays one whole request through the picker as Envoy would
// and checks every answer: the destination named twice with the same
// value, the route cache cleared, Content-Length, the body back unchanged,
// the response echoed, and the gateway's in-flight count back to zero.
func TestExchange(t *testing.T) {
	gw := newGateway(t, 3)
	h := startPicker(t, newRouter(t, gw, 0), Options{})
	e := h.open(t)
	body := chat("You are terse.", "s1", "hello")
	r := e.request(nil, body, 0)
	if r.immediate != nil {
		t.Fatalf("immediate response %v", r.immediate)
	}
	if r.dest == "" || r.dest != r.metaDest {
		t.Fatalf("header destination %q, metadata %q: want the same non-empty value", r.dest, r.metaDest)
	}
	if !strings.HasPrefix(r.dest, "10.0.0.") || strings.Contains(r.dest, ",") {
		t.Fatalf("destination %q, want one test endpoint", r.dest)
	}
	if !r.clearRouteCache {
		t.Error("clear_route_cache not set")
	}
	if r.contentLength != strconv.Itoa(len(body)) {
		t.Errorf("Content-Length %q, want %d", r.contentLength, len(body))
	}
	if !bytes.Equal(r.body, body) {
		t.Errorf("body back %q, want %q", r.body, body)
	}
	if fl := inFlight(gw); fl[0]+fl[1]+fl[2] != 1 {
		t.Fatalf("in flight %v during the request, want one", fl)
	}
	answer := []byte(`{"choices":[{"message":{"content":"hi"}}]}`)
	if got := e.respond("application/json", answer); !bytes.Equal(got, answer) {
		t.Errorf("response echoed %q, want %q", got, answer)
	}
	if fl := inFlight(gw); fl[0]+fl[1]+fl[2] != 0 {
		t.Errorf("in flight %v after the response, want none", fl)
	}
}

// TestAffinity: requests sharing a system prompt and session go to the
// same endpoint; a cache-aware gateway keeps each conversation where its
// prefix is cached.
func TestAffinity(t *testing.T) {
	gw := newGateway(t, 4)
	h := startPicker(t, newRouter(t, gw, 0), Options{})
	sys := strings.Repeat("You are the ACME support assistant. ", 20)
	where := map[string]string{}
	for turn := range 4 {
		for _, session := range []string{"alice", "bob", "carol"} {
			e := h.open(t)
			r := e.request(nil, chat(sys, session, fmt.Sprintf("question %d", turn)), 0)
			if r.immediate != nil {
				t.Fatalf("immediate response %v", r.immediate)
			}
			e.respond("application/json", []byte(`{}`))
			if prev, ok := where[session]; ok && prev != r.dest {
				t.Fatalf("session %s turn %d went to %s, earlier turns to %s", session, turn, r.dest, prev)
			}
			where[session] = r.dest
		}
	}
}

// TestFallbacks: with MaxFallbacks the destination lists the chosen
// endpoint then distinct fallbacks, the same in header and metadata; the
// default sends the chosen endpoint alone.
func TestFallbacks(t *testing.T) {
	for _, tc := range []struct {
		name            string
		routerFB, maxFB int
		want            int
		subset          []any
		inSubset        map[string]bool
	}{
		{name: "default sends one", routerFB: 3, maxFB: 0, want: 1},
		{name: "two fallbacks", routerFB: 3, maxFB: 2, want: 3},
		{name: "router offers fewer", routerFB: 1, maxFB: 5, want: 2},
		{name: "within subset", routerFB: 3, maxFB: 3, want: 2, subset: []any{endpointN(1), endpointN(3)},
			inSubset: map[string]bool{endpointN(1): true, endpointN(3): true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gw := newGateway(t, 4)
			h := startPicker(t, newRouter(t, gw, tc.routerFB), Options{MaxFallbacks: tc.maxFB})
			e := h.open(t)
			md := (*corev3Metadata)(nil)
			if tc.subset != nil {
				md = subsetMD(t, tc.subset)
			}
			r := e.request(md, chat("sys", "s", "q"), 0)
			if r.immediate != nil {
				t.Fatalf("immediate response %v", r.immediate)
			}
			if r.dest != r.metaDest {
				t.Fatalf("header %q and metadata %q differ", r.dest, r.metaDest)
			}
			eps := strings.Split(r.dest, ",")
			if len(eps) != tc.want {
				t.Fatalf("destination %q has %d endpoints, want %d", r.dest, len(eps), tc.want)
			}
			seen := map[string]bool{}
			for _, ep := range eps {
				if seen[ep] {
					t.Fatalf("destination %q repeats %s", r.dest, ep)
				}
				seen[ep] = true
				if tc.inSubset != nil && !tc.inSubset[ep] {
					t.Fatalf("destination %q names %s, outside the subset", r.dest, ep)
				}
			}
			e.respond("application/json", []byte(`{}`))
			waitInFlight(t, gw)
		})
	}
}

// TestSubsetHint: every form of the hint restricts the pick; an empty or
// ineligible hint, or one of the wrong type, gets 503; a null hint or
// none allows all.
func TestSubsetHint(t *testing.T) {
	for _, tc := range []struct {
		name    string
		hint    any // nil: no metadata at all
		allowed []int
		status  int
	}{
		{name: "list", hint: []any{endpointN(1), endpointN(2)}, allowed: []int{1, 2}},
		{name: "comma string", hint: endpointN(0) + ", " + endpointN(3), allowed: []int{0, 3}},
		{name: "list of comma strings", hint: []any{endpointN(0) + "," + endpointN(2)}, allowed: []int{0, 2}},
		{name: "single", hint: []any{endpointN(2)}, allowed: []int{2}},
		{name: "bare ip allows its ports", hint: "10.0.0.2", allowed: []int{1}},
		{name: "bad entries skipped", hint: []any{"not-an-endpoint", 7.0, endpointN(3)}, allowed: []int{3}},
		{name: "partly eligible", hint: []any{"10.9.9.9:8000", endpointN(1)}, allowed: []int{1}},
		{name: "no hint", hint: nil, allowed: []int{0, 1, 2, 3}},
		{name: "null hint", hint: structNull{}, allowed: []int{0, 1, 2, 3}},
		{name: "empty list", hint: []any{}, status: 503},
		{name: "empty string", hint: "", status: 503},
		{name: "only separators", hint: " , ,", status: 503},
		{name: "ineligible", hint: []any{"10.9.9.9:8000", "10.0.0.1:9999"}, status: 503},
		{name: "hostnames", hint: []any{"localhost:8000"}, status: 503},
		{name: "number", hint: 42.0, status: 503},
		{name: "struct", hint: map[string]any{"a": "b"}, status: 503},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gw := newGateway(t, 4)
			h := startPicker(t, newRouter(t, gw, 0), Options{})
			var md *corev3Metadata
			switch v := tc.hint.(type) {
			case nil:
			case structNull:
				md = subsetMD(t, nil)
			default:
				md = subsetMD(t, v)
			}
			allowed := map[string]bool{}
			for _, i := range tc.allowed {
				allowed[endpointN(i)] = true
			}
			got := map[string]bool{}
			for i := range 12 {
				e := h.open(t)
				r := e.request(md, chat(fmt.Sprintf("system %d", i), "s", "q"), 0)
				if tc.status != 0 {
					if r.immediate == nil || int(r.immediate.GetStatus().GetCode()) != tc.status {
						t.Fatalf("got %+v, want immediate %d", r, tc.status)
					}
					if !bytes.Contains(r.immediate.GetBody(), []byte(SubsetKey)) {
						t.Errorf("503 body %s does not name %s", r.immediate.GetBody(), SubsetKey)
					}
					continue
				}
				if r.immediate != nil {
					t.Fatalf("immediate response %v", r.immediate)
				}
				if !allowed[r.dest] {
					t.Fatalf("picked %s, outside %v", r.dest, tc.allowed)
				}
				got[r.dest] = true
				e.respond("application/json", []byte(`{}`))
			}
			if tc.status == 0 && len(got) < 2 && len(tc.allowed) >= 2 {
				t.Errorf("12 distinct prompts all went to %v; the subset %v should spread them", got, tc.allowed)
			}
			waitInFlight(t, gw)
		})
	}
}

type structNull struct{}

// TestSubsetHintUnhealthy: a hint naming only unhealthy endpoints gets
// 503; the hint on a body message (GIE reads every message's metadata)
// takes effect too.
func TestSubsetHintUnhealthy(t *testing.T) {
	gw := newGateway(t, 3)
	if err := gw.SetHealthy("r1", false); err != nil {
		t.Fatal(err)
	}
	h := startPicker(t, newRouter(t, gw, 0), Options{})
	e := h.open(t)
	r := e.request(subsetMD(t, []any{endpointN(1)}), chat("s", "s", "q"), 0)
	if r.immediate == nil || r.immediate.GetStatus().GetCode() != 503 {
		t.Fatalf("got %+v, want 503", r)
	}
	// Hint on the body message rather than the headers.
	e = h.open(t)
	e.send(reqHeaders(false, nil))
	m := reqBody(chat("s", "s", "q"), true)
	m.MetadataContext = subsetMD(t, []any{endpointN(2)})
	e.send(m)
	r = e.readRouted()
	if r.dest != endpointN(2) {
		t.Fatalf("picked %q, want %s from the body message's hint", r.dest, endpointN(2))
	}
}

// TestNoEndpoint503 and shedding: no healthy replica gets 503; with
// ShedAbove, a request finding every endpoint at the limit gets 429, and
// one more is admitted once a request finishes.
func TestNoEndpointAndShed(t *testing.T) {
	t.Run("503", func(t *testing.T) {
		gw := newGateway(t, 2)
		for _, n := range []string{"r0", "r1"} {
			if err := gw.SetHealthy(n, false); err != nil {
				t.Fatal(err)
			}
		}
		h := startPicker(t, newRouter(t, gw, 0), Options{})
		r := h.open(t).request(nil, chat("s", "s", "q"), 0)
		if r.immediate == nil || r.immediate.GetStatus().GetCode() != 503 {
			t.Fatalf("got %+v, want 503", r)
		}
		var body struct {
			Error struct{ Type, Code, Message string }
		}
		if err := json.Unmarshal(r.immediate.GetBody(), &body); err != nil || body.Error.Code != "no_eligible_endpoint" {
			t.Fatalf("503 body %s: %v", r.immediate.GetBody(), err)
		}
	})
	t.Run("429", func(t *testing.T) {
		gw := newGateway(t, 2)
		router := newRouter(t, gw, 0)
		router.ShedAbove = 1
		h := startPicker(t, router, Options{})
		var open []*envoy
		for i := range 2 {
			e := h.open(t)
			if r := e.request(nil, chat(fmt.Sprint(i), "s", "q"), 0); r.immediate != nil {
				t.Fatalf("request %d: immediate %v", i, r.immediate)
			}
			open = append(open, e)
		}
		r := h.open(t).request(nil, chat("x", "s", "q"), 0)
		if r.immediate == nil || r.immediate.GetStatus().GetCode() != 429 {
			t.Fatalf("third request with both endpoints at the limit: got %+v, want 429", r)
		}
		open[0].respond("application/json", []byte(`{}`))
		if r := h.open(t).request(nil, chat("y", "s", "q"), 0); r.immediate != nil {
			t.Fatalf("after one finished: immediate %v, want a pick", r.immediate)
		}
	})
}

// TestLargeBodies: a request body over 62,000 bytes, sent in Envoy-sized
// chunks, comes back whole in chunks of at most 62,000 bytes with
// end_of_stream on the last; a large response chunk is cut the same way.
func TestLargeBodies(t *testing.T) {
	gw := newGateway(t, 2)
	h := startPicker(t, newRouter(t, gw, 0), Options{})
	for _, size := range []int{MaxChunkBytes - 1, MaxChunkBytes, MaxChunkBytes + 1, 200_000} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			pad := strings.Repeat("x", size)
			body := chat(pad, "s", "q")
			body = body[:len(body)-len(`"}]}`)]
			body = append(body, `"}]}`...)
			for _, chunk := range []int{16 << 10, 0} {
				e := h.open(t)
				r := e.request(nil, body, chunk)
				if r.immediate != nil {
					t.Fatalf("immediate %v", r.immediate)
				}
				if !bytes.Equal(r.body, body) {
					t.Fatalf("body back differs: %d bytes, want %d", len(r.body), len(body))
				}
				want := (len(body) + MaxChunkBytes - 1) / MaxChunkBytes
				if len(r.chunks) != want {
					t.Errorf("%d chunks %v, want %d", len(r.chunks), r.chunks, want)
				}
				for _, n := range r.chunks {
					if n > MaxChunkBytes {
						t.Errorf("chunk of %d bytes", n)
					}
				}
				if r.contentLength != strconv.Itoa(len(body)) {
					t.Errorf("Content-Length %q, want %d", r.contentLength, len(body))
				}
				answer := bytes.Repeat([]byte("y"), size)
				if got := e.respond("application/json", answer[:size/2], answer[size/2:]); !bytes.Equal(got, answer) {
					t.Errorf("response echoed %d bytes, want %d", len(got), len(answer))
				}
			}
		})
	}
	waitInFlight(t, gw)
}

// TestBodyTooLarge: a body over MaxBodyBytes gets 413 before the router
// sees it, whatever the chunking.
func TestBodyTooLarge(t *testing.T) {
	gw := newGateway(t, 1)
	h := startPicker(t, newRouter(t, gw, 0), Options{MaxBodyBytes: 1000})
	ok := h.open(t).request(nil, bytes.Repeat([]byte(" "), 990), 0)
	if ok.immediate != nil && ok.immediate.GetStatus().GetCode() == 413 {
		t.Fatal("990 bytes refused with 413 under a 1000-byte limit")
	}
	r := h.open(t).request(nil, bytes.Repeat([]byte("a"), 1001), 300)
	if r.immediate == nil || r.immediate.GetStatus().GetCode() != 413 {
		t.Fatalf("got %+v, want 413", r)
	}
	if gw.Stats().Routed != 0 {
		t.Errorf("the oversized request was routed")
	}
}

// TestBadInput: bodies the key function refuses get 400 or 404, naming
// the field.
func TestBadInput(t *testing.T) {
	gw := newGateway(t, 1)
	h := startPicker(t, newRouter(t, gw, 0), Options{})
	for _, tc := range []struct {
		body   string
		status int
		names  string
	}{
		{`{"model":`, 400, "JSON"},
		{`[1,2]`, 400, "JSON"},
		{`{"messages":[]}`, 400, `"model"`},
		{`{"model":""}`, 400, `"model"`},
		{`{"model":"nope","messages":[{"role":"user","content":"x"}]}`, 404, `"nope"`},
		{`{"model":"m1","prompt":"x"}`, 400, `"messages"`}, // a completions body on the chat path, as the HTTP gateway answers it
	} {
		r := h.open(t).request(nil, []byte(tc.body), 0)
		if r.immediate == nil || int(r.immediate.GetStatus().GetCode()) != tc.status {
			t.Errorf("%s: got %+v, want %d", tc.body, r, tc.status)
			continue
		}
		if !bytes.Contains(r.immediate.GetBody(), []byte(strings.ReplaceAll(tc.names, `"`, `\"`))) {
			t.Errorf("%s: body %s does not name %s", tc.body, r.immediate.GetBody(), tc.names)
		}
	}
	if st := gw.Stats(); st.Routed != 0 {
		t.Errorf("bad requests routed: %+v", st)
	}
}

// TestHeaderOnlyRequest: a request without a body (headers with
// end_of_stream) is picked at once: a headers response, no body, no
// Content-Length.
func TestHeaderOnlyRequest(t *testing.T) {
	gw := newGateway(t, 2)
	h := startPicker(t, newRouter(t, gw, 0), Options{})
	e := h.open(t)
	e.send(reqHeaders(true, nil, ":method", "GET", ":path", "/v1/models"))
	m := e.recv()
	hr := m.GetRequestHeaders()
	if hr == nil {
		t.Fatalf("answer %v, want a headers response", m)
	}
	for _, o := range hr.GetResponse().GetHeaderMutation().GetSetHeaders() {
		if strings.EqualFold(o.GetHeader().GetKey(), "content-length") {
			t.Errorf("Content-Length set on a request without a body")
		}
	}
	e.respond("application/json", []byte(`{"data":[]}`))
	waitInFlight(t, gw)
}

// TestRequestTrailers: trailers end the request body in FULL_DUPLEX_STREAMED
// mode; the body goes back without end_of_stream and the trailers are
// answered after it.
func TestRequestTrailers(t *testing.T) {
	gw := newGateway(t, 2)
	h := startPicker(t, newRouter(t, gw, 0), Options{})
	e := h.open(t)
	body := chat("s", "s", "q")
	e.send(reqHeaders(false, nil))
	e.send(reqBody(body, false))
	e.send(&extprocRequestTrailers)
	if e.recv().GetRequestHeaders() == nil {
		t.Fatal("no headers response")
	}
	sr := e.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
	if sr == nil || !bytes.Equal(sr.GetBody(), body) || sr.GetEndOfStream() {
		t.Fatalf("body answer %v, want the body without end_of_stream", sr)
	}
	if e.recv().GetRequestTrailers() == nil {
		t.Fatal("no trailers response")
	}
	e.respond("application/json", []byte(`{}`))
	waitInFlight(t, gw)
}

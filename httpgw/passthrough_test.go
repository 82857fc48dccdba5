package httpgw

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/internal/budget"
	"github.com/examlops/gateway/internal/front"
)

// /v1/embeddings, /tokenize and /detokenize reach a replica of the model
// named, the least loaded one by the engines' scraped load; the answer is
// relayed as the engine gave it, the request counted under its endpoint,
// and the routing index and decision counts left alone (the library routes
// it as a request without a prompt, gateway.Target.NoPrompt).
func TestPassThroughLoadAware(t *testing.T) {
	f := newFixture(t, 2, gateway.ModeCacheAware, enginetest.Options{})
	f.engines[0].SetLoad(9, 4, 0.8)
	f.engines[1].SetLoad(0, 0, 0.1)
	f.srv.ScrapeAll(context.Background())
	for _, tc := range []struct{ path, body, want string }{
		{"/v1/embeddings", `{"model":"m1","input":"hello world"}`, `"embedding":[0.25,-0.5]`},
		{"/tokenize", `{"model":"m1","prompt":"a b c"}`, `"tokens":[0,1,2]`},
		{"/detokenize", `{"model":"m1","tokens":[3,4]}`, `"prompt":"w3 w4"`},
	} {
		for range 2 {
			resp := f.post(tc.path, tc.body)
			b := string(readAll(t, resp))
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", tc.path, b)
			assert.Contains(t, b, tc.want)
			assert.Equal(t, "e1", resp.Header.Get(HeaderReplica), tc.path)
			assert.Equal(t, "e1", resp.Header.Get("X-Engine"), tc.path)
		}
		assert.Equal(t, int64(2), f.engines[1].PathRequests(tc.path))
		assert.Equal(t, int64(0), f.engines[0].PathRequests(tc.path))
	}
	f.settle()
	assert.Equal(t, 2.0, f.counter("exa_gateway_requests_total", map[string]string{"model": testModel, "endpoint": "embeddings", "code": "200"}))
	assert.Equal(t, 2.0, f.counter("exa_gateway_requests_total", map[string]string{"model": testModel, "endpoint": "tokenize", "code": "200"}))
	assert.Equal(t, 0.0, f.counter("exa_gateway_routed_total", nil), "pass-through requests make no routing decision")
}

// A pass-through request is routed on the same table as the model's
// prompts: the chat requests in flight count in its choice, as its own
// count in theirs (one decision path, gateway.Target.NoPrompt).
func TestPassThroughSeesPromptsInFlight(t *testing.T) {
	f := newFixture(t, 2, gateway.ModeRoundRobin, enginetest.Options{})
	rel0, rel1 := f.engines[0].Gate(), f.engines[1].Gate()
	defer rel0()
	defer rel1()
	inFlight := map[string]int{}
	for i := range 3 {
		resp := f.post("/v1/chat/completions", chatBody(testModel, true, "sys", fmt.Sprint("hi ", i)))
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		_, err := bufio.NewReader(resp.Body).ReadString('\n') // the first chunk: past the first token
		require.NoError(t, err)
		inFlight[resp.Header.Get(HeaderReplica)]++
	}
	require.Len(t, inFlight, 2, "round-robin spreads the chats: %v", inFlight)
	idle := "e0"
	if inFlight["e0"] > inFlight["e1"] {
		idle = "e1"
	}
	gw := f.srv.Snapshot().Models[testModel].Gateway
	// The client reads a chat's first chunk as the gateway relays it,
	// which may be before the gateway has marked the chat's prefill done
	// (FirstToken): wait for that, so that the chats weigh as in flight
	// past their first token, as the test means.
	require.Eventually(t, func() bool {
		for _, r := range gw.Replicas() {
			if r.PendingPrefill != 0 {
				return false
			}
		}
		return true
	}, 10*time.Second, time.Millisecond)
	for i := range 6 {
		resp := f.post("/v1/embeddings", `{"model":"m1","input":"x"}`)
		readAll(t, resp)
		require.Equal(t, idle, resp.Header.Get(HeaderReplica), "try %d: chats in flight: %v", i, inFlight)
		// The client may read the answer before the handler has released
		// its decision (Done runs as the handler returns): wait for it, or
		// the next request sees the idle replica one busier and ties.
		require.Eventually(t, func() bool {
			for _, r := range gw.Replicas() {
				if r.Name == idle && r.InFlight != inFlight[idle] {
					return false
				}
			}
			return true
		}, 10*time.Second, time.Millisecond)
	}
}

// Equally loaded replicas share the requests: ties are drawn, not given
// to the first replica listed.
func TestPassThroughSpreads(t *testing.T) {
	f := newFixture(t, 2, gateway.ModeRoundRobin, enginetest.Options{})
	for range 40 {
		readAll(t, f.post("/v1/embeddings", `{"model":"m1","input":"x"}`))
	}
	a, b := f.engines[0].PathRequests("/v1/embeddings"), f.engines[1].PathRequests("/v1/embeddings")
	assert.Equal(t, int64(40), a+b)
	assert.GreaterOrEqual(t, min(a, b), int64(12), "%d and %d of 40", a, b)
}

// Bad requests get the OpenAI error their inference counterparts get; an
// engine failing with 5xx is retried once on the other replica.
func TestPassThroughErrors(t *testing.T) {
	f := newFixture(t, 2, gateway.ModeRoundRobin, enginetest.Options{})
	for _, tc := range []struct {
		method, body string
		status       int
		code, param  string
	}{
		{http.MethodGet, "", http.StatusMethodNotAllowed, "method_not_allowed", ""},
		{http.MethodPost, `{"model":"nope","input":"x"}`, http.StatusNotFound, "model_not_found", "model"},
		{http.MethodPost, `{"model":"","input":"x"}`, http.StatusBadRequest, "invalid_request", "model"},
		{http.MethodPost, `{"model":7}`, http.StatusBadRequest, "invalid_request", "model"},
		{http.MethodPost, `[1]`, http.StatusBadRequest, "invalid_request", ""},
		{http.MethodPost, `{"model":"m1"`, http.StatusBadRequest, "invalid_request", ""},
	} {
		req, err := http.NewRequest(tc.method, f.http.URL+"/v1/embeddings", strings.NewReader(tc.body))
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		var e errorBody
		require.NoError(t, json.Unmarshal(readAll(t, resp), &e), tc.body)
		assert.Equal(t, tc.status, resp.StatusCode, tc.body)
		require.NotNil(t, e.Error.Code, tc.body)
		assert.Equal(t, tc.code, *e.Error.Code, tc.body)
		if tc.param != "" {
			require.NotNil(t, e.Error.Param, tc.body)
			assert.Equal(t, tc.param, *e.Error.Param, tc.body)
		}
	}
	f.engines[0].FailNext(1)
	f.engines[1].FailNext(1)
	resp := f.post("/v1/embeddings", `{"model":"m1","input":"x"}`)
	readAll(t, resp)
	assert.Equal(t, http.StatusInternalServerError, resp.StatusCode, "both replicas failed: the second's answer is relayed")
	resp = f.post("/v1/embeddings", `{"model":"m1","input":"x"}`)
	readAll(t, resp)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	f.engines[1].FailNext(1)
	f.engines[0].FailNext(0)
	for range 2 { // whichever replica is tried first, the request succeeds
		resp = f.post("/v1/embeddings", `{"model":"m1","input":"x"}`)
		readAll(t, resp)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
	}
}

// With one model served, "model" may be left out (or null), as vLLM
// serves its one model: the request goes to that model, and the engine
// receives the body naming it. With two models it is still required.
func TestOptionalModel(t *testing.T) {
	f := newFixture(t, 1, gateway.ModeRoundRobin, enginetest.Options{})
	for _, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/chat/completions", `{"model":null,"messages":[{"role":"user","content":"hi"}]} `},
		{"/v1/completions", `{"prompt":"once"}`},
		{"/v1/embeddings", `{"input":"x"}`},
		{"/tokenize", ` { } `},
	} {
		resp := f.post(tc.path, tc.body)
		b := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s %s: %s", tc.path, tc.body, b)
		_, sent := f.engines[0].LastRequest()
		var got struct{ Model string }
		require.NoError(t, json.Unmarshal(sent, &got), string(sent))
		assert.Equal(t, testModel, got.Model, string(sent))
	}
	f.settle()
	assert.Equal(t, 2.0, f.counter("exa_gateway_requests_total", map[string]string{"model": testModel, "endpoint": "chat", "code": "200"}))

	require.NoError(t, applyModels(t, f.srv, map[string][]config.Replica{
		"a": {{Name: "e0", Address: f.engines[0].URL()}}, "b": {{Name: "e0", Address: f.engines[0].URL()}}}))
	for _, path := range []string{"/v1/chat/completions", "/v1/embeddings"} {
		resp := f.post(path, `{"messages":[{"role":"user","content":"hi"}],"input":"x"}`)
		b := string(readAll(t, resp))
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, path)
		assert.Contains(t, b, "serves 2 models", path)
	}
}

// /health answers like vLLM's: 200 with an empty body while a replica is
// healthy, 503 when none is (or no model is configured).
func TestHealthEndpoint(t *testing.T) {
	f := newFixture(t, 1, gateway.ModeRoundRobin, enginetest.Options{})
	get := func() (int, string) {
		resp, err := http.Get(f.http.URL + "/health")
		require.NoError(t, err)
		return resp.StatusCode, string(readAll(t, resp))
	}
	code, body := get()
	assert.Equal(t, http.StatusOK, code)
	assert.Empty(t, body)
	f.engines[0].SetHealthy(false)
	for range fleet.DefaultEjectAfter {
		f.srv.ProbeAll(context.Background())
	}
	code, body = get()
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "no_healthy_replica")
	require.NoError(t, applyModels(t, f.srv, nil))
	code, body = get()
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "no_models")
}

// The client's address is appended to X-Forwarded-For on the way to the
// engine.
func TestForwardedFor(t *testing.T) {
	f := newFixture(t, 1, gateway.ModeRoundRobin, enginetest.Options{})
	readAll(t, f.post("/v1/chat/completions", chatBody(testModel, false, "s", "hi"), "X-Forwarded-For", "203.0.113.7"))
	h, _ := f.engines[0].LastRequest()
	assert.Equal(t, "203.0.113.7, 127.0.0.1", h.Get("X-Forwarded-For"))
	readAll(t, f.post("/tokenize", `{"model":"m1","prompt":"a"}`))
	h, _ = f.engines[0].LastRequest()
	assert.Equal(t, "127.0.0.1", h.Get("X-Forwarded-For"))

	// The caller's Request is left as it was.
	req := httptest.NewRequest(http.MethodPost, "/tokenize", strings.NewReader(`{"model":"m1","prompt":"a"}`))
	req.Header.Set("Content-Type", "application/json")
	f.srv.ServeHTTP(httptest.NewRecorder(), req)
	assert.Empty(t, req.Header.Values("X-Forwarded-For"))
	h, _ = f.engines[0].LastRequest()
	assert.Equal(t, "192.0.2.1", h.Get("X-Forwarded-For"), "httptest's RemoteAddr")
}

// CORS is off by default: no CORS headers, preflight gets 405. With
// origins configured, allowed origins get Access-Control-Allow-Origin and
// preflights are answered with 204; others get no grant.
func TestCORS(t *testing.T) {
	preflight := func(url, origin string) *http.Response {
		req, err := http.NewRequest(http.MethodOptions, url+"/v1/chat/completions", nil)
		require.NoError(t, err)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "POST")
		req.Header.Set("Access-Control-Request-Headers", "authorization, content-type")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		readAll(t, resp)
		return resp
	}
	f := newFixture(t, 1, gateway.ModeRoundRobin, enginetest.Options{})
	resp := preflight(f.http.URL, "https://app.example")
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	assert.Empty(t, resp.Header.Get("Access-Control-Allow-Origin"))

	f.srv.opts.CORSOrigins = []string{"https://app.example"}
	resp = preflight(f.http.URL, "https://app.example")
	assert.Equal(t, http.StatusNoContent, resp.StatusCode)
	assert.Equal(t, "https://app.example", resp.Header.Get("Access-Control-Allow-Origin"))
	assert.Contains(t, resp.Header.Get("Access-Control-Allow-Methods"), "POST")
	assert.Equal(t, "authorization, content-type", resp.Header.Get("Access-Control-Allow-Headers"))
	resp = preflight(f.http.URL, "https://evil.example")
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	assert.Empty(t, resp.Header.Get("Access-Control-Allow-Origin"))

	resp = f.post("/v1/chat/completions", chatBody(testModel, false, "s", "hi"), "Origin", "https://app.example")
	readAll(t, resp)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "https://app.example", resp.Header.Get("Access-Control-Allow-Origin"))
	assert.Contains(t, resp.Header.Get("Access-Control-Expose-Headers"), HeaderReplica)
}

func TestCORSOriginsValidated(t *testing.T) {
	for _, bad := range []string{"", "app.example", "https://app.example/", "ftp://x", "https://a b"} {
		_, err := New(Options{CORSOrigins: []string{bad}, Logger: quietLogger()})
		require.ErrorIs(t, err, ErrInvalidOptions, bad)
		assert.Contains(t, err.Error(), "CORSOrigins", bad)
	}
	for _, ok := range []string{"*", "https://app.example", "http://localhost:3000"} {
		_, err := New(Options{CORSOrigins: []string{ok}, Logger: quietLogger()})
		require.NoError(t, err, ok)
	}
}

// FuzzPassModel: for any body, passModel never panics; a body it accepts
// names the model it returns, by the gateway's own reading of it.
func FuzzPassModel(f *testing.F) {
	for _, s := range []string{`{"model":"m1","input":"x"}`, `{"input":"x"}`, `{}`, ` { } `, `{"model":null}`,
		`{"model":"a","model":null}`, `{"model":""}`, `[1]`, `{"model":"m1"`, `{"model":"m1"}x`, "{\"input\":\"\\u00e9\"}\n"} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	one := &fleet.State{Models: map[string]*fleet.Model{"m1": {Name: "m1"}}}
	two := &fleet.State{Models: map[string]*fleet.Model{"m1": {Name: "m1"}, "m2": {Name: "m2"}}}
	f.Fuzz(func(t *testing.T, body []byte, single bool) {
		st := two
		if single {
			st = one
		}
		h := budget.Hold{B: budget.New(1 << 30)}
		defer h.Release()
		name, out, err := passModel(st, body, &h)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "gateway: ") {
				t.Fatalf("error %q does not start with gateway:", err)
			}
			return
		}
		req, err := front.Decode(out)
		if err != nil || !req.HasModel || req.Model != name || name == "" {
			t.Fatalf("body %q -> %q names %+v (err %v), want %q", body, out, req, err, name)
		}
		if !bytes.Equal(out, body) && h.Held() < int64(cap(out)) {
			t.Fatalf("a body made of %d bytes, %d charged", cap(out), h.Held())
		}
	})
}

// The gateway forwards the client's Content-Type as it is: an engine that
// requires application/json (as vLLM's does) answers a request without
// it with 400 through the gateway, as directly; with it, 200. (Hence the
// README's and help's curl examples send -H 'Content-Type: application/json'.)
func TestContentTypeForwarded(t *testing.T) {
	f := newFixture(t, 1, gateway.ModeRoundRobin, enginetest.Options{RequireJSON: true})
	for _, tc := range []struct {
		ct   string
		want int
	}{{"", http.StatusBadRequest}, {"text/plain", http.StatusBadRequest}, {"application/json", http.StatusOK}, {"application/json; charset=utf-8", http.StatusOK}} {
		for _, path := range []string{"/v1/chat/completions", "/v1/embeddings"} {
			req, err := http.NewRequest(http.MethodPost, f.http.URL+path, strings.NewReader(chatBody(testModel, false, "s", "hi")))
			require.NoError(t, err)
			if tc.ct != "" {
				req.Header.Set("Content-Type", tc.ct)
			}
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			b := readAll(t, resp)
			assert.Equal(t, tc.want, resp.StatusCode, "%s %q: %s", path, tc.ct, b)
		}
	}
}

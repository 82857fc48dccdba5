package httpgw

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/front"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pdSeen is one request a pdEngine received.
type pdSeen struct {
	body map[string]any
	hdr  http.Header
}

// pdEngine is a fake engine speaking the P/D protocol as
// llm-d-inference-sim does: a request with kv_transfer_params.
// do_remote_decode is a prefill (rejected with 400 when streamed) answered
// with kv_transfer_params naming the engine; any other request is answered
// with the echo of its last message, streamed or not.
type pdEngine struct {
	name   string
	srv    *httptest.Server
	status atomic.Int32 // answer every request with this status, if set
	noKV   atomic.Bool  // prefill answers carry no kv_transfer_params
	// hold, when set, makes prefill requests wait for it (or for their
	// client to go); entered receives a value as each one starts waiting.
	hold, entered chan struct{}
	// fault, when set (shared by engines), fails the next prefill requests
	// any of them receives.
	fault *prefillFault

	mu   sync.Mutex
	seen []pdSeen
}

func newPDEngine(t *testing.T, name string) *pdEngine {
	e := &pdEngine{name: name}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *pdEngine) requests() []pdSeen {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]pdSeen(nil), e.seen...)
}

func (e *pdEngine) kvParams() map[string]any {
	return map[string]any{"do_remote_decode": false, "do_remote_prefill": true, "remote_engine_id": e.name,
		"remote_block_ids": []any{"b1"}, "remote_host": "h", "remote_port": json.Number("1")}
}

func (e *pdEngine) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/health" {
		return
	}
	d := json.NewDecoder(r.Body)
	d.UseNumber()
	var body map[string]any
	if err := d.Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	e.mu.Lock()
	e.seen = append(e.seen, pdSeen{body: body, hdr: r.Header.Clone()})
	e.mu.Unlock()
	// vLLM refuses a request whose min_tokens exceeds its max_tokens
	// (SamplingParams._verify_args), a prefill's 1 included.
	minT, _ := body["min_tokens"].(json.Number)
	maxT, _ := body["max_tokens"].(json.Number)
	if lo, err := minT.Int64(); err == nil {
		if hi, err := maxT.Int64(); err == nil && lo > hi {
			http.Error(w, fmt.Sprintf(`{"error":{"message":"min_tokens must be less than or equal to max_tokens=%d, got %d."}}`, hi, lo), http.StatusBadRequest)
			return
		}
	}
	if st := e.status.Load(); st != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(int(st))
		fmt.Fprintf(w, `{"error":{"message":"injected by %s","code":%d}}`, e.name, st)
		return
	}
	kv, _ := body[fieldKVTransferParams].(map[string]any)
	stream, _ := body["stream"].(bool)
	if kv != nil && kv["do_remote_decode"] == true {
		if e.fault != nil && e.fault.fail(w) {
			return
		}
		if e.hold != nil {
			e.entered <- struct{}{}
			select {
			case <-e.hold:
			case <-r.Context().Done():
				return
			}
		}
		if stream {
			http.Error(w, `{"error":{"message":"Prefill does not support streaming"}}`, http.StatusBadRequest)
			return
		}
		ans := map[string]any{"id": "p", "choices": []any{map[string]any{"finish_reason": "remote_decode"}}}
		if !e.noKV.Load() {
			ans[fieldKVTransferParams] = e.kvParams()
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(ans)
		return
	}
	msgs, _ := body["messages"].([]any)
	last, _ := msgs[len(msgs)-1].(map[string]any)
	text := fmt.Sprint(last["content"])
	if !stream {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"choices": []any{map[string]any{"message": map[string]any{"content": text}, "finish_reason": "stop"}}})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, word := range strings.Fields(text) {
		fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":%q}}]}\n\n", word+" ")
	}
	if so, _ := body["stream_options"].(map[string]any); so["include_usage"] == true {
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"completion_tokens\":1}}\n\n")
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// prefillFault fails the first prefill requests that the engines sharing
// it receive, whichever engine the gateway chose: the k-th by kinds[k], an
// HTTP status ("503"), "close" (the connection is closed unanswered),
// "nokv" (an answer without kv_transfer_params) or "big" (a 2 MiB answer).
type prefillFault struct {
	kinds []string
	n     atomic.Int32
}

// fail fails the request when it is one of the first len(kinds).
func (f *prefillFault) fail(w http.ResponseWriter) bool {
	k := int(f.n.Add(1)) - 1
	if k >= len(f.kinds) {
		return false
	}
	switch kind := f.kinds[k]; kind {
	case "close":
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	case "nokv":
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"p","choices":[{"finish_reason":"remote_decode"}]}`)
	case "big": // a valid answer of 2 MiB
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"p","pad":"`+strings.Repeat("x", 2<<20)+`","choices":[{"finish_reason":"remote_decode"}],`+
			`"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"big","remote_block_ids":["b1"],"remote_host":"h","remote_port":1}}`)
	default:
		st, _ := strconv.Atoi(kind)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(st)
		fmt.Fprintf(w, `{"error":{"message":"injected","code":%d}}`, st)
	}
	return true
}

// pdFixture is a gateway serving testModel disaggregated over prefill and
// decode pools of pdEngines.
type pdFixture struct {
	*fixture
	prefill, decode []*pdEngine
}

func newPDFixture(t *testing.T, nPrefill, nDecode int, edit func(*config.Model)) *pdFixture {
	t.Helper()
	// Non-streamed decode requests go to the engine as the client sent
	// them: these tests check the P/D bodies (upstream_test.go checks the
	// streamed-upstream default).
	return newPDFixtureOpts(t, nPrefill, nDecode, edit, Options{UpstreamStream: UpstreamStreamOff})
}

// newPDFixtureOpts is newPDFixture with the Server's options given (its
// registry and logger are the fixture's).
func newPDFixtureOpts(t *testing.T, nPrefill, nDecode int, edit func(*config.Model), opts Options) *pdFixture {
	t.Helper()
	f := &pdFixture{fixture: &fixture{t: t, reg: prometheus.NewRegistry()}}
	m := config.Model{Disaggregate: true, PrefillPool: "prefill", DecodePool: "decode",
		Pools: map[string][]config.Replica{"prefill": {}, "decode": {}}}
	for i := range nPrefill {
		e := newPDEngine(t, fmt.Sprintf("p%d", i))
		f.prefill = append(f.prefill, e)
		m.Pools["prefill"] = append(m.Pools["prefill"], config.Replica{Name: e.name, Address: e.srv.URL})
	}
	for i := range nDecode {
		e := newPDEngine(t, fmt.Sprintf("d%d", i))
		f.decode = append(f.decode, e)
		m.Pools["decode"] = append(m.Pools["decode"], config.Replica{Name: e.name, Address: e.srv.URL})
	}
	zero := 0
	m.PDMinUncachedTokens = &zero
	if edit != nil {
		edit(&m)
	}
	opts.Registerer, opts.Gatherer, opts.Logger = f.reg, f.reg, quietLogger()
	s, err := New(opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	var n atomic.Int64
	s.newRequestID = func() string { return fmt.Sprintf("id-%d", n.Add(1)) }
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: m}}))
	f.srv = s
	f.http = newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.handlers.Add(1)
		defer f.handlers.Done()
		s.ServeHTTP(w, r)
	}))
	return f
}

// pdBody is a chat request with a stream flag and stream options, so that
// the test can see both restored on the decode request.
func pdBody(stream bool, user string) string {
	b, _ := json.Marshal(map[string]any{
		"model": testModel, "stream": stream, "max_tokens": 50, "max_completion_tokens": 60, "seed": json.Number("18446744073709551615"),
		"stream_options": map[string]any{"include_usage": true}, "kv_transfer_params": map[string]any{"forged": true},
		"messages": []any{map[string]any{"role": "system", "content": "You are terse."}, map[string]any{"role": "user", "content": user}},
	})
	return string(b)
}

// answerText returns the generated text of a plain or streamed answer.
func answerText(t *testing.T, b []byte) string {
	t.Helper()
	if bytes.HasPrefix(b, []byte("data: ")) {
		var sb strings.Builder
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok || data == "[DONE]" {
				continue
			}
			var ev struct {
				Choices []struct {
					Delta struct{ Content string } `json:"delta"`
				} `json:"choices"`
			}
			require.NoError(t, json.Unmarshal([]byte(data), &ev))
			for _, c := range ev.Choices {
				sb.WriteString(c.Delta.Content)
			}
		}
		return strings.TrimSpace(sb.String())
	}
	var ans struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	require.NoError(t, json.Unmarshal(b, &ans), "%s", b)
	require.NotEmpty(t, ans.Choices, "%s", b)
	return ans.Choices[0].Message.Content
}

func hostPort(t *testing.T, base string) string {
	u, err := url.Parse(base)
	require.NoError(t, err)
	return u.Host
}

// The gateway runs the NIXL two-request sequence: the prefill request is
// the client's with stream false, no stream options, limits 1 and remote
// decode asked for; the decode request is the client's with the prefill's
// kv_transfer_params; both carry one x-request-id; the answer is the one
// a co-located request gets.
func TestPDGatewayModeSequence(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			f := newPDFixture(t, 1, 1, nil)
			resp := f.post("/v1/chat/completions", pdBody(stream, "tell me a long story"), headerPrefillerHostPort, "evil:1")
			b := readAll(t, resp)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
			assert.Equal(t, "tell me a long story", answerText(t, b))
			assert.Regexp(t, `^split; uncached=\d+$`, resp.Header.Get(HeaderDisagg))
			assert.Equal(t, "prefill/p0", resp.Header.Get(HeaderPrefillReplica))
			assert.Equal(t, "decode/d0", resp.Header.Get(HeaderReplica))

			pre, dec := f.prefill[0].requests(), f.decode[0].requests()
			require.Len(t, pre, 1)
			require.Len(t, dec, 1)
			p := pre[0].body
			assert.Equal(t, false, p["stream"])
			assert.NotContains(t, p, "stream_options")
			assert.Equal(t, json.Number("1"), p["max_tokens"])
			assert.Equal(t, json.Number("1"), p["max_completion_tokens"])
			assert.Equal(t, json.Number("18446744073709551615"), p["seed"], "numbers pass untouched")
			assert.Equal(t, map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
				"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}, p[fieldKVTransferParams])
			d := dec[0].body
			assert.Equal(t, stream, d["stream"])
			assert.Equal(t, map[string]any{"include_usage": true}, d["stream_options"])
			assert.Equal(t, json.Number("50"), d["max_tokens"])
			assert.Equal(t, json.Number("60"), d["max_completion_tokens"])
			assert.Equal(t, f.prefill[0].kvParams(), d[fieldKVTransferParams], "the decode request carries the prefill's params, not the client's")
			assert.Equal(t, p["messages"], d["messages"])
			assert.Equal(t, "id-1", pre[0].hdr.Get(headerRequestID))
			assert.Equal(t, "id-1", dec[0].hdr.Get(headerRequestID))
			assert.Empty(t, pre[0].hdr.Values(headerPrefillerHostPort), "a client's prefill header is dropped")
			assert.Empty(t, dec[0].hdr.Values(headerPrefillerHostPort))

			// The same request co-located (threshold above it) gets the same answer.
			c := newPDFixture(t, 1, 1, func(m *config.Model) { n := config.MaxPDMinUncachedTokens; m.PDMinUncachedTokens = &n })
			resp = c.post("/v1/chat/completions", pdBody(stream, "tell me a long story"))
			cb := readAll(t, resp)
			assert.Regexp(t, `^colocated; uncached=\d+$`, resp.Header.Get(HeaderDisagg))
			assert.Empty(t, c.prefill[0].requests())
			assert.Equal(t, answerText(t, cb), answerText(t, b))
			assert.Equal(t, stream, bytes.Contains(cb, []byte(`"usage"`)))
			assert.Equal(t, stream, bytes.Contains(b, []byte(`"usage"`)), "stream options reach the decode replica")

			assert.Equal(t, 1.0, f.counter("exa_gateway_disagg_requests_total", map[string]string{"path": "split"}))
			assert.Equal(t, uint64(1), f.histCount("exa_gateway_disagg_phase_seconds", map[string]string{"phase": "prefill"}))
			assert.Equal(t, uint64(1), f.histCount("exa_gateway_disagg_phase_seconds", map[string]string{"phase": "decode_first_byte"}))
			assert.Equal(t, uint64(1), f.histCount("exa_gateway_disagg_phase_seconds", map[string]string{"phase": "decode"}))
		})
	}
}

// A client's min_tokens does not reach the prefill request, whose
// max_tokens is 1: vLLM would refuse it with 400 (min_tokens above
// max_tokens), which the gateway relays, where the same request decoded
// co-located is answered. The decode request keeps it.
func TestPDMinTokens(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			var body map[string]any
			require.NoError(t, json.Unmarshal([]byte(pdBody(stream, "tell me a long story")), &body))
			body["min_tokens"] = 5
			b, err := json.Marshal(body)
			require.NoError(t, err)
			f := newPDFixture(t, 1, 1, nil)
			resp := f.post("/v1/chat/completions", string(b))
			ans := readAll(t, resp)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", ans)
			assert.Equal(t, "tell me a long story", answerText(t, ans))
			assert.Regexp(t, `^split; uncached=\d+$`, resp.Header.Get(HeaderDisagg))
			pre, dec := f.prefill[0].requests(), f.decode[0].requests()
			require.Len(t, pre, 1)
			require.Len(t, dec, 1)
			assert.NotContains(t, pre[0].body, "min_tokens")
			assert.Equal(t, json.Number("5"), dec[0].body["min_tokens"])
		})
	}
}

// The decider splits a request only when enough of its prompt is not
// cached on its decode replica; /stats and /metrics report the share.
func TestPDDecider(t *testing.T) {
	f := newPDFixture(t, 1, 1, func(m *config.Model) { n := 100; m.PDMinUncachedTokens = &n })
	long := strings.Repeat("a long document ", 40) // 640 bytes: 160 tokens at 4 bytes a token
	for i, tc := range []struct {
		user, want string
	}{
		{"hi", "colocated"},
		{long, "split"},
		{long, "colocated"}, // its prefix is now cached on the decode replica
		{long + "and a question?", "colocated"},
		{strings.Repeat("another document ", 40), "split"},
	} {
		resp := f.post("/v1/chat/completions", chatBody(testModel, false, "sys", tc.user))
		readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.True(t, strings.HasPrefix(resp.Header.Get(HeaderDisagg), tc.want+";"), "request %d: %s", i, resp.Header.Get(HeaderDisagg))
	}
	assert.Len(t, f.prefill[0].requests(), 2)
	st := f.stats().Models[testModel]
	require.NotNil(t, st.Disaggregation)
	pd := st.Disaggregation
	assert.Equal(t, config.PDModeGateway, pd.Mode)
	assert.Equal(t, 100, pd.MinUncachedTokens)
	assert.Equal(t, uint64(5), pd.Decided)
	assert.Equal(t, uint64(2), pd.Split)
	assert.InDelta(t, 0.4, pd.SplitShare, 1e-9)
	require.NotNil(t, pd.Prefill)
	assert.Equal(t, uint64(2), pd.Prefill.Requests)
	assert.Equal(t, "cache_aware", pd.Prefill.Mode)
	assert.Equal(t, "load_aware", st.Mode)
	assert.Equal(t, uint64(5), st.Requests)
	assert.Equal(t, 3.0, f.counter("exa_gateway_disagg_requests_total", map[string]string{"path": "colocated"}))

	rec := httptest.NewRecorder()
	f.srv.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	assert.Contains(t, rec.Body.String(), `exa_gateway_disagg_requests_total{model="m1",path="split"} 2`)
	assert.NotContains(t, rec.Body.String(), "split_share", "ratios are left to PromQL, not exported as gauges")
}

// Fallbacks: a prefill failure other than a 4xx decodes co-located on the
// decode replica; a 4xx is relayed; an answer without kv params decodes
// co-located; a decode failure before the first byte is retried once on
// another decode replica, with the same decode request.
func TestPDFallbacks(t *testing.T) {
	t.Run("prefill 5xx", func(t *testing.T) {
		f := newPDFixture(t, 1, 1, nil)
		f.prefill[0].status.Store(http.StatusServiceUnavailable)
		resp := f.post("/v1/chat/completions", pdBody(true, "hello there"))
		b := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "hello there", answerText(t, b))
		assert.Regexp(t, `^prefill_failed; `, resp.Header.Get(HeaderDisagg))
		assert.Empty(t, resp.Header.Get(HeaderPrefillReplica))
		dec := f.decode[0].requests()
		require.Len(t, dec, 1)
		assert.Equal(t, map[string]any{"forged": true}, dec[0].body[fieldKVTransferParams], "co-located: the client's body as it was")
		assert.Empty(t, dec[0].hdr.Values(headerPrefillerHostPort))
		assert.Equal(t, 1.0, f.counter("exa_gateway_disagg_fallbacks_total", map[string]string{"reason": "prefill_failed"}))
		assert.Equal(t, uint64(1), f.stats().Models[testModel].Disaggregation.Fallbacks["prefill_failed"])
	})
	t.Run("prefill 4xx", func(t *testing.T) {
		f := newPDFixture(t, 1, 1, nil)
		f.prefill[0].status.Store(http.StatusTooManyRequests)
		resp := f.post("/v1/chat/completions", pdBody(false, "hello"))
		b := readAll(t, resp)
		assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
		assert.JSONEq(t, `{"error":{"message":"injected by p0","code":429}}`, string(b))
		assert.Equal(t, "prefill/p0", resp.Header.Get(HeaderPrefillReplica))
		assert.Empty(t, f.decode[0].requests())
		assert.Equal(t, 1.0, f.counter("exa_gateway_requests_total", map[string]string{"code": "429"}))
		for _, st := range f.srv.Stats().Models[testModel].Replicas {
			assert.True(t, st.Healthy)
		}
	})
	t.Run("prefill without kv params", func(t *testing.T) {
		f := newPDFixture(t, 1, 1, nil)
		f.prefill[0].noKV.Store(true)
		resp := f.post("/v1/chat/completions", pdBody(false, "hello"))
		readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Regexp(t, `^prefill_no_kv_params; `, resp.Header.Get(HeaderDisagg))
		assert.Equal(t, 1.0, f.counter("exa_gateway_disagg_fallbacks_total", map[string]string{"reason": "prefill_no_kv_params"}))
	})
	t.Run("prefill down, then ejected", func(t *testing.T) {
		f := newPDFixture(t, 1, 1, nil)
		f.prefill[0].srv.Close()
		for _, want := range []string{"prefill_failed", "prefill_unavailable"} {
			resp := f.post("/v1/chat/completions", pdBody(false, "hello"))
			readAll(t, resp)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Regexp(t, "^"+want+"; ", resp.Header.Get(HeaderDisagg), "a refused connection ejects the prefill replica at once")
		}
	})
	t.Run("empty prefill pool", func(t *testing.T) {
		f := newPDFixture(t, 0, 1, nil)
		resp := f.post("/v1/chat/completions", pdBody(false, "hello"))
		readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Regexp(t, `^prefill_unavailable; `, resp.Header.Get(HeaderDisagg))
	})
	t.Run("prefill timeout", func(t *testing.T) {
		f := newPDFixture(t, 1, 1, nil)
		p := f.prefill[0]
		p.hold, p.entered = make(chan struct{}), make(chan struct{}, 1)
		t.Cleanup(func() { close(p.hold) })
		var calls atomic.Int32
		real := f.srv.afterFunc
		f.srv.afterFunc = func(d time.Duration, fire func()) func() bool {
			if calls.Add(1) == 1 { // the prefill's timer fires once the engine holds it
				go func() { <-p.entered; fire() }()
				return func() bool { return true }
			}
			return real(d, fire)
		}
		resp := f.post("/v1/chat/completions", pdBody(false, "hello"))
		b := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		assert.Regexp(t, `^prefill_failed; `, resp.Header.Get(HeaderDisagg))
		assert.Len(t, f.decode[0].requests(), 1)
	})
	t.Run("client gone during prefill", func(t *testing.T) {
		f := newPDFixture(t, 1, 1, nil)
		p := f.prefill[0]
		p.hold, p.entered = make(chan struct{}), make(chan struct{}, 1)
		t.Cleanup(func() { close(p.hold) })
		ctx, cancel := context.WithCancel(context.Background())
		go func() { <-p.entered; cancel() }()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.http.URL+"/v1/chat/completions", strings.NewReader(pdBody(false, "hello")))
		require.NoError(t, err)
		_, err = http.DefaultClient.Do(req)
		require.Error(t, err)
		// counter waits for the handler, which had started: the prefill entered.
		assert.Equal(t, 1.0, f.counter("exa_gateway_requests_total", map[string]string{"code": "499", "reason": front.CodeClientCanceled}))
		assert.Empty(t, f.decode[0].requests())
		ms := f.srv.Snapshot().Models[testModel]
		assert.Zero(t, ms.Gateway.Replicas()[0].InFlight, "the decode decision is released")
		assert.Zero(t, ms.PD.Plan.Prefill.Replicas()[0].InFlight, "the prefill decision is released")
	})
	t.Run("decode 5xx retried", func(t *testing.T) {
		f := newPDFixture(t, 1, 2, nil)
		f.decode[0].status.Store(http.StatusInternalServerError)
		for range 2 {
			resp := f.post("/v1/chat/completions", pdBody(true, "hello"))
			b := readAll(t, resp)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
			assert.Equal(t, "decode/d1", resp.Header.Get(HeaderReplica))
			assert.Regexp(t, `^split; `, resp.Header.Get(HeaderDisagg))
		}
		tried, served := f.decode[0].requests(), f.decode[1].requests()
		require.NotEmpty(t, tried)
		require.Len(t, served, 2)
		assert.Equal(t, tried[0].body, served[0].body, "the retry sends the same decode request")
		assert.Equal(t, f.prefill[0].kvParams(), served[0].body[fieldKVTransferParams])
		assert.Equal(t, float64(len(tried)), f.counter("exa_gateway_disagg_fallbacks_total", map[string]string{"reason": "decode_retry"}))
		assert.Len(t, f.prefill[0].requests(), 2, "the prefill is not run again")
	})
	t.Run("decode pool down", func(t *testing.T) {
		// No ejection cap: the cap keeps a decode pool's last engine in.
		f := newPDFixtureOpts(t, 1, 1, nil, Options{UpstreamStream: UpstreamStreamOff, Fleet: fleet.Options{MaxEjectionPercent: 100}})
		f.decode[0].srv.Close()
		resp := f.post("/v1/chat/completions", pdBody(false, "hello"))
		readAll(t, resp)
		assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
		resp = f.post("/v1/chat/completions", pdBody(false, "hello"))
		b := readAll(t, resp)
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		assert.Contains(t, decodeError(t, b).Message, "no healthy decode replica")
	})
}

// Sidecar mode: the gateway sends the client's request to the decode
// replica with the prefill replica's host:port in x-prefiller-host-port,
// and never forwards a client's own.
func TestPDSidecarMode(t *testing.T) {
	f := newPDFixture(t, 2, 1, func(m *config.Model) {
		m.PDMode = config.PDModeSidecar
		n := 50
		m.PDMinUncachedTokens = &n
	})
	long := strings.Repeat("lorem ipsum ", 40)
	resp := f.post("/v1/chat/completions", pdBody(true, long), headerPrefillerHostPort, "evil:1")
	readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	prefill := resp.Header.Get(HeaderPrefillReplica)
	require.Contains(t, []string{"prefill/p0", "prefill/p1"}, prefill)
	resp = f.post("/v1/chat/completions", pdBody(true, "hi"), headerPrefillerHostPort, "evil:1")
	readAll(t, resp)
	assert.Regexp(t, `^colocated; `, resp.Header.Get(HeaderDisagg))
	dec := f.decode[0].requests()
	require.Len(t, dec, 2)
	want := hostPort(t, f.prefill[0].srv.URL)
	if prefill == "prefill/p1" {
		want = hostPort(t, f.prefill[1].srv.URL)
	}
	assert.Equal(t, []string{want}, dec[0].hdr.Values(headerPrefillerHostPort))
	assert.Equal(t, map[string]any{"forged": true}, dec[0].body[fieldKVTransferParams], "the sidecar gets the client's body")
	assert.Empty(t, dec[1].hdr.Values(headerPrefillerHostPort))
	assert.Empty(t, f.prefill[0].requests())
	assert.Empty(t, f.prefill[1].requests())
	st := f.stats().Models[testModel].Disaggregation
	assert.Equal(t, config.PDModeSidecar, st.Mode)
	assert.Equal(t, uint64(1), st.Split)
}

// A Responses API request of a disaggregated model is decoded co-located,
// and a client's own x-prefiller-host-port does not reach the sidecar
// either, as the picker removes it.
func TestPDResponsesDropsPrefillHeader(t *testing.T) {
	f := newPDFixture(t, 1, 1, func(m *config.Model) { m.PDMode = config.PDModeSidecar })
	resp := f.post("/v1/responses", `{"model":"`+testModel+`","input":"hi","messages":[{"role":"user","content":"hi"}]}`,
		headerPrefillerHostPort, "evil:1")
	b := readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	dec := f.decode[0].requests()
	require.Len(t, dec, 1)
	assert.Empty(t, dec[0].hdr.Values(headerPrefillerHostPort), "a client's prefill header is dropped")
	assert.Empty(t, f.prefill[0].requests())
}

// Behind a sidecar the gateway cannot see the prefill end, but the decode
// replica's first byte comes after it: from then on the prefill replica no
// longer counts the request's blocks as pending prefill (which the plan's
// queue rule and the prefill pool's choice read), while the decode
// streams on; its decision ends with the request.
func TestPDSidecarReleasesPrefill(t *testing.T) {
	f := newPDFixture(t, 1, 1, func(m *config.Model) { m.PDMode = config.PDModeSidecar })
	release := make(chan struct{})
	f.decode[0].srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a \"}}]}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	pre := f.srv.Snapshot().Models[testModel].PD.Plan.Prefill
	resp := f.post("/v1/chat/completions", pdBody(true, "tell me a long story"))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Regexp(t, `^split; `, resp.Header.Get(HeaderDisagg))
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, line, "data: ")
	st := pre.Replicas()[0]
	assert.Zero(t, st.PendingPrefill, "the decode's first byte came: the prefill is over")
	assert.Equal(t, 1, st.InFlight, "its decision ends with the request")
	close(release)
	readAll(t, resp)
	f.settle()
	assert.Zero(t, pre.Replicas()[0].InFlight)
}

// A reload that keeps the routing options keeps both pools' gateways and
// the decider's counters; pools named but not defined answer 503.
func TestPDReload(t *testing.T) {
	f := newPDFixture(t, 1, 1, nil)
	readAll(t, f.post("/v1/chat/completions", pdBody(false, "hello")))
	cfg := f.srv.Snapshot().File.Clone()
	m := cfg.Models[testModel]
	extra := newPDEngine(t, "d1")
	m.Pools["decode"] = append(m.Pools["decode"], config.Replica{Name: "d1", Address: extra.srv.URL})
	cfg.Models[testModel] = m
	before := f.srv.Snapshot().Models[testModel]
	require.NoError(t, f.srv.Apply(cfg))
	after := f.srv.Snapshot().Models[testModel]
	assert.Same(t, before.Gateway, after.Gateway)
	assert.Same(t, before.PD.Plan.Prefill, after.PD.Plan.Prefill)
	assert.Len(t, after.Gateway.Replicas(), 2)
	assert.Equal(t, uint64(1), f.srv.Stats().Models[testModel].Disaggregation.Split)

	// Engine health reaches the pool's own gateway.
	f.srv.Observe(after.ByName["prefill/p0"], after.ByName["prefill/p0"].Health.Failure(true))
	assert.False(t, after.PD.Plan.Prefill.Replicas()[0].Healthy)
	resp := f.post("/v1/chat/completions", pdBody(false, "hello"))
	readAll(t, resp)
	assert.Regexp(t, `^prefill_unavailable; `, resp.Header.Get(HeaderDisagg))

	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {
		Disaggregate: true, PrefillPool: config.DefaultPrefillPool, DecodePool: config.DefaultDecodePool,
	}}}))
	resp = f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "hi"))
	e := decodeError(t, readAll(t, resp))
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Contains(t, e.Message, `pools ["prefill" "decode"] are not defined`)
	assert.Nil(t, f.srv.Stats().Models[testModel].Disaggregation)
}

// Concurrent split requests, some failing over, under -race.
func TestPDConcurrent(t *testing.T) {
	f := newPDFixture(t, 2, 2, nil)
	f.decode[1].status.Store(http.StatusBadGateway)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodPost, f.http.URL+"/v1/chat/completions", strings.NewReader(pdBody(i%2 == 0, fmt.Sprintf("question %d", i))))
			resp, err := http.DefaultClient.Do(req)
			if !assert.NoError(t, err) {
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
			assert.Equal(t, fmt.Sprintf("question %d", i), answerText(t, b))
		}()
	}
	wg.Wait()
	st := f.stats().Models[testModel].Disaggregation
	assert.Equal(t, uint64(16), st.Decided)
}

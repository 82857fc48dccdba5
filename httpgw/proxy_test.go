package httpgw

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/internal/front"
)

func TestBadRequests(t *testing.T) {
	f := newFixture(t, 2, gateway.ModeCacheAware, enginetest.Options{})
	f.srv.opts.MaxBodyBytes = 1024
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{
		testModel: {Mode: gateway.ModeCacheAware, Replicas: []config.Replica{{Name: "e0", Address: f.engines[0].URL()}}},
		"empty":   {},
	}}))
	tests := []struct {
		name   string
		method string
		path   string
		body   string
		status int
		code   string
		param  string
	}{
		{"malformed JSON", "POST", "/v1/chat/completions", `{"model": "m1", "messages": [`, 400, "invalid_request", ""},
		{"missing model", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request", "model"},
		{"missing messages", "POST", "/v1/chat/completions", `{"model":"m1"}`, 400, "invalid_request", "messages"},
		{"missing prompt", "POST", "/v1/completions", `{"model":"m1"}`, 400, "invalid_request", "prompt"},
		{"unknown model", "POST", "/v1/chat/completions", chatBody("nope", false, "sys", "hi"), 404, "model_not_found", "model"},
		{"oversized body", "POST", "/v1/chat/completions", chatBody("m1", false, strings.Repeat("x", 2000)), 413, "request_too_large", ""},
		{"wrong method", "GET", "/v1/chat/completions", "", 405, "method_not_allowed", ""},
		{"unknown endpoint", "POST", "/v1/audio/speech", `{"model":"m1","input":"x"}`, 404, "unknown_endpoint", ""},
		{"model without replicas", "POST", "/v1/chat/completions", chatBody("empty", false, "sys"), 503, "no_replicas", "model"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, f.http.URL+tt.path, strings.NewReader(tt.body))
			require.NoError(t, err)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			b := readAll(t, resp)
			assert.Equal(t, tt.status, resp.StatusCode, "body %s", b)
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			e := decodeError(t, b)
			require.NotNil(t, e.Code)
			assert.Equal(t, tt.code, *e.Code)
			assert.NotEmpty(t, e.Message)
			assert.NotEmpty(t, e.Type)
			if tt.param != "" {
				require.NotNil(t, e.Param)
				assert.Equal(t, tt.param, *e.Param)
			}
		})
	}
	assert.Zero(t, f.engines[0].Requests(), "no bad request reaches an engine")
	assert.Equal(t, float64(len(tests)), f.counter("exa_gateway_requests_total", nil), "every request is counted")
}

func TestProxyChatAndCompletions(t *testing.T) {
	f := newFixture(t, 2, gateway.ModeRoundRobin, enginetest.Options{})
	for i, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", chatBody(testModel, false, "system prompt", "hello")},
		{"/v1/completions", `{"model":"m1","prompt":"once upon a time"}`},
	} {
		resp := f.post(tc.path, tc.body)
		b := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", b)
		var out struct {
			Object  string `json:"object"`
			Choices []json.RawMessage
		}
		require.NoError(t, json.Unmarshal(b, &out))
		assert.Len(t, out.Choices, 1)
		assert.Equal(t, resp.Header.Get("X-Engine"), resp.Header.Get(HeaderReplica), "request %d", i)
		assert.Contains(t, resp.Header.Get(HeaderDecision), "round_robin")
	}
	assert.Equal(t, int64(1), f.engines[0].Requests())
	assert.Equal(t, int64(1), f.engines[1].Requests())
	assert.Equal(t, 2.0, f.counter("exa_gateway_requests_total", map[string]string{"model": testModel, "code": "200"}))
	assert.Equal(t, 2.0, f.counter("exa_gateway_decisions_total", map[string]string{"kind": "round_robin"}))
}

// The first SSE event reaches the client while the engine still holds the
// rest: the gateway does not buffer streams.
func TestStreamingIsUnbuffered(t *testing.T) {
	checkStreamingIsUnbuffered(t, newFixture(t, 1, gateway.ModeRoundRobin, enginetest.Options{Chunks: 3}))
}

// checkStreamingIsUnbuffered checks that the first SSE event of a stream
// reaches the client while f's one engine (built with three chunks) holds
// the rest; the lean server's tests share it.
func checkStreamingIsUnbuffered(t *testing.T, f *fixture) {
	t.Helper()
	release := f.engines[0].Gate()
	defer release()
	resp := f.post("/v1/chat/completions", chatBody(testModel, true, "sys", "hi"))
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(line, "data: "), "first line %q", line)
	assert.Contains(t, line, "tok0")
	release()
	rest, err := io.ReadAll(br)
	require.NoError(t, err)
	assert.Contains(t, string(rest), "tok2")
	assert.True(t, strings.HasSuffix(string(rest), "data: [DONE]\n\n"))
}

// A client that goes away mid-stream cancels the upstream request.
func TestClientDisconnectCancelsUpstream(t *testing.T) {
	checkClientDisconnectCancelsUpstream(t, newFixture(t, 1, gateway.ModeRoundRobin, enginetest.Options{}))
}

// checkClientDisconnectCancelsUpstream checks that a client that goes away
// mid-stream cancels the request to f's one engine; the lean server's
// tests share it.
func checkClientDisconnectCancelsUpstream(t *testing.T, f *fixture) {
	t.Helper()
	release := f.engines[0].Gate()
	defer release()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.http.URL+"/v1/chat/completions",
		strings.NewReader(chatBody(testModel, true, "sys", "hi")))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	<-f.engines[0].Gated()
	_, err = bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	cancel()
	resp.Body.Close()
	<-f.engines[0].CanceledC() // the engine saw its request canceled
	assert.Equal(t, int64(1), f.engines[0].Canceled())
}

// A dead replica costs one retry: the request succeeds on another replica,
// and the dead one is ejected at once (its connection was refused).
func TestRetryOnDeadReplica(t *testing.T) {
	f := newFixture(t, 3, gateway.ModeRoundRobin, enginetest.Options{})
	f.engines[0].Close()
	for i := range 6 {
		resp := f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "q"+string(rune('a'+i))))
		b := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, "request %d: %s", i, b)
		assert.NotEqual(t, "e0", resp.Header.Get(HeaderReplica))
	}
	assert.Equal(t, 1.0, f.counter("exa_gateway_retries_total", nil), "one retry, then the dead replica is out")
	assert.Equal(t, 1.0, f.counter("exa_gateway_ejections_total", map[string]string{"address": f.engines[0].URL()}))
	assert.Equal(t, 6.0, f.counter("exa_gateway_requests_total", map[string]string{"code": "200"}))
	st := f.stats()
	for _, e := range st.Engines {
		assert.Equal(t, e.Address != f.engines[0].URL(), e.Healthy, e.Address)
	}
}

// A 5xx before any byte is retried once on another replica; a second
// failure is passed to the client.
func TestRetryOn5xx(t *testing.T) {
	f := newFixture(t, 2, gateway.ModeCacheAware, enginetest.Options{})
	f.engines[0].FailNext(1)
	f.engines[1].FailNext(1)
	resp := f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "hello"))
	b := readAll(t, resp)
	assert.Equal(t, http.StatusInternalServerError, resp.StatusCode, "both replicas failed once: %s", b)
	assert.Equal(t, 1.0, f.counter("exa_gateway_retries_total", nil))

	f.engines[0].FailNext(1)
	f.engines[1].FailNext(0)
	for range 3 {
		resp := f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "again"))
		b := readAll(t, resp)
		assert.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	}
	assert.LessOrEqual(t, f.counter("exa_gateway_retries_total", nil), 2.0)
	assert.Equal(t, 4.0, f.counter("exa_gateway_requests_total", nil))
}

// An engine failing mid-stream ends the client's stream with an error
// event; a plain response is cut so the client sees the failure.
func TestMidStreamFailure(t *testing.T) {
	f := newFixture(t, 1, gateway.ModeRoundRobin, enginetest.Options{Chunks: 4})
	f.engines[0].BreakStreams(2)
	resp := f.post("/v1/chat/completions", chatBody(testModel, true, "sys", "hi"))
	b := readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	s := string(b)
	assert.Contains(t, s, "tok1")
	assert.NotContains(t, s, "[DONE]")
	events := strings.Split(strings.TrimSpace(s), "\n\n")
	last := strings.TrimPrefix(events[len(events)-1], "data: ")
	e := decodeError(t, []byte(last))
	assert.Contains(t, e.Message, "mid-response")
	assert.Equal(t, 1.0, f.counter("exa_gateway_requests_total", map[string]string{"code": "200", "reason": front.CodeStreamError}))

	// A non-streamed request is streamed from the engine (the default):
	// nothing was sent to the client when the stream broke, so it gets a
	// 502. TestCutPlainAnswer has a plain answer cut (upstream streaming
	// off).
	resp = f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "hi"))
	b = readAll(t, resp)
	require.Equal(t, http.StatusBadGateway, resp.StatusCode, "%s", b)
	assert.Contains(t, decodeError(t, b).Message, "reading the stream: unexpected EOF")
	assert.Equal(t, 1.0, f.counter("exa_gateway_upstream_stream_failures_total", nil))
}

func TestCutPlainAnswer(t *testing.T) {
	f := newFixtureOpts(t, 1, gateway.ModeRoundRobin, enginetest.Options{Chunks: 4}, Options{UpstreamStream: UpstreamStreamOff})
	f.engines[0].BreakStreams(2)
	req, err := http.NewRequest(http.MethodPost, f.http.URL+"/v1/chat/completions", strings.NewReader(chatBody(testModel, false, "sys", "hi")))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	assert.Error(t, err, "a cut plain response is an error for the client, not a short body")
	assert.Equal(t, 1.0, f.counter("exa_gateway_requests_total", map[string]string{"code": "200", "reason": front.CodeAborted}))
}

func TestNoHealthyReplica(t *testing.T) {
	f := newFixture(t, 2, gateway.ModeCacheAware, enginetest.Options{})
	for _, e := range f.engines {
		e.SetHealthy(false)
	}
	for range fleet.DefaultEjectAfter {
		f.srv.ProbeAll(context.Background())
	}
	resp := f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "hi"))
	b := readAll(t, resp)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	e := decodeError(t, b)
	assert.Equal(t, "no_healthy_replica", *e.Code)
	assert.Equal(t, 2.0, f.counter("exa_gateway_ejections_total", nil))

	for _, e := range f.engines {
		e.SetHealthy(true)
	}
	f.srv.ProbeAll(context.Background())
	resp = f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "hi"))
	readAll(t, resp)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "one good probe is below the readmit threshold")
	f.srv.ProbeAll(context.Background())
	resp = f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "hi"))
	readAll(t, resp)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, 2.0, f.counter("exa_gateway_readmissions_total", nil))
}

// A killed engine is ejected and, once restarted, readmitted by probes.
func TestKilledEngineReadmitted(t *testing.T) {
	f := newFixture(t, 2, gateway.ModeRoundRobin, enginetest.Options{})
	f.engines[1].Close()
	for range fleet.DefaultEjectAfter {
		f.srv.ProbeAll(context.Background())
	}
	assert.False(t, f.stats().Engines[indexOf(f, 1)].Healthy)
	f.engines[1].Restart()
	for range fleet.DefaultReadmitAfter {
		f.srv.ProbeAll(context.Background())
	}
	assert.True(t, f.stats().Engines[indexOf(f, 1)].Healthy)
	for range 4 {
		readAll(t, f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "hi")))
	}
	assert.Equal(t, int64(2), f.engines[1].Requests())
}

func indexOf(f *fixture, engine int) int {
	for i, e := range f.stats().Engines {
		if e.Address == f.engines[engine].URL() {
			return i
		}
	}
	f.t.Fatalf("engine %d not in stats", engine)
	return -1
}

func TestScrapeFeedsLoad(t *testing.T) {
	f := newFixture(t, 2, gateway.ModeLoadAware, enginetest.Options{})
	f.engines[0].SetLoad(7, 3, 0.5)
	f.engines[1].SetLoad(0, 1, 0.1)
	f.srv.ScrapeAll(context.Background())
	gw := f.srv.Snapshot().Models[testModel].Gateway
	byName := map[string]int{}
	for _, r := range gw.Replicas() {
		byName[r.Name] = r.Load.QueueDepth*100 + r.Load.Running
	}
	assert.Equal(t, map[string]int{"e0": 703, "e1": 1}, byName)
	st := f.stats()
	require.NotNil(t, st.Engines[indexOf(f, 0)].Load)
	assert.Equal(t, fleet.EngineLoad{Waiting: 7, Running: 3, KVUtilization: 0.5}, *st.Engines[indexOf(f, 0)].Load)
	resp := f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "hi"))
	readAll(t, resp)
	assert.Equal(t, "e1", resp.Header.Get(HeaderReplica), "load-aware routing avoids the loaded engine")
}

// On fake engines with prefix caches, cache-aware routing earns more
// engine-side prefix-cache hits than round-robin on a shared-prefix
// workload.
func TestCacheAwareBeatsRoundRobinOnEngines(t *testing.T) {
	hits := map[gateway.Mode]int64{}
	for _, mode := range []gateway.Mode{gateway.ModeCacheAware, gateway.ModeRoundRobin} {
		// 12 system prompts of 15 blocks each in random order: round-robin
		// has to warm every engine with every prompt, cache-aware each
		// prompt once.
		f := newFixture(t, 4, mode, enginetest.Options{BlockWords: 4})
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range 120 {
			group := rng.IntN(12)
			sys := strings.Repeat("shared system prompt for group "+string(rune('A'+group))+" ", 10)
			resp := f.post("/v1/chat/completions", chatBody(testModel, false, sys, "question number "+string(rune('a'+i%26))))
			readAll(t, resp)
			require.Equal(t, http.StatusOK, resp.StatusCode)
		}
		for _, e := range f.engines {
			hits[mode] += e.PrefixHits()
		}
	}
	t.Logf("engine prefix-cache hit tokens: %v", hits)
	assert.Greater(t, hits[gateway.ModeCacheAware], hits[gateway.ModeRoundRobin]*5/4)
}

func TestModelsAndStatsEndpoints(t *testing.T) {
	f := newFixture(t, 2, gateway.ModeCacheAware, enginetest.Options{})
	for range 3 {
		readAll(t, f.post("/v1/chat/completions", chatBody(testModel, false, "the same system prompt", "hi")))
	}
	resp, err := http.Get(f.http.URL + "/v1/models")
	require.NoError(t, err)
	var ml fleet.ModelList
	require.NoError(t, json.Unmarshal(readAll(t, resp), &ml))
	assert.Equal(t, "list", ml.Object)
	require.Len(t, ml.Data, 1)
	assert.Equal(t, testModel, ml.Data[0].ID)

	resp, err = http.Get(f.http.URL + "/stats")
	require.NoError(t, err)
	b := readAll(t, resp)
	var doc config.StatsDocument // what the CLI decodes
	require.NoError(t, json.Unmarshal(b, &doc))
	rs := doc.Models[testModel]
	assert.Equal(t, config.SourceGateway, rs.Source)
	assert.Equal(t, "cache_aware", rs.Mode)
	assert.Equal(t, uint64(3), rs.Requests)
	assert.Equal(t, uint64(2), rs.Hits, "the repeated prompt hits after the first request")
	assert.Len(t, rs.Replicas, 2)
	var full Stats
	require.NoError(t, json.Unmarshal(b, &full))
	assert.Len(t, full.Engines, 2)

	resp, err = http.Get(f.http.URL + "/stats?model=nope")
	require.NoError(t, err)
	readAll(t, resp)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)

	resp, err = http.Get(f.http.URL + "/metrics")
	require.NoError(t, err)
	text := string(readAll(t, resp))
	for _, name := range []string{"exa_gateway_requests_total", "exa_gateway_decisions_total", "exa_gateway_prefix_hits_total",
		"exa_gateway_replica_requests_total", "exa_gateway_request_duration_seconds_bucket", "exa_gateway_time_to_first_byte_seconds_bucket",
		"exa_gateway_endpoint_healthy"} {
		assert.Contains(t, text, name)
	}
	assert.Contains(t, text, `exa_gateway_prefix_hits_total{model="m1"} 2`)
	assert.Contains(t, text, `exa_gateway_routed_total{model="m1"} 3`)
	assert.NotContains(t, text, "hit_rate", "ratios are left to PromQL, not exported as gauges")
}

// A client's Expect: 100-continue is answered by the gateway, not passed
// to the engine.
func TestExpectContinueNotForwarded(t *testing.T) {
	f := newFixture(t, 1, gateway.ModeRoundRobin, enginetest.Options{})
	resp := f.post("/v1/chat/completions", chatBody(testModel, false, strings.Repeat("long system prompt ", 200), "hi"), "Expect", "100-continue")
	b := readAll(t, resp)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	assert.Contains(t, string(b), `"choices"`)
}

// An engine that accepts a request but sends nothing within the
// first-byte timeout (FirstByteTimeout for a streamed request) or the
// response timeout (ResponseTimeout, a non-streamed answer's whole time)
// counts as failed (it feeds passive health) and the request is retried on
// another replica, or answered with 502 (first byte) or 504 (response).
func TestFirstByteTimeout(t *testing.T) {
	const streamed, whole = 5 * time.Second, 7 * time.Second
	tests := []struct {
		name     string
		stream   bool
		healthy  bool // whether a healthy replica is configured besides the hung one
		wantCode int
		retries  float64
	}{
		{"retried on another replica", false, true, http.StatusOK, 1},
		{"no other replica", false, false, http.StatusGatewayTimeout, 0},
		{"streamed, retried on another replica", true, true, http.StatusOK, 1},
		{"streamed, no other replica", true, false, http.StatusBadGateway, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			arrived := make(chan struct{})
			hung := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				// Reading the whole body lets the server notice the
				// gateway closing the connection.
				_, _ = io.Copy(io.Discard, r.Body)
				select {
				case arrived <- struct{}{}:
				case <-r.Context().Done():
					return
				}
				<-r.Context().Done()
			}))
			reps := []config.Replica{{Name: "hung", Address: hung.URL}}
			if tt.healthy {
				e := enginetest.New(enginetest.Options{Name: "ok", Model: testModel})
				t.Cleanup(e.Close)
				reps = append(reps, config.Replica{Name: "ok", Address: e.URL()})
			}
			f := &fixture{t: t, reg: prometheus.NewRegistry()}
			s, err := New(Options{Registerer: f.reg, Gatherer: f.reg, Logger: quietLogger(), Fleet: fleet.Options{EjectAfter: 1, MaxEjectionPercent: 100},
				FirstByteTimeout: streamed, ResponseTimeout: whole, UpstreamStream: UpstreamStreamOff})
			require.NoError(t, err)
			want := whole
			if tt.stream {
				want = streamed
			}
			// The fake timer fires when the request reaches the hung engine.
			s.afterFunc = func(d time.Duration, fn func()) func() bool {
				assert.Equal(t, want, d, "the timeout for the request's kind")
				stopped := make(chan struct{})
				var once sync.Once
				go func() {
					select {
					case <-arrived:
						fn()
					case <-stopped:
					}
				}()
				return func() bool { once.Do(func() { close(stopped) }); return true }
			}
			require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {Replicas: reps}}}))
			f.srv, f.http = s, newHTTPTestServer(t, s)

			for i := range len(reps) {
				resp := f.post("/v1/chat/completions", chatBody(testModel, tt.stream, "sys", "q"+strconv.Itoa(i)))
				b := readAll(t, resp)
				require.Equal(t, tt.wantCode, resp.StatusCode, "request %d: %s", i, b)
				if tt.wantCode != http.StatusOK {
					msg := decodeError(t, b).Message
					if tt.stream {
						assert.Contains(t, msg, "first-byte timeout ("+want.String()+")")
					} else {
						assert.Contains(t, msg, "the answer was not complete within the response timeout ("+want.String()+")")
					}
					assert.True(t, strings.HasPrefix(msg, "gateway: upstream failure: "), msg)
					assert.Equal(t, 1, strings.Count(msg, "gateway:"), msg)
				} else {
					assert.Equal(t, "ok", resp.Header.Get(HeaderReplica))
				}
			}
			assert.Equal(t, tt.retries, f.counter("exa_gateway_retries_total", nil), "the timed-out request is retried once if it can be")
			assert.Equal(t, 1.0, f.counter("exa_gateway_ejections_total", map[string]string{"address": hung.URL}), "the timeout counts against the engine's health")
		})
	}
}

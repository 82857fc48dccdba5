package fleetpick

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/internal/fronttest"
	"github.com/examlops/gateway/picker"
	"github.com/examlops/gateway/picker/pickertest"
)

// The Picker's tests send HTTP requests to pickertest.Envoy, which plays
// Envoy's ext_proc sequence against the picker (served over gRPC in
// process) and sends each request to the engine picked, a real HTTP
// server; no Envoy binary runs.

func TestPickerRoutes(t *testing.T) {
	f := newPickFixture(t, 3, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{})
	// Until every replica has been sent work, cache-aware warms a fresh
	// one with a shared prefix (gateway.CacheAware); one request each
	// first, so that what follows is plain affinity.
	for i := range 3 {
		readAll(t, f.post("/v1/chat/completions", chatBody(testModel, false, fmt.Sprintf("warm-up %d", i), "hi")))
	}
	served := map[string]string{}
	for _, stream := range []bool{false, true} {
		for g := range 6 {
			sys := fmt.Sprintf("system prompt %d shared by a group of requests", g)
			for q := range 3 {
				resp := f.post("/v1/chat/completions", chatBody(testModel, stream, sys, fmt.Sprintf("question %d", q)))
				b := readAll(t, resp)
				require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
				ep := resp.Header.Get(pickertest.HeaderEndpoint)
				require.GreaterOrEqual(t, f.engineOf(ep), 0, "picked %q, not an engine", ep)
				require.Equal(t, resp.Header.Get("X-Engine"), f.engines[f.engineOf(ep)].Name(), "Envoy sent the request to the engine picked")
				if stream {
					require.Contains(t, string(b), "data: [DONE]", "the stream went through the picker whole")
				} else {
					require.Contains(t, string(b), `"object":"chat.completion"`)
				}
				if prev, ok := served[sys]; ok {
					require.Equal(t, prev, ep, "affinity: the same prefix goes to the same engine")
				}
				served[sys] = ep
			}
		}
	}
	f.waitIdle()
	const n = 36 + 3
	labels := map[string]string{"model": testModel, "endpoint": "chat"}
	require.Equal(t, float64(n), f.counter("exa_gateway_requests_total", map[string]string{"model": testModel, "endpoint": "chat", "code": "200"}))
	require.Equal(t, uint64(n), f.histCount("exa_gateway_request_duration_seconds", labels))
	require.Equal(t, uint64(n), f.histCount("exa_gateway_time_to_first_byte_seconds", labels), "each response's first token reached the tracker")
	require.Equal(t, float64(n), f.counter("exa_gateway_decisions_total", map[string]string{"model": testModel}))
	require.Equal(t, float64(n), f.counter("exa_gateway_replica_requests_total", map[string]string{"model": testModel}))
	require.Equal(t, float64(36/2), f.counter("exa_gateway_prefix_hits_total", map[string]string{"model": testModel}),
		"the second pass repeats the first's keys (stream is not part of the key): each hits its whole prefix")
	st := f.srv.Stats().Models[testModel]
	require.Equal(t, uint64(n), st.Requests)
	var total uint64
	for _, e := range f.engines {
		total += uint64(e.Requests())
	}
	require.Equal(t, uint64(n), total, "each request reached one engine once")
}

func TestPickerErrors(t *testing.T) {
	f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{})
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{
		testModel: {Replicas: []config.Replica{{Name: "e0", Address: f.engines[0].URL()}}},
		"empty":   {},
	}}))
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		code, param, msg         string
	}{
		{"unknown model", "POST", "/v1/chat/completions", chatBody("nope", false, "s", "u"), 404, "model_not_found", "model", `"nope" is not served`},
		{"bad JSON", "POST", "/v1/chat/completions", `{"model":`, 400, "invalid_request", "", "not a valid JSON request"},
		{"missing field", "POST", "/v1/completions", `{"model":"m1"}`, 400, "invalid_request", "prompt", `field "prompt" is required`},
		{"empty body", "POST", "/v1/chat/completions", "", 400, "invalid_request", "", "not a valid JSON request"},
		{"method", "GET", "/v1/chat/completions", "", 405, "method_not_allowed", "", "accepts POST only"},
		{"unknown path", "POST", "/v1/audio/speech", `{"model":"m1"}`, 404, "unknown_endpoint", "", "no endpoint /v1/audio/speech"},
		{"no replicas", "POST", "/v1/chat/completions", chatBody("empty", false, "s", "u"), 503, "no_replicas", "model", `model "empty" has no replicas`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, f.http.URL+tc.path, strings.NewReader(tc.body))
			require.NoError(t, err)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			b := readAll(t, resp)
			require.Equal(t, tc.status, resp.StatusCode, "%s", b)
			require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			e := decodeError(t, b)
			require.NotNil(t, e.Code)
			require.Equal(t, tc.code, *e.Code)
			if tc.param != "" {
				require.NotNil(t, e.Param)
				require.Equal(t, tc.param, *e.Param)
			}
			require.Contains(t, e.Message, tc.msg)
		})
	}
	require.Equal(t, int64(0), f.engines[0].Requests(), "no error reached an engine")
	require.Equal(t, 1.0, f.counter("exa_gateway_requests_total", map[string]string{"model": "", "endpoint": "chat", "code": "404"}))
	require.Equal(t, 1.0, f.counter("exa_gateway_requests_total", map[string]string{"model": "empty", "endpoint": "chat", "code": "503"}))
	require.Equal(t, 1.0, f.counter("exa_gateway_requests_total", map[string]string{"model": "", "endpoint": "other", "code": "404"}))

	// Every replica ejected: 503, as the HTTP gateway answers.
	f.srv.Observe(f.srv.Snapshot().Endpoints[f.engines[0].URL()], f.srv.Snapshot().Endpoints[f.engines[0].URL()].Health.Failure(true))
	resp := f.post("/v1/chat/completions", chatBody(testModel, false, "s", "u"))
	b := readAll(t, resp)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", b)
	require.Contains(t, decodeError(t, b).Message, `no healthy replica for model "m1"`)
}

func TestPickerModels(t *testing.T) {
	f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{})
	for _, method := range []string{"GET", "HEAD"} {
		req, err := http.NewRequest(method, f.http.URL+"/v1/models", nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		b := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		require.Empty(t, resp.Header.Get(pickertest.HeaderPicked), "answered by the picker, sent to no engine")
		if method == "GET" {
			var list fleet.ModelList
			require.NoError(t, json.Unmarshal(b, &list))
			require.Equal(t, "list", list.Object)
			require.Len(t, list.Data, 1)
			require.Equal(t, testModel, list.Data[0].ID)
		}
	}
	resp := f.post("/v1/models", "{}")
	readAll(t, resp)
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	require.Equal(t, int64(0), f.engines[0].Requests())
	require.Equal(t, 2.0, f.counter("exa_gateway_requests_total", map[string]string{"endpoint": "models", "code": "200"}))
}

func TestPickerSubsetHint(t *testing.T) {
	f := newPickFixture(t, 3, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{})
	f.md = func(r *http.Request) *corev3.Metadata {
		if h := r.Header.Get("X-Test-Subset"); h != "" {
			if h == "none" {
				return pickertest.SubsetMetadata()
			}
			return pickertest.SubsetMetadata(strings.Split(h, ",")...)
		}
		return nil
	}
	body := chatBody(testModel, false, "one prefix for every request of this test", "q")
	resp := f.post("/v1/chat/completions", body)
	readAll(t, resp)
	home := f.engineOf(resp.Header.Get(pickertest.HeaderEndpoint))
	require.GreaterOrEqual(t, home, 0)
	other := (home + 1) % 3
	for _, tc := range []struct {
		name, subset string
		want         int // engine; -1: 503
	}{
		{"home in subset", f.endpoint(home) + "," + f.endpoint(other), home},
		{"home outside", f.endpoint(other), other},
		{"address only", "127.0.0.1", home},
		{"empty", "none", -1},
		{"ineligible", "192.0.2.1:80", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := f.post("/v1/chat/completions", body, "X-Test-Subset", tc.subset)
			b := readAll(t, resp)
			if tc.want < 0 {
				require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", b)
				return
			}
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
			require.Equal(t, f.endpoint(tc.want), resp.Header.Get(pickertest.HeaderEndpoint))
		})
	}
	// An unhealthy engine in the subset is not picked.
	ep := f.srv.Snapshot().Endpoints[f.engines[other].URL()]
	f.srv.Observe(ep, ep.Health.Failure(true))
	resp = f.post("/v1/chat/completions", body, "X-Test-Subset", f.endpoint(other))
	b := readAll(t, resp)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Contains(t, decodeError(t, b).Message, "within the subset hint")
	f.waitIdle()
}

func TestPickerHostNames(t *testing.T) {
	f := newPickFixture(t, 1, gateway.ModeRoundRobin, enginetest.Options{}, pickSetup{})
	ip := f.engines[0].URL()
	host := strings.Replace(ip, "127.0.0.1", "localhost", 1)
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{
		testModel: {Mode: gateway.ModeRoundRobin, Replicas: []config.Replica{{Name: "named", Address: host}, {Name: "ip", Address: ip}}},
		"named":   {Replicas: []config.Replica{{Name: "named", Address: host}}},
	}}))
	for range 4 {
		resp := f.post("/v1/chat/completions", chatBody(testModel, false, "s", "u"))
		readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, f.endpoint(0), resp.Header.Get(pickertest.HeaderEndpoint), "round robin never takes the replica with a host name")
	}
	resp := f.post("/v1/chat/completions", chatBody("named", false, "s", "u"))
	b := readAll(t, resp)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	msg := decodeError(t, b).Message
	require.Contains(t, msg, "not ip:port")
	require.Contains(t, msg, "named="+host)
	require.Equal(t, 4.0, f.counter("exa_gateway_replica_requests_total", map[string]string{"model": testModel, "replica": "ip"}))
	f.waitIdle()
}

func TestPickerPassiveHealth(t *testing.T) {
	f := newPickFixture(t, 2, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{fleet: func(o *fleet.Options) { o.EjectAfter = 2 }})
	body := chatBody(testModel, false, "a prefix that stays on one engine", "q")
	resp := f.post("/v1/chat/completions", body)
	readAll(t, resp)
	home := f.engineOf(resp.Header.Get(pickertest.HeaderEndpoint))
	f.engines[home].FailNext(2)
	for range 2 {
		resp := f.post("/v1/chat/completions", body)
		readAll(t, resp)
		require.Equal(t, http.StatusInternalServerError, resp.StatusCode, "the engine's 500 reaches the client")
		require.Equal(t, f.endpoint(home), resp.Header.Get(pickertest.HeaderEndpoint))
	}
	f.settle()
	healthy, _ := engineHealth(f.srv.Stats(), f.engines[home].URL())
	require.False(t, healthy, "two 5xx answers eject the engine (EjectAfter 2)")
	require.Equal(t, 1.0, f.counter("exa_gateway_ejections_total", map[string]string{"address": f.engines[home].URL()}))
	resp = f.post("/v1/chat/completions", body)
	readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, f.endpoint(1-home), resp.Header.Get(pickertest.HeaderEndpoint), "the ejected engine is not picked")
	require.Equal(t, 2.0, f.counter("exa_gateway_requests_total", map[string]string{"model": testModel, "code": "500"}))
	f.waitIdle()
}

func engineHealth(st fleet.Stats, addr string) (healthy, found bool) {
	for _, e := range st.Engines {
		if e.Address == addr {
			return e.Healthy, true
		}
	}
	return false, false
}

// gatedStream starts a streamed request that an engine holds after its
// first chunk, and returns once the engine holds it, with a function
// that cancels the client.
func (f *pickFixture) gatedStream(engine int, body string) (cancel func(), done <-chan struct{}) {
	f.t.Helper()
	ctx, cancelCtx := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.http.URL+"/v1/chat/completions", strings.NewReader(body))
	require.NoError(f.t, err)
	fin := make(chan struct{})
	go func() {
		defer close(fin)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, bufio.NewReader(resp.Body))
			resp.Body.Close()
		}
	}()
	<-f.engines[engine].Gated()
	return cancelCtx, fin
}

func TestPickerClientCancel(t *testing.T) {
	f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{})
	release := f.engines[0].Gate()
	defer release()
	cancel, done := f.gatedStream(0, chatBody(testModel, true, "s", "u"))
	require.Equal(t, []int{1}, f.inFlight(), "the request is in flight while the engine holds it")
	cancel()
	<-done
	<-f.engines[0].CanceledC() // Envoy cancelled the upstream request
	f.waitIdle()
	require.Equal(t, 1.0, f.counter("exa_gateway_requests_total", map[string]string{"model": testModel, "code": "200", "reason": front.CodeStreamEnded}))
}

func TestPickerShed(t *testing.T) {
	f := newPickFixture(t, 2, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{popts: Options{ShedAbove: 1}})
	var releases []func()
	for i := range 2 {
		releases = append(releases, f.engines[i].Gate())
	}
	defer func() {
		for _, r := range releases {
			r()
		}
	}()
	// One request held on each engine: both at ShedAbove.
	var dones []<-chan struct{}
	for i := range 2 {
		body := chatBody(testModel, true, fmt.Sprintf("prefix %d", i), "u")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.http.URL+"/v1/chat/completions", strings.NewReader(body))
		fin := make(chan struct{})
		go func() {
			defer close(fin)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		dones = append(dones, fin)
		select {
		case <-f.engines[0].Gated():
		case <-f.engines[1].Gated():
		}
	}
	require.Equal(t, []int{1, 1}, f.inFlight(), "the second request went to the idle engine")
	resp := f.post("/v1/chat/completions", chatBody(testModel, false, "s", "u"))
	b := readAll(t, resp)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s", b)
	require.Contains(t, decodeError(t, b).Message, "outstanding >= 1")
	for _, r := range releases {
		r()
	}
	for _, d := range dones {
		<-d
	}
	resp = f.post("/v1/chat/completions", chatBody(testModel, false, "s", "u"))
	readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, "no longer shed once the engines are free")
	f.waitIdle()
	require.Equal(t, 1.0, f.counter("exa_gateway_requests_total", map[string]string{"model": testModel, "code": "429", "reason": "shed"}))
}

func TestPickerFallbacks(t *testing.T) {
	f := newPickFixture(t, 3, gateway.ModeCacheAware, enginetest.Options{},
		pickSetup{popts: Options{Fallbacks: 1}, maxFB: 1, fallbacks: true, fleet: func(o *fleet.Options) { o.EjectAfter = 5 }})
	body := chatBody(testModel, false, "a prefix whose engine is about to stop", "q")
	resp := f.post("/v1/chat/completions", body)
	readAll(t, resp)
	picked := strings.Split(resp.Header.Get(pickertest.HeaderPicked), ",")
	require.Len(t, picked, 2, "the endpoint and one fallback")
	require.NotEqual(t, picked[0], picked[1])
	// The first request's end counts a success at its engine; let it land
	// before the failure below, which it would otherwise reset.
	f.waitIdle()
	home := f.engineOf(picked[0])
	f.engines[home].Close() // refuses connections; the health checks do not run here
	resp = f.post("/v1/chat/completions", body)
	readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	picked = strings.Split(resp.Header.Get(pickertest.HeaderPicked), ",")
	require.Equal(t, f.endpoint(home), picked[0], "still picked: nothing told the picker it stopped")
	require.Equal(t, picked[1], resp.Header.Get(pickertest.HeaderEndpoint), "the fallback served")
	f.waitIdle()
	// The data plane reported the fallback as served: the endpoint picked
	// counts one failure.
	ep := f.srv.Snapshot().Endpoints[f.engines[home].URL()]
	fails := ep.Health.Failures()
	require.Equal(t, 1, fails)
}

func TestPickerLargeBody(t *testing.T) {
	f := newPickFixture(t, 2, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{})
	sys := strings.Repeat("long system prompt words ", 8000) // 200 KB
	body := chatBody(testModel, true, sys, "q")
	require.Greater(t, len(body), 3*picker.MaxChunkBytes)
	var first string
	for range 2 {
		resp := f.post("/v1/chat/completions", body)
		b := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		require.Contains(t, string(b), "[DONE]")
		if first == "" {
			first = resp.Header.Get(pickertest.HeaderEndpoint)
		}
		require.Equal(t, first, resp.Header.Get(pickertest.HeaderEndpoint))
	}
	e := f.engines[f.engineOf(first)]
	require.GreaterOrEqual(t, e.PrefixHits(), int64(8000*4), "the engine got the whole body both times and cached it the first")

	// The raw exchange: chunks of at most 62,000 bytes, the body unchanged.
	x, err := f.client.Open(t.Context())
	require.NoError(t, err)
	r, err := x.Request(pickertest.Request{Body: []byte(body), Chunk: 10_000})
	require.NoError(t, err)
	require.Nil(t, r.Immediate)
	require.Equal(t, body, string(r.Body))
	for _, c := range r.Chunks {
		require.LessOrEqual(t, c, picker.MaxChunkBytes)
	}
	cl, _ := r.Header("content-length")
	require.Equal(t, fmt.Sprint(len(body)), cl)
	_, err = x.Respond(200, "application/json", []byte(`{}`))
	require.NoError(t, err)
	require.NoError(t, x.Close())
	f.waitIdle()
}

func TestPickerExactIndex(t *testing.T) {
	tok := &fronttest.WordTokenizer{}
	f := newPickFixture(t, 2, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{
		fleet: func(o *fleet.Options) { o.Tokenizer = tok },
		model: func(m *config.Model) {
			m.Index, m.BlockSize, m.KVEventsBind = config.IndexExact, 4, fronttest.FreeTCP(t)
		},
	})
	resp := f.post("/v1/completions", `{"model":"m1","prompt":"one two three four five six seven eight nine"}`)
	readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp = f.post("/v1/completions", `{"model":"m1","prompt":"x","add_special_tokens":false}`)
	readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	f.waitIdle()
	st := f.srv.Stats().Models[testModel]
	require.NotNil(t, st.KVEvents)
	require.Equal(t, uint64(1), st.KVEvents.Tokenize.Requests, "the first request was tokenized")
	require.Equal(t, uint64(1), st.KVEvents.Fallbacks["unsupported"], "the second was keyed approximately")
}

func TestPickerDisaggregated(t *testing.T) {
	// Engines stand for the decode pool's sidecars and the prefill pool.
	f := newPickFixture(t, 2, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{})
	zero := 0
	model := config.Model{Disaggregate: true, PDMode: config.PDModeSidecar, PDMinUncachedTokens: &zero,
		PrefillPool: "prefill", DecodePool: "decode", Pools: map[string][]config.Replica{
			"prefill": {{Name: "p0", Address: "http://prefill-0.example:8000"}},
			"decode":  {{Name: "d0", Address: f.engines[0].URL()}},
		}}
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: model}}))
	x, err := f.client.Open(t.Context())
	require.NoError(t, err)
	r, err := x.Request(pickertest.Request{Body: []byte(chatBody(testModel, false, "s", "u")),
		Header: []picker.Header{{Name: "x-prefiller-host-port", Value: "10.9.9.9:1"}}})
	require.NoError(t, err)
	require.Nil(t, r.Immediate)
	require.Equal(t, f.endpoint(0), r.Endpoint, "the decode replica (its sidecar) is the endpoint")
	hp, ok := r.Header("x-prefiller-host-port")
	require.True(t, ok)
	require.Equal(t, "prefill-0.example:8000", hp, "the prefill replica goes to the sidecar, host name and all")
	_, err = x.Respond(200, "application/json", []byte(`{}`))
	require.NoError(t, err)
	require.NoError(t, x.Close())

	// Co-located: the client's header is removed.
	high := 1 << 20
	model.PDMinUncachedTokens = &high
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: model}}))
	x, err = f.client.Open(t.Context())
	require.NoError(t, err)
	r, err = x.Request(pickertest.Request{Body: []byte(chatBody(testModel, false, "s", "u"))})
	require.NoError(t, err)
	_, set := r.Header("x-prefiller-host-port")
	require.False(t, set)
	require.Equal(t, []string{"x-prefiller-host-port", "accept-encoding"}, r.Remove)
	_, err = x.Respond(200, "application/json", []byte(`{}`))
	require.NoError(t, err)
	require.NoError(t, x.Close())
	f.waitIdle()
	st := f.srv.Stats().Models[testModel].Disaggregation
	require.Equal(t, uint64(2), st.Decided)
	require.Equal(t, uint64(1), st.Split)

	// Gateway mode needs the HTTP gateway.
	model.PDMode = config.PDModeGateway
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: model}}))
	resp := f.post("/v1/chat/completions", chatBody(testModel, false, "s", "u"))
	b := readAll(t, resp)
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	require.Contains(t, decodeError(t, b).Message, "--pd-mode sidecar")
}

func TestPickerAdapters(t *testing.T) {
	f := newPickFixture(t, 2, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{
		engine: func(i int, o *enginetest.Options) { o.Adapters = [][]string{{"a", "b"}, {"a"}}[i] },
	})
	f.srv.DiscoverAll(context.Background())
	// b is served by e0 only: every request for it goes there, its model
	// unchanged.
	for i := range 6 {
		resp := f.post("/v1/chat/completions", chatBody("b", false, "sys", fmt.Sprintf("question %d", i)))
		b := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		require.Equal(t, f.endpoint(0), resp.Header.Get(pickertest.HeaderEndpoint))
	}
	require.EqualValues(t, 6, f.engines[0].ModelRequests("b"))
	// An unknown name: 404, as the HTTP gateway answers it.
	resp := f.post("/v1/chat/completions", chatBody("zz", false, "sys", "q"))
	b := readAll(t, resp)
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	e := decodeError(t, b)
	require.Equal(t, "model_not_found", *e.Code)
	require.Contains(t, e.Message, `"zz" is not served by this gateway: it is neither a configured model nor a LoRA adapter of one`)
	// No healthy engine serving b: 503 naming the adapter.
	ep := f.srv.Snapshot().Endpoints[f.engines[0].URL()]
	f.srv.Observe(ep, ep.Health.Failure(true))
	resp = f.post("/v1/chat/completions", chatBody("b", false, "sys", "q"))
	b = readAll(t, resp)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Contains(t, decodeError(t, b).Message, `no healthy replica serving LoRA adapter "b" of model "m1"`)
	// /v1/models lists the adapters, from the HTTP gateway's own handler.
	resp, err := http.Get(f.http.URL + "/v1/models")
	require.NoError(t, err)
	var list fleet.ModelList
	require.NoError(t, json.Unmarshal(readAll(t, resp), &list))
	require.Len(t, list.Data, 3)
	f.waitIdle()
}

// TestPickerAllow: every 405 the picker answers carries Allow, the
// methods the path accepts, as the HTTP gateway's do (and as RFC 9110
// requires of a 405): POST on the prompt and pass-through endpoints,
// GET, DELETE on a stored response, GET, HEAD on /v1/models.
func TestPickerAllow(t *testing.T) {
	f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{})
	for _, tc := range []struct{ method, path, body, allow string }{
		{http.MethodGet, "/v1/chat/completions", "", "POST"},
		{http.MethodPut, "/v1/completions", chatBody(testModel, false, "s", "u"), "POST"},
		{http.MethodGet, "/v1/embeddings", "", "POST"},
		{http.MethodPut, "/v1/responses/resp_x", "", "GET, DELETE"},
		{http.MethodPost, "/v1/models", "{}", "GET, HEAD"},
	} {
		resp, e, body := f.do(tc.method, tc.path, tc.body)
		require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "%s %s: %s", tc.method, tc.path, body)
		require.Equal(t, -1, e, "%s %s answered by the picker", tc.method, tc.path)
		require.Equal(t, tc.allow, resp.Header.Get("Allow"), "%s %s: Allow", tc.method, tc.path)
		eb := decodeError(t, []byte(body))
		require.NotNil(t, eb.Code, body)
		require.Equal(t, "method_not_allowed", *eb.Code, "%s %s", tc.method, tc.path)
	}
}

// A request whose stream ended before its response did (the client went
// away, or Envoy reset it: the picker cannot tell which) counts neither
// for nor against its engine's passive health, whatever status its
// response headers had: as the HTTP gateway counts nothing for a client
// gone, and a failure only for an engine it saw fail. Before, it counted
// a success, clearing the engine's consecutive failures.
func TestStreamEndedNoHealthSuccess(t *testing.T) {
	const addr = "http://10.0.0.1:8000"
	fl := pickServer(t, gateway.ModeCacheAware, addr)
	r, err := New(fl, Options{Logger: quietLogger()})
	require.NoError(t, err)
	ep := fl.Snapshot().Endpoints[addr]
	fl.Observe(ep, ep.Health.Failure(false))
	require.Equal(t, 1, ep.Health.Failures())
	for _, status := range []int{0, 200} {
		pk, err := r.Pick(context.Background(), &picker.PickRequest{Method: "POST", Path: "/v1/chat/completions",
			Body: []byte(chatBody(testModel, true, "s", "u"))})
		require.NoError(t, err)
		pk.Tracker.Done(picker.Outcome{Err: errors.New("picker: ext_proc stream ended before the response did"), Status: status})
		require.Equal(t, 1, ep.Health.Failures(), "status %d: the engine's consecutive failures", status)
	}
	pk, err := r.Pick(context.Background(), &picker.PickRequest{Method: "POST", Path: "/v1/chat/completions",
		Body: []byte(chatBody(testModel, true, "s", "u"))})
	require.NoError(t, err)
	pk.Tracker.Done(picker.Outcome{Status: 200})
	require.Zero(t, ep.Health.Failures(), "an answer that ended well is a success")
}

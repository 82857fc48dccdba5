package fleetpick

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/internal/fronttest"
)

// fakeTimer is Router.afterFunc for tests: it records each timer started,
// which the test fires itself.
type fakeTimer struct {
	started chan armed
}

type armed struct {
	d       time.Duration
	fire    func()
	stopped chan struct{}
}

func (ft *fakeTimer) afterFunc(d time.Duration, f func()) func() bool {
	a := armed{d: d, fire: f, stopped: make(chan struct{}, 1)}
	ft.started <- a
	return func() bool { a.stopped <- struct{}{}; return true }
}

// holdingEngine is a server in front of an engine that holds each
// non-streamed chat answer until released: arrived receives once per held
// request, release lets one go.
type holdingEngine struct {
	arrived, release chan struct{}
}

func (h *holdingEngine) front(t *testing.T, e *enginetest.Engine) string {
	u, err := url.Parse(e.URL())
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/chat/completions" {
			h.arrived <- struct{}{}
			select {
			case <-h.release:
			case <-r.Context().Done():
				return
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// teach gives the model's only replica a known speed, as streamed
// answers through any front would: 10ms to the first token for eight
// requests of four uncached blocks.
func teach(t testing.TB, gw *gateway.Gateway) {
	t.Helper()
	for i := range 40 { // about 30 first tokens publish the time per block
		b := uint64(i+1) << 8
		d, err := gw.RouteWith(gateway.Key{b, b + 1, b + 2, b + 3}, gateway.Target{})
		require.NoError(t, err)
		d.Done(gateway.DoneInfo{TTFT: 10 * time.Millisecond, Elapsed: 20 * time.Millisecond, OutputTokens: 3})
	}
}

// teachAll teaches every replica of gw a speed (teach), each in turn
// allowed alone.
func teachAll(t testing.TB, gw *gateway.Gateway) {
	t.Helper()
	for _, r := range gw.Replicas() {
		for i := range 40 {
			b := uint64(i+1) << 8
			d, err := gw.RouteWith(gateway.Key{b, b + 1, b + 2, b + 3}, gateway.Target{Allow: func(name string) bool { return name == r.Name }})
			if err != nil {
				continue // not healthy: not routed to
			}
			d.Done(gateway.DoneInfo{TTFT: 10 * time.Millisecond, Elapsed: 20 * time.Millisecond, OutputTokens: 3})
		}
	}
}

// TestNonStreamedPrefillReleasedAtPrediction: a client that does not
// stream gets its answer whole at the end, so the picker sees no first
// token; once the replica's speed is known, the picker starts a timer at
// the decision's PredictedTTFT that releases the replica's pending
// prefill while the engine still holds the answer, and stops it at the
// end. A streamed request starts none: its first chunk is seen; nor
// does a non-streamed one the picker streams from the engine and
// assembles (picker.Pick.Assemble, the default), whose first chunk is
// seen too: the timer is for --upstream-stream=false and the requests
// not assembled.
func TestNonStreamedPrefillReleasedAtPrediction(t *testing.T) {
	for _, tc := range []struct {
		name              string
		stream, assembled bool
	}{{"non-streamed", false, false}, {"streamed", true, false}, {"assembled", false, true}} {
		stream := tc.stream
		t.Run(tc.name, func(t *testing.T) {
			hold := &holdingEngine{arrived: make(chan struct{}, 1), release: make(chan struct{}, 1)}
			ft := &fakeTimer{started: make(chan armed, 1)}
			f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{noUpstream: !tc.assembled,
				address: func(_ int, e *enginetest.Engine) string { return hold.front(t, e) }})
			f.picker.afterFunc = ft.afterFunc
			t.Cleanup(func() { close(hold.release) }) // first: a failed test's held answer ends
			gw := f.srv.Snapshot().Models[testModel].Gateway
			teach(t, gw)
			pending := func() int { return gw.Replicas()[0].PendingPrefill }
			require.Zero(t, pending())

			done := make(chan *http.Response, 1)
			go func() {
				done <- f.post("/v1/chat/completions", chatBody(testModel, stream, "a system prompt long enough for blocks",
					"and a question of several words, all of them uncached"))
			}()
			select {
			case <-hold.arrived:
			case <-time.After(20 * time.Second):
				t.Fatal("the request did not reach the engine")
			}
			require.Positive(t, pending(), "pending prefill while the engine holds the answer")
			if stream || tc.assembled {
				require.Empty(t, ft.started, "timer started for a request whose first chunk is seen")
			} else {
				var a armed
				select {
				case a = <-ft.started:
				default:
					t.Fatal("no timer started for a non-streamed request")
				}
				require.Positive(t, a.d)
				a.fire()
				require.Zero(t, pending(), "pending prefill after the predicted first token, the answer still held")
				defer func() {
					select {
					case <-a.stopped:
					default:
						t.Error("the timer was not stopped at the answer's end")
					}
				}()
			}
			hold.release <- struct{}{}
			resp := <-done
			require.Equal(t, http.StatusOK, resp.StatusCode)
			readAll(t, resp)
			f.waitIdle()
			require.Zero(t, pending())
		})
	}
}

// TestPickerObjectives: the picker applies the HTTP gateway's objective
// rule (front.Objectives): a bad header is a 400 naming it; an objective
// no replica is predicted to meet is routed best effort, or with Reject
// answered 429 slo_unattainable without reaching an engine, its decision
// released; one that is met, or a model's default replaced by a header of
// 0, is routed.
func TestPickerObjectives(t *testing.T) {
	for _, tc := range []struct {
		name     string
		obj      front.Objectives
		hdr      []string
		status   int
		code     string
		action   string // exa_gateway_slo_unattainable_total's action counted once, "" none
		toEngine bool
		objReqs  uint64 // the library's Stats.ObjectiveRequests (/stats objectives.requests)
	}{
		{name: "bad header", hdr: []string{"X-Slo-Ttft-Ms", "1.5"}, status: 400, code: "invalid_header"},
		{name: "met", obj: front.Objectives{Unattainable: front.Reject}, hdr: []string{"X-Slo-Ttft-Ms", "60000"}, status: 200, toEngine: true, objReqs: 1},
		{name: "best effort", hdr: []string{"X-Slo-Ttft-Ms", "1"}, status: 200, action: "best_effort", toEngine: true, objReqs: 1},
		{name: "reject", obj: front.Objectives{Unattainable: front.Reject}, hdr: []string{"X-Slo-Ttft-Ms", "1"}, status: 429, code: front.CodeSLOUnattainable, action: "rejected", objReqs: 1},
		{name: "model default, rejected", obj: front.Objectives{Unattainable: front.Reject, Defaults: map[string]front.SLO{testModel: {TTFT: time.Millisecond}}},
			status: 429, code: front.CodeSLOUnattainable, action: "rejected", objReqs: 1},
		{name: "model default, header 0", obj: front.Objectives{Unattainable: front.Reject, Defaults: map[string]front.SLO{"*": {TTFT: time.Millisecond}}},
			hdr: []string{"X-Slo-Ttft-Ms", "0"}, status: 200, toEngine: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{popts: Options{Objectives: tc.obj}})
			gw := f.srv.Snapshot().Models[testModel].Gateway
			teach(t, gw) // 2 ms per block: a request of several blocks is predicted past 1 ms
			resp := f.post("/v1/chat/completions", chatBody(testModel, false, "a system prompt long enough for blocks",
				"and a question of several words, all of them uncached"), tc.hdr...)
			b := readAll(t, resp)
			require.Equal(t, tc.status, resp.StatusCode, "%s", b)
			if tc.status == http.StatusTooManyRequests {
				require.Equal(t, "1", resp.Header.Get("Retry-After"), "one scrape interval, as a shed request's")
			}
			if tc.code != "" {
				e := decodeError(t, b)
				require.NotNil(t, e.Code, "%s", b)
				require.Equal(t, tc.code, *e.Code, "%s", b)
				if tc.status == 400 {
					require.Contains(t, e.Message, "X-Slo-Ttft-Ms")
				}
			}
			f.waitIdle()
			require.Equal(t, tc.toEngine, f.engines[0].Requests() == 1, "engine requests %d", f.engines[0].Requests())
			for _, action := range []string{"best_effort", "rejected"} {
				want := 0.0
				if action == tc.action {
					want = 1
				}
				require.Equal(t, want, f.counter("exa_gateway_slo_unattainable_total", map[string]string{"model": testModel, "action": action}), action)
			}
			st := gw.Stats()
			require.Equal(t, tc.objReqs, st.ObjectiveRequests, "objective requests in the library's Stats")
			require.Equal(t, uint64(map[bool]int{true: 1}[tc.action != ""]), st.ObjectiveBestEffort, "best-effort decisions in the library's Stats")
		})
	}
}

// A request with an objective is counted in exa_gateway_slo_requests_total
// as its client saw it, as in the HTTP gateway (front.Metrics.CountSeen):
// a first token within a minute meets a TTFT objective of a minute. The
// picker's clock steps a millisecond a reading, so that its first token
// is seen after a positive time (Outcome.TTFT).
func TestPickerObjectiveCounted(t *testing.T) {
	var ms atomic.Int64
	clock := func() time.Time { return time.Unix(1e9, 0).Add(time.Duration(ms.Add(1)) * time.Millisecond) }
	f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{clock: clock})
	resp := f.post("/v1/chat/completions", chatBody(testModel, true, "sys", "counted"), "X-Slo-Ttft-Ms", "60000")
	b := readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	f.waitIdle()
	require.Equal(t, 1.0, f.counter("exa_gateway_slo_requests_total", map[string]string{"model": testModel, "objective": "ttft", "outcome": "met"}))
	require.Zero(t, f.counter("exa_gateway_slo_requests_total", map[string]string{"outcome": "missed"}))
}

// A Responses API stream opens with events sent before its first token
// (response.created), so its first chunk is not its first token: as the
// HTTP gateway does, the picker teaches the library no TTFT from it (its
// Elapsed and output tokens, yes), and counts no TTFT objective for it.
// A chat stream's first chunk is its first token.
func TestPickerResponsesStreamTTFTUnseen(t *testing.T) {
	var ms atomic.Int64
	clock := func() time.Time { return time.Unix(1e9, 0).Add(time.Duration(ms.Add(1)) * time.Millisecond) }
	rec := &fronttest.DoneRecorder{}
	f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{clock: clock,
		fleet: func(o *fleet.Options) { o.GatewayOptions = []gateway.Option{gateway.WithPolicy(rec)} }})

	resp := f.post("/v1/chat/completions", chatBody(testModel, true, "sys", "hi"))
	b := readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	f.waitIdle()
	require.Positive(t, rec.Last(t).TTFT, "a chat stream's first chunk is its first token")

	resp = f.post("/v1/responses", `{"model":"`+testModel+`","input":"hi","stream":true}`, "X-Slo-Ttft-Ms", "60000")
	b = readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	require.Contains(t, string(b), "response.created")
	f.waitIdle()
	info := rec.Last(t)
	require.NoError(t, info.Err)
	require.Zero(t, info.TTFT, "a Responses API stream's first chunk (response.created) is not its first token")
	require.Positive(t, info.Elapsed)
	require.Positive(t, info.OutputTokens)
	require.Zero(t, f.counter("exa_gateway_slo_requests_total", map[string]string{"objective": "ttft"}), "no first token seen, no TTFT objective counted")
}

package fleetpick

import (
	"encoding/json"
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
	"github.com/examlops/gateway/picker"
	"github.com/examlops/gateway/picker/pickertest"
)

// respond posts a Responses API request through the picker and returns
// its status, the engine that answered, the response id and the body.
func (f *pickFixture) respond(input, prev string, stream bool, hdr ...string) (int, int, string, []byte) {
	f.t.Helper()
	body := map[string]any{"model": testModel, "input": input, "stream": stream}
	if prev != "" {
		body["previous_response_id"] = prev
	}
	b, _ := json.Marshal(body)
	resp := f.post("/v1/responses", string(b), hdr...)
	out := readAll(f.t, resp)
	f.waitIdle()
	return resp.StatusCode, f.engineOf(resp.Header.Get(pickertest.HeaderEndpoint)), front.ResponseID(out), out
}

// TestPickerResponsesConversation: a Responses API conversation, streamed
// or not, continues on the replica that stored its previous response
// although round-robin would send each turn to the next replica; the
// picker learns each id from the head of the answer passing through it.
func TestPickerResponsesConversation(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			f := newPickFixture(t, 4, gateway.ModeRoundRobin, enginetest.Options{}, pickSetup{})
			status, home, prev, out := f.respond("the first turn", "", stream)
			require.Equal(t, http.StatusOK, status, "%s", out)
			require.GreaterOrEqual(t, home, 0)
			require.True(t, strings.HasPrefix(prev, "resp_e"), "id %q", prev)
			for turn := 1; turn < 6; turn++ {
				status, got, id, out := f.respond(fmt.Sprintf("turn %d", turn), prev, stream)
				require.Equal(t, http.StatusOK, status, "turn %d: %s", turn, out)
				require.Equal(t, home, got, "turn %d continues on the replica holding its conversation", turn)
				prev = id
			}
			require.Equal(t, 6.0, f.counter("exa_gateway_requests_total", map[string]string{"endpoint": "responses", "code": "200"}))
			// Requests without a previous id still go round the replicas.
			_, a, _, _ := f.respond("fresh", "", stream)
			_, b, _, _ := f.respond("fresh again", "", stream)
			require.NotEqual(t, a, b, "round-robin is not pinned")
		})
	}
}

// TestPickerResponsesUnknownID: a previous_response_id the picker never
// saw is routed as any request (round-robin here: successive ones go to
// different replicas), and the engine's 404 is relayed.
func TestPickerResponsesUnknownID(t *testing.T) {
	f := newPickFixture(t, 3, gateway.ModeRoundRobin, enginetest.Options{}, pickSetup{})
	seen := map[int]bool{}
	for range 3 {
		status, e, _, out := f.respond("hi", "resp_unknown_1", false)
		require.Equal(t, http.StatusNotFound, status, "%s", out)
		require.Contains(t, string(out), "not found", "the engine's answer")
		seen[e] = true
	}
	require.Len(t, seen, 3, "routed round-robin, not pinned")
}

// TestPickerResponsesPinIneligible: when the replica that stored the
// response is unhealthy, or outside the subset hint, the continuation gets
// 503, as from the HTTP gateway (no other engine holds the response);
// once healthy again, the pin holds.
func TestPickerResponsesPinIneligible(t *testing.T) {
	f := newPickFixture(t, 3, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{})
	f.md = func(r *http.Request) *corev3.Metadata {
		if h := r.Header.Get("X-Test-Subset"); h != "" {
			return pickertest.SubsetMetadata(strings.Split(h, ",")...)
		}
		return nil
	}
	status, home, id, out := f.respond("remember this", "", true)
	require.Equal(t, http.StatusOK, status, "%s", out)
	other := (home + 1) % 3
	status, _, _, out = f.respond("outside the hint", id, false, "X-Test-Subset", f.endpoint(other))
	require.Equal(t, http.StatusServiceUnavailable, status, "%s", out)
	require.Contains(t, string(out), id)

	ep := f.srv.Snapshot().Endpoints[f.engines[home].URL()]
	f.srv.Observe(ep, ep.Health.Failure(true))
	status, _, _, out = f.respond("while it is down", id, false)
	require.Equal(t, http.StatusServiceUnavailable, status, "%s", out)
	for i, e := range f.engines {
		require.Zero(t, e.PathRequests("/v1/responses")-map[bool]int64{true: 1}[i == home], "engine %d got the continuation", i)
	}

	for range 5 { // probes readmit it
		f.srv.Observe(ep, ep.Health.Success(true))
	}
	status, got, _, out := f.respond("back", id, false)
	require.Equal(t, http.StatusOK, status, "%s", out)
	require.Equal(t, home, got)
}

// TestPickerResponsesReplicaRemoved: the replica that stored a response
// removed from the configuration, a continuation is routed as any other
// request (to a configured replica, which answers for the id it does not
// hold, vLLM's 404) and GET answers 404, as from the HTTP
// gateway; before, both got 503 until the id aged out.
func TestPickerResponsesReplicaRemoved(t *testing.T) {
	f := newPickFixture(t, 3, gateway.ModeRoundRobin, enginetest.Options{}, pickSetup{})
	status, home, id, out := f.respond("remember this", "", false)
	require.Equal(t, http.StatusOK, status, "%s", out)
	var reps []config.Replica
	for i, e := range f.engines {
		if i != home {
			reps = append(reps, config.Replica{Name: e.Name(), Address: e.URL()})
		}
	}
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {Mode: gateway.ModeRoundRobin, Replicas: reps}}}))
	status, got, _, out := f.respond("more", id, false)
	// Another engine answers, for an id it does not hold: vLLM's 404.
	require.Equal(t, http.StatusNotFound, status, "%s", out)
	require.Contains(t, string(out), "not found")
	require.GreaterOrEqual(t, got, 0, "answered by an engine")
	require.NotEqual(t, home, got)
	status, home, id, out = f.respond("and this", "", false)
	require.Equal(t, http.StatusOK, status, "%s", out)
	reps = reps[:0]
	for i, e := range f.engines {
		if i != home {
			reps = append(reps, config.Replica{Name: e.Name(), Address: e.URL()})
		}
	}
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {Mode: gateway.ModeRoundRobin, Replicas: reps}}}))
	resp, _, body := f.do(http.MethodGet, "/v1/responses/"+id, "")
	require.Equal(t, http.StatusNotFound, resp.StatusCode, "%s", body)
	require.Contains(t, body, "no longer configured")
}

// TestPickerResponsesBadInput: a malformed Responses API body gets the
// HTTP gateway's answer: status, code and param alike (400 naming the
// field), the gateway's message within the picker's, and reaches no
// engine.
func TestPickerResponsesBadInput(t *testing.T) {
	gw := newGatewayFixture(t, 1)
	f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{})
	for _, tc := range []struct{ body, param string }{
		{`{"model":"m1","input":"hi","previous_response_id":3}`, "previous_response_id"},
		{`{"model":"m1","input":3}`, "input"},
		{`{"model":"m1","instructions":["x"],"input":"hi"}`, "instructions"},
		{`{"model":"m1"}`, "input"},
		{`{"model":"m1","input":"hi"`, ""},
	} {
		rg := gw.post("/v1/responses", tc.body)
		bg := readAll(t, rg)
		rp := f.post("/v1/responses", tc.body)
		bp := readAll(t, rp)
		require.Equal(t, http.StatusBadRequest, rp.StatusCode, "%s: %s", tc.body, bp)
		require.Equal(t, rg.StatusCode, rp.StatusCode, tc.body)
		eg, ep := decodeError(t, bg), decodeError(t, bp)
		require.Equal(t, eg.Param, ep.Param, tc.body)
		require.Equal(t, eg.Code, ep.Code, tc.body)
		require.Contains(t, ep.Message, eg.Message, tc.body)
		if tc.param != "" {
			require.NotNil(t, ep.Param, tc.body)
			require.Equal(t, tc.param, *ep.Param, tc.body)
		}
	}
	require.Equal(t, int64(0), f.engines[0].Requests(), "no bad request reached an engine")
}

// TestPickerResponsesDisaggregated: a disaggregated model decodes a
// Responses API request co-located on a decode replica, as the HTTP
// gateway does: in sidecar mode without a prefill (a client's
// x-prefiller-host-port removed, the P/D plan not asked), and in gateway
// mode too (the decode engine answers it itself).
func TestPickerResponsesDisaggregated(t *testing.T) {
	f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{})
	zero := 0
	model := config.Model{Disaggregate: true, PDMode: config.PDModeSidecar, PDMinUncachedTokens: &zero,
		PrefillPool: "prefill", DecodePool: "decode", Pools: map[string][]config.Replica{
			"prefill": {{Name: "p0", Address: "http://prefill-0.example:8000"}},
			"decode":  {{Name: "d0", Address: f.engines[0].URL()}},
		}}
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: model}}))
	x, err := f.client.Open(t.Context())
	require.NoError(t, err)
	r, err := x.Request(pickertest.Request{Path: "/v1/responses", Body: []byte(`{"model":"m1","input":"a long enough question to split"}`),
		Header: []picker.Header{{Name: "x-prefiller-host-port", Value: "10.9.9.9:1"}}})
	require.NoError(t, err)
	require.Nil(t, r.Immediate)
	require.Equal(t, f.endpoint(0), r.Endpoint, "the decode replica")
	_, set := r.Header("x-prefiller-host-port")
	require.False(t, set)
	require.Equal(t, []string{"x-prefiller-host-port", "accept-encoding"}, r.Remove)
	_, err = x.Respond(200, "application/json", []byte(`{"id":"resp_d0_1"}`))
	require.NoError(t, err)
	require.NoError(t, x.Close())
	f.waitIdle()
	require.Equal(t, uint64(0), f.srv.Stats().Models[testModel].Disaggregation.Decided, "no P/D plan")

	model.PDMode = config.PDModeGateway
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: model}}))
	status, got, _, out := f.respond("in gateway mode", "", false)
	require.Equal(t, http.StatusOK, status, "%s", out)
	require.Equal(t, 0, got)
}

// TestPickerResponsesConcurrent: conversations held at once, each
// continued from its own last response, all stay on their replicas; the
// Router's one id table is shared by every request (go test -race).
func TestPickerResponsesConcurrent(t *testing.T) {
	f := newPickFixture(t, 3, gateway.ModeRoundRobin, enginetest.Options{}, pickSetup{})
	const convs, turns = 6, 4
	errs := make(chan error, convs)
	for c := range convs {
		go func() {
			errs <- func() error {
				prev, home := "", ""
				for turn := range turns {
					body := fmt.Sprintf(`{"model":"m1","input":"conversation %d turn %d","stream":%v`, c, turn, turn%2 == 1)
					if prev != "" {
						body += `,"previous_response_id":"` + prev + `"`
					}
					resp, err := http.Post(f.http.URL+"/v1/responses", "application/json", strings.NewReader(body+"}"))
					if err != nil {
						return err
					}
					var sb strings.Builder
					_, err = io.Copy(&sb, resp.Body)
					resp.Body.Close()
					if err != nil || resp.StatusCode != http.StatusOK {
						return fmt.Errorf("conversation %d turn %d: %d %v %s", c, turn, resp.StatusCode, err, sb.String())
					}
					ep := resp.Header.Get(pickertest.HeaderEndpoint)
					if turn == 0 {
						home = ep
					} else if ep != home {
						return fmt.Errorf("conversation %d turn %d on %s, not %s", c, turn, ep, home)
					}
					prev = front.ResponseID([]byte(sb.String()))
				}
				return nil
			}()
		}()
	}
	for range convs {
		require.NoError(t, <-errs)
	}
	f.waitIdle()
	require.Equal(t, float64(convs*turns), f.counter("exa_gateway_requests_total", map[string]string{"endpoint": "responses", "code": "200"}))
}

// TestPickerResponsesFallbackServed: when a fallback served the first
// response (the endpoint picked refused), the id is learned for the
// fallback's replica, which the data plane reported, and the continuation
// goes there; a continuation gets no fallbacks.
func TestPickerResponsesFallbackServed(t *testing.T) {
	f := newPickFixture(t, 3, gateway.ModeCacheAware, enginetest.Options{},
		pickSetup{popts: Options{Fallbacks: 1}, maxFB: 1, fallbacks: true, fleet: func(o *fleet.Options) { o.EjectAfter = 5 }})
	body := `{"model":"m1","input":"a prefix whose engine is about to stop"}`
	resp := f.post("/v1/responses", body)
	readAll(t, resp)
	home := f.engineOf(strings.Split(resp.Header.Get(pickertest.HeaderPicked), ",")[0])
	f.engines[home].Close()
	resp = f.post("/v1/responses", body)
	out := readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", out)
	picked := strings.Split(resp.Header.Get(pickertest.HeaderPicked), ",")
	require.Len(t, picked, 2)
	require.Equal(t, f.endpoint(home), picked[0])
	served := f.engineOf(resp.Header.Get(pickertest.HeaderEndpoint))
	require.Equal(t, picked[1], f.endpoint(served), "the fallback served")
	id := front.ResponseID(out)
	f.waitIdle()

	resp = f.post("/v1/responses", `{"model":"m1","input":"and then?","previous_response_id":"`+id+`"}`)
	out = readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", out)
	require.Equal(t, f.endpoint(served), resp.Header.Get(pickertest.HeaderPicked), "pinned there, with no fallback")
	require.Equal(t, f.endpoint(served), resp.Header.Get(pickertest.HeaderEndpoint))
	f.waitIdle()
}

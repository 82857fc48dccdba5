package fleetpick

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/picker"
	"github.com/examlops/gateway/picker/pickertest"
)

// TestPickerSidecarReleasesPrefill: behind a sidecar the picker cannot see
// the prefill end, but the decode replica's first token comes after it:
// from then on the prefill replica no longer counts the request's blocks
// as pending prefill, which the P/D plan's queue rule and the prefill
// pool's choice read, while the decode streams on.
func TestPickerSidecarReleasesPrefill(t *testing.T) {
	f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{})
	zero := 0
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {
		Disaggregate: true, PDMode: config.PDModeSidecar, PDMinUncachedTokens: &zero, PrefillPool: "prefill", DecodePool: "decode",
		Pools: map[string][]config.Replica{
			"prefill": {{Name: "p0", Address: "http://prefill-0.example:8000"}},
			"decode":  {{Name: "d0", Address: f.engines[0].URL()}},
		}}}}))
	pending := func() int {
		return f.srv.Snapshot().Models[testModel].PD.Plan.Prefill.Replicas()[0].PendingPrefill
	}
	x, err := f.client.Open(t.Context())
	require.NoError(t, err)
	r, err := x.Request(pickertest.Request{Body: []byte(chatBody(testModel, true, "a system prompt", "a question"))})
	require.NoError(t, err)
	_, split := r.Header("x-prefiller-host-port")
	require.True(t, split)
	require.Positive(t, pending(), "the prefill is pending until the decode's first token")
	require.NoError(t, x.ResponseHeaders(200, []picker.Header{{Name: "content-type", Value: "text/event-stream"}}, nil, false))
	_, err = x.ResponseBody([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"), false)
	require.NoError(t, err)
	require.Zero(t, pending(), "the first token came: the prefill is over")
	_, err = x.ResponseBody([]byte("data: [DONE]\n\n"), true)
	require.NoError(t, err)
	require.NoError(t, x.Close())
	f.waitIdle()
	require.Zero(t, f.srv.Snapshot().Models[testModel].PD.Plan.Prefill.Replicas()[0].InFlight)
}

// TestPickerAnswerNotCompressed: the picker reads every prompt answer
// (first token, usage, assembly), so the client's Accept-Encoding is
// removed from the request sent to the engine, for a plain model and a
// disaggregated one alike. Before, Envoy forwarded it, and an engine or
// proxy that compresses would have hidden the answer from the picker.
func TestPickerAnswerNotCompressed(t *testing.T) {
	f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{})
	route := func() pickertest.Routed {
		x, err := f.client.Open(t.Context())
		require.NoError(t, err)
		r, err := x.Request(pickertest.Request{Header: []picker.Header{{Name: "accept-encoding", Value: "gzip"}},
			Body: []byte(chatBody(testModel, true, "a system prompt", "a question"))})
		require.NoError(t, err)
		require.NoError(t, x.Close())
		f.waitIdle()
		return r
	}
	require.Contains(t, route().Remove, "accept-encoding")
	zero := 0
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {
		Disaggregate: true, PDMode: config.PDModeSidecar, PDMinUncachedTokens: &zero, PrefillPool: "prefill", DecodePool: "decode",
		Pools: map[string][]config.Replica{
			"prefill": {{Name: "p0", Address: "http://prefill-0.example:8000"}},
			"decode":  {{Name: "d0", Address: f.engines[0].URL()}},
		}}}}))
	require.Contains(t, route().Remove, "accept-encoding")
}

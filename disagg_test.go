package gateway

import (
	"testing"

	"github.com/examlops/gateway/internal/refengine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

var (
	prefillPool = []Replica{{Name: "p0"}, {Name: "p1"}}
	decodePool  = []Replica{{Name: "d0"}, {Name: "d1"}}
)

// TestPropDisaggregatedOutputIdentical: for random prompts, the
// reference engine's output with prefill and decode split (KV cache
// serialised and handed over) equals its co-located output, and
// DisaggregatedRoute reports it.
func TestPropDisaggregatedOutputIdentical(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		key := PrefixKey(
			rapid.StringN(1, 200, -1).Draw(t, "system"),
			rapid.StringN(0, 20, -1).Draw(t, "session"),
			rapid.StringN(0, 300, -1).Draw(t, "rag"))
		res, err := DisaggregatedRoute(key, prefillPool, decodePool)
		require.NoError(t, err)
		require.True(t, res.IdenticalOutput)
		require.Len(t, res.Output, disaggOutputTokens)
		m := refengine.Default
		prompt := refengine.PromptOf(key, m.Vocab)
		require.Equal(t, 8+2*4*m.Dim*len(prompt), res.KVBytes, "KV bytes for %d positions", len(prompt))
		require.Equal(t, m.Colocated(prompt, disaggOutputTokens), res.Output)
		require.Contains(t, []string{"p0", "p1"}, res.PrefillReplica)
		require.Contains(t, []string{"d0", "d1"}, res.DecodeReplica)
	})
}

// TestDisaggregatedRouteExample is the README's example: the first request
// goes to p0 and d0 with identical output.
func TestDisaggregatedRouteExample(t *testing.T) {
	key := PrefixKey("You are…", "sess-42", "doc-hash")
	res, err := DisaggregatedRoute(key, []Replica{{Name: "p0"}, {Name: "p1"}}, []Replica{{Name: "d0"}, {Name: "d1"}})
	require.NoError(t, err)
	assert.Equal(t, "p0", res.PrefillReplica)
	assert.Equal(t, "d0", res.DecodeReplica)
	assert.True(t, res.IdenticalOutput)
}

// TestDisaggregatedPools: prefill is cache-aware over its pool, decode
// load-aware over its own; each side's Done frees its own load; a decode
// failure releases the prefill decision.
func TestDisaggregatedPools(t *testing.T) {
	r, err := NewDisaggregated(prefillPool, decodePool)
	require.NoError(t, err)
	require.NoError(t, r.Decode.UpdateLoad("d0", Load{QueueDepth: 9}))
	k := AppendHashes(nil, []uint64{1, 2, 3})
	first, err := r.Route(k)
	require.NoError(t, err)
	assert.Equal(t, KindLoadAware, first.Prefill.Kind)
	assert.Equal(t, FallbackNoMatch, first.Prefill.Fallback)
	assert.Equal(t, KindLoadAware, first.Decode.Kind)
	assert.Equal(t, "d1", first.Decode.Replica, "decode goes to the less loaded replica")
	first.Prefill.Done(DoneInfo{})
	first.Decode.Done(DoneInfo{})

	again, err := r.Route(k)
	require.NoError(t, err)
	assert.Equal(t, first.Prefill.Replica, again.Prefill.Replica)
	assert.Equal(t, KindAffinity, again.Prefill.Kind)
	assert.True(t, again.Prefill.Hit)
	assert.Equal(t, 1, status(t, r.Prefill, again.Prefill.Replica).InFlight)
	assert.Equal(t, 1, status(t, r.Decode, again.Decode.Replica).InFlight)
	again.Prefill.Done(DoneInfo{})
	again.Decode.Done(DoneInfo{})

	require.NoError(t, r.Decode.SetHealthy("d0", false))
	require.NoError(t, r.Decode.SetHealthy("d1", false))
	_, err = r.Route(k)
	require.ErrorIs(t, err, ErrNoHealthyReplica)
	for _, st := range r.Prefill.Replicas() {
		assert.Zero(t, st.InFlight, "prefill decision of a failed route must be released")
	}

	rr, err := NewDisaggregated(prefillPool, decodePool, WithMode(ModeRoundRobin))
	require.NoError(t, err)
	d, err := rr.Route(k)
	require.NoError(t, err)
	assert.Equal(t, KindRoundRobin, d.Prefill.Kind)
	assert.Equal(t, KindRoundRobin, d.Decode.Kind)
}

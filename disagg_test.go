package gateway

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

var (
	prefillPool = []Replica{{Name: "p0"}, {Name: "p1"}}
	decodePool  = []Replica{{Name: "d0"}, {Name: "d1"}}
)

// TestPropDisaggregatedOutputIdentical (R4): for random prompts, the
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
		require.Len(t, res.Output, DisaggOutputTokens)
		prompt := promptOf(key, refModel.vocab)
		require.Equal(t, 8+2*4*refModel.dim*len(prompt), res.KVBytes, "KV bytes for %d positions", len(prompt))
		require.Equal(t, refModel.colocated(prompt, DisaggOutputTokens), res.Output)
		require.Contains(t, []string{"p0", "p1"}, res.PrefillReplica)
		require.Contains(t, []string{"d0", "d1"}, res.DecodeReplica)
	})
}

// TestPropRefEngineSplitEqualsColocated checks the engine itself on random
// token prompts of any length.
func TestPropRefEngineSplitEqualsColocated(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		prompt := rapid.SliceOfN(rapid.Uint32Range(0, uint32(refModel.vocab-1)), 1, 64).Draw(t, "prompt")
		n := rapid.IntRange(1, 24).Draw(t, "tokens")
		co := refModel.colocated(prompt, n)
		sp, kvBytes, err := refModel.split(prompt, n)
		require.NoError(t, err)
		require.Equal(t, co, sp)
		require.Len(t, co, n)
		require.Equal(t, 8+8*refModel.dim*len(prompt), kvBytes)
	})
}

// TestDisaggComparisonIsSensitive: the identical-output check can fail. A
// lossy KV transfer (float32 truncated to bfloat16) changes the output of
// some prompts, so the comparison is not vacuous.
func TestDisaggComparisonIsSensitive(t *testing.T) {
	differ := 0
	for i := range 64 {
		prompt := promptOf(AppendHashes(nil, []uint64{uint64(i), uint64(i * i), 7, uint64(i + 3)}), refModel.vocab)
		co := refModel.colocated(prompt, DisaggOutputTokens)
		wire := refModel.prefill(prompt).marshal()
		for off := 8; off < len(wire); off += 4 {
			binary.LittleEndian.PutUint16(wire[off:], 0) // drop the low mantissa bits
		}
		c, err := unmarshalKV(wire)
		require.NoError(t, err)
		if !slices.Equal(co, refModel.decode(c, prompt[len(prompt)-1], DisaggOutputTokens)) {
			differ++
		}
	}
	assert.Positive(t, differ, "a lossy transfer must change some outputs")
}

func TestUnmarshalKVRejectsMalformed(t *testing.T) {
	good := refModel.prefill([]uint32{1, 2, 3}).marshal()
	zeroDim := slices.Clone(good)
	binary.LittleEndian.PutUint32(zeroDim, 0)
	tests := map[string][]byte{
		"empty":       nil,
		"short":       good[:5],
		"truncated":   good[:len(good)-1],
		"extra byte":  append(slices.Clone(good), 0),
		"zero dim":    zeroDim,
		"header only": good[:8],
	}
	for name, b := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := unmarshalKV(b)
			require.ErrorIs(t, err, errKVFormat)
			assert.Regexp(t, `^gateway: `, err.Error())
		})
	}
	c, err := unmarshalKV(good)
	require.NoError(t, err)
	assert.Equal(t, refModel.prefill([]uint32{1, 2, 3}), c)
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

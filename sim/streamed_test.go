package sim

import (
	"math"

	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNonStreamed: clients that do not stream change only what the
// gateway's own Decision hears: round_robin and the peers (which keep
// their own signals) route exactly as when every client streams, while
// cache_aware, whose pending prefill is now freed at completion, routes
// differently; the draw is the seed's, so runs repeat.
func TestNonStreamed(t *testing.T) {
	w, err := Chat(ChatConfig{Requests: 1500, Rate: 30, Sessions: 60})
	require.NoError(t, err)
	var pols []Policy
	for _, n := range []string{"round_robin", "cache_aware", "dynamo", "sglang"} {
		p, err := PolicyByName(n)
		require.NoError(t, err)
		pols = append(pols, p)
	}
	run := func(f float64) *Report {
		rep, err := Run(Config{Workload: w, Replicas: 4, Seed: 3, Policies: pols, NonStreamed: f, Parallel: 1})
		require.NoError(t, err)
		return rep
	}
	all, none, half := run(0), run(1), run(0.5)
	for _, i := range []int{0, 2, 3} {
		assert.Equal(t, all.Results[i].RequestsPerReplica, none.Results[i].RequestsPerReplica, all.Results[i].Policy)
		assert.Equal(t, all.Results[i].TTFT, none.Results[i].TTFT, all.Results[i].Policy)
	}
	assert.NotEqual(t, all.Results[1].RequestsPerReplica, none.Results[1].RequestsPerReplica)
	assert.NotEqual(t, half.Results[1].RequestsPerReplica, none.Results[1].RequestsPerReplica)
	assert.Equal(t, half.Results, run(0.5).Results)
	assert.Equal(t, 0.5, half.NonStreamed)

	for _, bad := range []float64{-0.1, 1.5, math.NaN()} {
		_, err := Run(Config{Workload: w, NonStreamed: bad, Policies: pols[:1]})
		assert.ErrorIs(t, err, ErrInvalidConfig)
		assert.ErrorContains(t, err, "NonStreamed")
	}
}

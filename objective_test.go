package gateway

import (
	"math"
	"testing"
	"time"

	"github.com/examlops/gateway/keys"
	"github.com/stretchr/testify/require"
)

// teach feeds rs's learner, through learn, 60 streamed answers of a
// replica taking a per block and b per token, so that both are published.
func teach(rs *replicaState, a, b time.Duration) {
	for range 60 {
		ttft := 10 * a
		rs.learn(10, 1, &DoneInfo{TTFT: ttft, Elapsed: ttft + 10*b, OutputTokens: 11})
	}
}

// TestObjectiveBestEffortOnlyWhenNoneMeets: a request goes best effort
// (FallbackSLO) only when no candidate is predicted to meet its TTFT
// objective, whichever replicas are out of rotation. With a known slow
// replica unhealthy, Pick judged the unknown candidate at the healthy
// candidates' mean and RouteWith at the gateway's: the unknown one, met
// by one and missed by the other, was chosen and flagged FallbackSLO
// while the fast replica met the objective.
func TestObjectiveBestEffortOnlyWhenNoneMeets(t *testing.T) {
	g := mustNew(t, replicaNames(4), WithMode(ModeCacheAware))
	list := g.snap.Load().list
	teach(list[0], 100*time.Millisecond, time.Millisecond) // slow, about to leave rotation
	teach(list[1], 10*time.Millisecond, time.Millisecond)
	teach(list[2], 40*time.Millisecond, time.Millisecond)
	// list[3] ("r3") stays unknown.
	checkPoolSpeeds(t, g)
	require.NoError(t, g.SetHealthy("r0", false))
	// 3 blocks, none cached: 4 blocks of work on an idle replica. r1
	// predicts 40 ms, r2 160 ms; r3 100 ms at the healthy candidates'
	// mean, 200 ms at the gateway's.
	for i := range 8 {
		d, err := g.RouteWith(keys.AppendHashes(nil, []uint64{uint64(1000 + i), 1, 2}), Target{TTFT: 120 * time.Millisecond})
		require.NoError(t, err)
		require.Zero(t, d.Fallback&FallbackSLO, "request %d went best effort to %s (predicted %v) while r1 was predicted to meet 120ms", i, d.Replica, d.PredictedTTFT)
		d.Done(DoneInfo{})
	}
}

// TestPredictedTTFTSaturates: the predicted TTFT of a replica at the
// slowest publishable time per block (2³²−1 ns) under the most peer
// prefill UpdateLoad accepts is the longest Duration, not a negative one.
// It was a*work converted to a Duration unchecked: past 2⁶³ ns it came out
// as −2⁶³ on amd64, a prediction already over at routing.
func TestPredictedTTFTSaturates(t *testing.T) {
	g := mustNew(t, replicaNames(1), WithMode(ModeCacheAware))
	rs := g.snap.Load().list[0]
	sp := uint64(math.MaxUint32)<<32 | 1
	shiftSum(&g.speeds, 0, sp>>32)
	rs.speed.Store(sp)
	require.NoError(t, g.UpdateLoad("r0", Load{PeerPrefill: maxRequestCount}))
	d, err := g.RouteWith(keys.AppendHashes(nil, []uint64{1, 2, 3}), Target{TTFT: time.Second})
	require.NoError(t, err)
	require.Equal(t, time.Duration(math.MaxInt64), d.PredictedTTFT)
	require.NotZero(t, d.Fallback&FallbackSLO)
	d.Done(DoneInfo{})
}

// TestObjectiveBestEffortStats: a request routed best effort for its own
// objective is counted in ObjectiveBestEffort, not in SLOFallbacks (the
// gateway-wide latency SLO's fallback), and the replicas that SLO left
// out of its decision are still counted in SLOExcluded. Both counted from
// the decision's FallbackSLO, which the two reasons share: an unmet
// objective was counted as an SLO fallback, and its excluded replicas
// went uncounted.
func TestObjectiveBestEffortStats(t *testing.T) {
	g := mustNew(t, replicaNames(3), WithMode(ModeCacheAware), WithSLOLatency(time.Second))
	list := g.snap.Load().list
	for _, rs := range list {
		teach(rs, 10*time.Millisecond, time.Millisecond)
	}
	require.NoError(t, g.UpdateLoad("r2", Load{Latency: 2 * time.Second})) // over the SLO
	d, err := g.RouteWith(keys.AppendHashes(nil, []uint64{1, 2, 3}), Target{TTFT: time.Millisecond})
	require.NoError(t, err)
	require.NotEqual(t, "r2", d.Replica)
	require.Equal(t, FallbackSLO, d.Fallback&FallbackSLO, "no replica meets 1 ms")
	d.Done(DoneInfo{})
	st := g.Stats()
	require.Equal(t, uint64(1), st.ObjectiveBestEffort)
	require.Zero(t, st.SLOFallbacks, "no fallback for the latency SLO: r0 and r1 are within it")
	require.Equal(t, uint64(1), st.SLOExcluded, "r2 was left out for the latency SLO")
}

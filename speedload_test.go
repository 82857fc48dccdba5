package gateway

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/examlops/gateway/keys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLoadFitGrowth: a replica whose time per token is t0 + s·x at load x
// grows by s·x̄/(t0 + s·x̄); one whose time does not change with load
// grows by 0; the growth is unknown before loadMinSamples samples or
// while the load hardly varied, and samples that cannot be one change
// nothing.
func TestLoadFitGrowth(t *testing.T) {
	for _, tt := range []struct {
		name    string
		n       int
		t0, s   float64 // seconds per token, and per token per request of load
		spread  int     // loads 1..spread, in turn
		known   bool
		want    float64
		epsilon float64
	}{
		{name: "flat", n: 400, t0: 0.006, spread: 16, known: true, want: 0},
		{name: "grows", n: 400, t0: 0.006, s: 0.0003, spread: 16, known: true, want: 0.0003 * 8.5 / (0.006 + 0.0003*8.5), epsilon: 0.01},
		{name: "shrinks: 0", n: 400, t0: 0.01, s: -0.0003, spread: 16, known: true, want: 0},
		{name: "few samples", n: 100, t0: 0.006, spread: 16},
		{name: "one load", n: 400, t0: 0.006, s: 0.001, spread: 1},
	} {
		var f loadFit
		for i := range tt.n {
			x := float64(1 + i%tt.spread)
			f = f.add(x, tt.t0+tt.s*x)
		}
		g, ok := f.growth()
		require.Equal(t, tt.known, ok, tt.name)
		assert.InDelta(t, tt.want, g, tt.epsilon+1e-9, tt.name)
		assert.Equal(t, tt.known, f.packed() > 0, tt.name)
		for _, bad := range [][2]float64{{-1, 0.01}, {1, 0}, {1, -1}} {
			assert.Equal(t, f, f.add(bad[0], bad[1]), "%s: sample %v", tt.name, bad)
		}
	}
}

// TestHorizonFor: no growth known is speedHorizon, as before growths were
// learned; a pool whose steps hardly grow with load gets horizonMax, one
// whose steps grow by growthHigh or more speedHorizon, linear between.
func TestHorizonFor(t *testing.T) {
	sum := func(gs ...float64) uint64 {
		var v atomic.Uint64
		for _, g := range gs {
			shiftSum(&v, 0, packGrowth(g))
		}
		return v.Load()
	}
	assert.Equal(t, float64(speedHorizon), horizonFor(0))
	assert.Equal(t, float64(horizonMax), horizonFor(sum(0.01, 0.05)))
	assert.Equal(t, float64(speedHorizon), horizonFor(sum(0.5, 0.6)))
	mid := (growthLow + growthHigh) / 2
	assert.InDelta(t, (speedHorizon+horizonMax)/2.0, horizonFor(sum(mid)), 1)
}

// TestCacheAwareLongerHorizon: a hot prefix on a slow replica that the
// placement horizon of 2,500 requests leaves there moves to the fast
// replica over the longer horizon a pool gets whose steps do not grow
// with load (Request.growths, horizonFor).
func TestCacheAwareLongerHorizon(t *testing.T) {
	var p CacheAware
	growths := func(g float64) uint64 { // a one-replica pool sum (shiftSum)
		return packGrowth(g)<<16 | 1
	}
	for _, tt := range []struct {
		growths uint64 // horizon 0: speedHorizon, 0.5: speedHorizon, 0.01: horizonMax
		want    string
	}{{0, "slow"}, {growths(0.5), "slow"}, {growths(0.01), "fast"}} {
		cands := []Candidate{
			{Name: "slow", Matched: 6, BlockTime: 20 * time.Millisecond, TokenTime: 40 * time.Millisecond, CacheBlocks: 64, AssignedPrefill: 6},
			{Name: "fast", BlockTime: 10 * time.Millisecond, TokenTime: 20 * time.Millisecond, CacheBlocks: 64, AssignedPrefill: 6},
		}
		req := caReq(8, cands)
		req.Demand, req.growths = 0.0003, tt.growths
		assert.Equal(t, tt.want, cands[p.Pick(req, cands)].Name, "horizon %v", horizonFor(tt.growths))
	}
}

// TestGatewayLearnsGrowth: through Route and Done alone, a gateway whose
// replica's time per token does not change with its load sets
// CacheAware's horizon to horizonMax, and one whose time per token grows
// with load keeps speedHorizon; before enough answers it is speedHorizon.
func TestGatewayLearnsGrowth(t *testing.T) {
	for _, tt := range []struct {
		name  string
		perRq time.Duration // time per token added per request outstanding at routing
		want  float64
	}{{"flat", 0, horizonMax}, {"grows", time.Millisecond, speedHorizon}} {
		g := mustNew(t, replicaNames(1), WithMode(ModeCacheAware))
		var flight []Decision
		for i := range 400 {
			if i == 100 {
				assert.Equal(t, float64(speedHorizon), horizonFor(g.req.growths), "%s: after %d requests", tt.name, i)
			}
			d, err := g.Route(keys.AppendHashes(nil, []uint64{uint64(i % 16), 1}))
			require.NoError(t, err)
			flight = append(flight, d)
			if len(flight) < 8 {
				continue
			}
			// Eight routed at loads 1..8, then done, the last first (so
			// that each finishes at the load it was routed at).
			for j := len(flight) - 1; j >= 0; j-- {
				d := flight[j]
				tpot := 5*time.Millisecond + tt.perRq*time.Duration(j+1)
				d.Done(DoneInfo{TTFT: 10 * time.Millisecond, Elapsed: 10*time.Millisecond + 10*tpot, OutputTokens: 11})
			}
			flight = flight[:0]
		}
		_, err := g.Route(keys.AppendHashes(nil, []uint64{1, 1}))
		require.NoError(t, err)
		assert.Equal(t, tt.want, horizonFor(g.req.growths), tt.name)
		checkPoolSpeeds(t, g)
	}
}

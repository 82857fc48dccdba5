package gateway

import (
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/examlops/gateway/keys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// sample is one observation of a replica: w blocks of prefill work, o
// tokens decoded after the first; streamed says the front saw the first
// token.
type sample struct {
	w, o     float64
	streamed bool
}

// feed adds an observation of a replica whose true speed is a seconds per
// block and b per token, each time scaled by noise, as learn would.
func feed(f speedFit, s sample, a, b, noise1, noise2 float64) speedFit {
	if s.streamed {
		f = f.add(s.w, 0, a*s.w*noise1)
		if s.o > 0 {
			f = f.add(0, s.o, b*s.o*noise2)
		}
		return f
	}
	return f.add(s.w, s.o, (a*s.w+b*s.o)*noise1)
}

// drawSample draws a request's shape from rng: requests vary in both
// prompt and answer length, as real ones do (a fit of requests all of one
// shape cannot tell prefill from decode).
func drawSample(rng *rand.Rand, streamShare float64) sample {
	return sample{
		w:        float64(1 + rng.IntN(2000)),
		o:        float64(1 + rng.IntN(1000)),
		streamed: rng.Float64() < streamShare,
	}
}

// TestSpeedFitConverges: fed a stationary replica's observations with up
// to ±20% noise, streamed or not in any mix, the fit comes within 15% of
// its true time per block and per token.
func TestSpeedFitConverges(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := rapid.Float64Range(1e-5, 1e-1).Draw(t, "a")
		b := rapid.Float64Range(1e-3, 1e-1).Draw(t, "b")
		share := rapid.SampledFrom([]float64{0, 0.5, 1}).Draw(t, "streamShare")
		rng := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "seed"), 1))
		var f speedFit
		for range 300 {
			f = feed(f, drawSample(rng, share), a, b, 0.8+0.4*rng.Float64(), 0.8+0.4*rng.Float64())
		}
		if share > 0 && (math.Abs(f.a/a-1) > 0.15 || math.Abs(f.b/b-1) > 0.15) {
			t.Fatalf("fit a=%g b=%g, true a=%g b=%g", f.a, f.b, a, b)
		}
		// Seen only at their ends, requests tell a from b only as far as
		// their shapes and the noise allow: the fit predicts them.
		if e := predictionError(f, rng, a, b); e > 0.15 {
			t.Fatalf("fit a=%g b=%g, true a=%g b=%g: mean prediction error %.3g", f.a, f.b, a, b, e)
		}
		p := f.packed()
		if share == 1 && (p>>32 == 0 || uint32(p) == 0) {
			t.Fatalf("packed %x: a known speed published as unknown", p)
		}
	})
}

// TestSpeedFitFollowsStep: after a replica slows 2× the fit follows it
// within a bounded number of samples (speedAdaptSamples), and a stalled
// request (a sample 1,000× the fit) moves its predictions by at most 15%
// on average.
func TestSpeedFitFollowsStep(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := rapid.Float64Range(1e-5, 1e-1).Draw(t, "a")
		b := rapid.Float64Range(1e-3, 1e-1).Draw(t, "b")
		share := rapid.SampledFrom([]float64{0, 1}).Draw(t, "streamShare")
		rng := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "seed"), 2))
		var f speedFit
		for range 200 {
			f = feed(f, drawSample(rng, share), a, b, 1, 1)
		}
		st := drawSample(rng, share)
		g := feed(f, st, 1000*a, 1000*b, 1, 1)
		if e := predictionError(g, rand.New(rand.NewPCG(7, 7)), f.a, f.b); e > 0.15 {
			t.Fatalf("one stalled request %+v moved the predictions by %.3g on average (a %g→%g, b %g→%g)", st, e, f.a, g.a, f.b, g.b)
		}
		n := 0
		for ; n < 200 && predictionError(f, rand.New(rand.NewPCG(9, 9)), 2*a, 2*b) > 0.2; n++ {
			f = feed(f, drawSample(rng, share), 2*a, 2*b, 1, 1)
		}
		if n > speedAdaptSamples {
			t.Fatalf("took %d samples to predict within 20%% after a 2× step (a %g→%g, fit %g; b fit %g of %g)", n, a, 2*a, f.a, f.b, 2*b)
		}
	})
}

// predictionError is the fit's mean relative error in predicting the end
// of 100 requests of shapes drawn from rng on a replica of speeds a, b.
func predictionError(f speedFit, rng *rand.Rand, a, b float64) float64 {
	e := 0.0
	for range 100 {
		s := drawSample(rng, 0)
		want := a*s.w + b*s.o
		e += math.Abs(f.a*s.w+f.b*s.o-want) / want
	}
	return e / 100
}

// speedAdaptSamples bounds the samples the fit takes to come within 20%
// of a replica that slowed 2× (TestSpeedFitFollowsStep): measured over
// 200 seeds with ±10% noise, 69–72 samples (35 requests) when every first
// token is seen, 137–143 when none is; docs/results.md.
const speedAdaptSamples = 150

// TestSpeedFitIgnoresBadSamples: samples that cannot be observations
// leave the fit as it was, and an unknown fit publishes 0.
func TestSpeedFitIgnoresBadSamples(t *testing.T) {
	var f speedFit
	assert.Zero(t, f.packed())
	f = f.add(10, 0, 0.1)
	for _, s := range [][3]float64{{-1, 0, 1}, {1, -1, 1}, {0, 0, 1}, {1, 1, 0}, {1, 1, -1}, {math.NaN(), 1, 1}, {1, math.NaN(), 1}, {1, 1, math.NaN()}, {math.Inf(1), 1, 1}, {1, 1, math.Inf(1)}} {
		assert.Equal(t, f, f.add(s[0], s[1], s[2]), "sample %v", s)
	}
	for range 50 {
		f = f.add(10, 0, 0.1)
	}
	assert.Equal(t, uint64(10_000_000)<<32, f.packed(), "10 ms per block, per token unknown")
}

// TestSlownessDeadband: equal replicas, and replicas within the deadband,
// are priced alike; beyond it at their ratio.
func TestSlownessDeadband(t *testing.T) {
	for _, tt := range []struct {
		a, ref, want float64
	}{
		{0, 100, 1}, {100, 0, 1}, {100, 100, 1}, {125, 100, 1}, {78, 100, 1},
		{200, 100, 2}, {50, 100, 0.5}, {135, 100, 1.35}, {70, 100, 0.7},
	} {
		c := Candidate{BlockTime: time.Duration(tt.a)}
		assert.InDelta(t, tt.want, slowness(&c, tt.ref), 1e-9, "a %v ref %v", tt.a, tt.ref)
	}
}

// TestCacheAwareEqualSpeedsAsToday: candidates whose speeds are all
// unknown, or all within the deadband of their mean, get the decision
// they got before speeds were learned (all unknown).
func TestCacheAwareEqualSpeedsAsToday(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 8).Draw(t, "replicas")
		blocks := rapid.IntRange(1, 16).Draw(t, "blocks")
		cands := drawCands(t, n, blocks)
		var p CacheAware
		want := p.Pick(caReq(blocks, cands), cands)
		base := rapid.Float64Range(1e3, 1e8).Draw(t, "base")
		for i := range cands {
			cands[i].BlockTime = time.Duration(base * rapid.Float64Range(0.92, 1.08).Draw(t, "jitter"))
		}
		if got := p.Pick(caReq(blocks, cands), cands); got != want {
			t.Fatalf("with speeds within the deadband picked %d, without %d", got, want)
		}
	})
}

// TestCacheAwareExploresUnknown: a replica whose speed is unknown while
// others' are known (added, or back in rotation) is priced as the fastest
// known: it gets traffic to learn from, where at the pool's mean it got
// none.
func TestCacheAwareExploresUnknown(t *testing.T) {
	var p CacheAware
	cands := []Candidate{
		{Name: "fast", BlockTime: 5 * time.Millisecond, CacheBlocks: 64, AssignedPrefill: 1, PendingPrefill: 2},
		{Name: "slow", BlockTime: 15 * time.Millisecond, CacheBlocks: 64, AssignedPrefill: 1},
		{Name: "new", CacheBlocks: 64, AssignedPrefill: 1, PendingPrefill: 1},
	}
	assert.Equal(t, "new", cands[p.Pick(caReq(8, cands), cands)].Name)
	cands[2].PendingPrefill = 3 // more queued than the fastest: it waits
	assert.Equal(t, "fast", cands[p.Pick(caReq(8, cands), cands)].Name)
}

// TestCacheAwareExploresOnlyAFasterClass: one known replica priced faster
// than the deadband among many near the mean is one fit's noise, not a
// faster class: an unknown replica is then priced at the mean, as the
// others, and loses to an idle one; with a quarter of the known replicas
// that fast it is priced as the fastest and wins.
func TestCacheAwareExploresOnlyAFasterClass(t *testing.T) {
	var p CacheAware
	for _, tt := range []struct {
		fast int
		want bool // the unknown replica wins
	}{{1, false}, {2, true}, {4, true}} {
		cands := []Candidate{{Name: "new", CacheBlocks: 64, AssignedPrefill: 1, PendingPrefill: 1}}
		for i := range 8 {
			c := Candidate{Name: "mean", BlockTime: 10 * time.Millisecond, CacheBlocks: 64, AssignedPrefill: 1}
			if i < tt.fast {
				c.Name, c.BlockTime, c.PendingPrefill = "fast", 6*time.Millisecond, 8 // fast but busy
			}
			cands = append(cands, c)
		}
		got := cands[p.Pick(caReq(8, cands), cands)].Name
		assert.Equal(t, tt.want, got == "new", "%d fast of 8: picked %s", tt.fast, got)
	}
}

// TestCacheAwarePricesSpeed: a replica twice as slow costs twice the
// prefill: a miss goes to the fast one, until the prefill queued there
// outweighs the slow one's time.
func TestCacheAwarePricesSpeed(t *testing.T) {
	var p CacheAware
	fast, slow := 10*time.Millisecond, 20*time.Millisecond
	for _, tt := range []struct {
		name        string
		fastPending int
		want        string
	}{
		{"idle", 0, "fast"},
		{"fast a little busier", 4, "fast"},
		{"fast far busier", 40, "slow"},
	} {
		cands := []Candidate{
			{Name: "slow", BlockTime: slow, CacheBlocks: 64, AssignedPrefill: 1},
			{Name: "fast", BlockTime: fast, CacheBlocks: 64, AssignedPrefill: 1, PendingPrefill: tt.fastPending},
		}
		assert.Equal(t, tt.want, cands[p.Pick(caReq(8, cands), cands)].Name, tt.name)
	}
}

// TestCacheAwareAmortisesSpeed: a slow replica holding most of a
// request's prompt wins its one request over an idle fast one, but a hot
// prefix's later requests will hit wherever it lands, at that replica's
// speed: priced over speedHorizon of them, a prefix with a share of the
// traffic moves to the fast replica, and a cold one (Demand 0) stays.
func TestCacheAwareAmortisesSpeed(t *testing.T) {
	var p CacheAware
	for _, tt := range []struct {
		demand float64
		want   string
	}{{0, "slow"}, {0.001, "fast"}, {0.01, "fast"}} {
		cands := []Candidate{
			{Name: "slow", Matched: 6, BlockTime: 20 * time.Millisecond, TokenTime: 40 * time.Millisecond, CacheBlocks: 64, AssignedPrefill: 6},
			{Name: "fast", BlockTime: 10 * time.Millisecond, TokenTime: 20 * time.Millisecond, CacheBlocks: 64, AssignedPrefill: 6},
		}
		req := caReq(8, cands)
		req.Demand = tt.demand
		assert.Equal(t, tt.want, cands[p.Pick(req, cands)].Name, "demand %v", tt.demand)
		// Equal speeds: the prefix stays, however hot.
		cands[0].BlockTime, cands[0].TokenTime = cands[1].BlockTime, cands[1].TokenTime
		assert.Equal(t, "slow", cands[p.Pick(req, cands)].Name, "equal speeds, demand %v", tt.demand)
		// Slower per block alone, as a fixed cost per request makes the
		// holder of a hot prefix look: not a class, the prefix stays for
		// a hot prefix too (a request's own price may still move it when
		// nothing is hot).
		cands[0].BlockTime = 20 * time.Millisecond
		if tt.demand > 0 {
			assert.Equal(t, "slow", cands[p.Pick(req, cands)].Name, "slower per block only, demand %v", tt.demand)
		}
	}
}

// TestCacheAwareAmortisesOnlyBetweenClasses: one replica whose fit is
// off the deadband among equal ones is one fit's noise, not a slower
// class: its prefix is priced for this request alone and stays; with a
// quarter of the replicas that slow, a hot prefix moves off them (among
// four or fewer replicas, one is a quarter).
func TestCacheAwareAmortisesOnlyBetweenClasses(t *testing.T) {
	var p CacheAware
	for _, tt := range []struct {
		n, slow int
		want    bool // the prefix moves off the slow holder
	}{{8, 1, false}, {8, 2, true}, {8, 4, true}, {5, 1, false}, {4, 1, true}, {2, 1, true}} {
		var cands []Candidate
		for i := range tt.n {
			c := Candidate{Name: "fast", BlockTime: 10 * time.Millisecond, TokenTime: 20 * time.Millisecond, CacheBlocks: 64, AssignedPrefill: 6}
			if i < tt.slow {
				c.Name, c.BlockTime, c.TokenTime = "slow", 20*time.Millisecond, 40*time.Millisecond
			}
			cands = append(cands, c)
		}
		cands[0].Name, cands[0].Matched = "holder", 6
		req := caReq(8, cands)
		req.Demand = 0.01
		got := cands[p.Pick(req, cands)].Name
		assert.Equal(t, tt.want, got != "holder", "%d slow of %d: picked %s", tt.slow, tt.n, got)
	}
}

// TestObjectiveFilters: with an objective some candidates are predicted to
// meet, the cheapest of those wins, even when another is cheaper; when
// none is predicted to, the cheapest wins (best effort); a candidate
// whose speed is unknown counts as meeting it.
func TestObjectiveFilters(t *testing.T) {
	var p CacheAware
	mk := func() []Candidate {
		return []Candidate{
			// holds the prompt, but a deep queue at 10 ms a block: 31 blocks ahead
			{Name: "hot", Matched: 8, PendingPrefill: 30, BlockTime: 10 * time.Millisecond, TokenTime: 20 * time.Millisecond, CacheBlocks: 64, AssignedPrefill: 30},
			// idle, 8 blocks to compute at 30 ms: 270 ms
			{Name: "cold", BlockTime: 30 * time.Millisecond, TokenTime: 60 * time.Millisecond, CacheBlocks: 64, AssignedPrefill: 1},
		}
	}
	for _, tt := range []struct {
		name       string
		ttft, tpot time.Duration
		want       string
	}{
		{"no objective: cheapest", 0, 0, "hot"},
		{"TTFT only the cold one meets", 300 * time.Millisecond, 0, "cold"},
		{"TTFT both meet", time.Second, 0, "hot"},
		{"TPOT does not filter: TTFT only the cold one meets", 300 * time.Millisecond, 30 * time.Millisecond, "cold"},
		{"none meets: best effort", time.Millisecond, 0, "hot"},
	} {
		cands := mk()
		req := caReq(8, cands)
		req.TTFT, req.TPOT = tt.ttft, tt.tpot
		assert.Equal(t, tt.want, cands[p.Pick(req, cands)].Name, tt.name)
	}
	// A candidate whose speed is unknown is taken at the others' mean:
	// "cold" at 10 ms a block, 90 ms.
	cands := mk()
	cands[1].BlockTime, cands[1].TokenTime = 0, 0
	req := caReq(8, cands)
	req.TTFT = 100 * time.Millisecond
	assert.Equal(t, "cold", cands[p.Pick(req, cands)].Name)
	req.TTFT = 80 * time.Millisecond
	assert.Equal(t, "hot", cands[p.Pick(req, cands)].Name, "neither meets 80 ms: best effort (the unknown priced as the pool, no known replica being faster)")
}

// TestObjectiveMonotone: a candidate predicted to meet a TTFT objective
// still meets it with less prefill pending or more of the prompt cached;
// one that misses still misses with more.
func TestObjectiveMonotone(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 64).Draw(t, "blocks")
		c := Candidate{
			Matched:        rapid.IntRange(0, n).Draw(t, "matched"),
			PendingPrefill: rapid.IntRange(0, 1000).Draw(t, "pending"),
			BlockTime:      time.Duration(rapid.Int64Range(0, 1e8).Draw(t, "a")),
		}
		o := objective{ttft: time.Duration(rapid.Int64Range(1, 1e10).Draw(t, "ttft"))}
		less := c
		less.PendingPrefill = rapid.IntRange(0, c.PendingPrefill).Draw(t, "lessPending")
		less.Matched = rapid.IntRange(c.Matched, n).Draw(t, "moreMatched")
		if o.meets(&c, n, 0) && !o.meets(&less, n, 0) {
			t.Fatalf("meets with %+v but not with less work %+v", c, less)
		}
	})
}

// learnGateway routes and finishes requests on a gateway whose replicas
// have the given true times per block, as a front seeing every first
// token would report them, until every replica's speed is known.
func learnGateway(t *testing.T, g *Gateway, perBlock map[string]time.Duration) {
	t.Helper()
	// Eight requests in flight at a time, so that load spreads them.
	// Each takes its replica's time per block for the prefill pending
	// there when it was routed, its own and one step.
	type inFlight struct {
		d    Decision
		work int
	}
	var flight []inFlight
	for i := range 800 {
		pending := map[string]int{}
		for _, st := range g.Replicas() {
			pending[st.Name] = st.PendingPrefill
		}
		d, err := g.Route(keys.AppendHashes(nil, []uint64{uint64(i), 1, 2, 3}))
		require.NoError(t, err)
		flight = append(flight, inFlight{d, pending[d.Replica] + d.Blocks - d.Matched + 1})
		if len(flight) < 8 {
			continue
		}
		f := flight[0]
		flight = flight[1:]
		a := perBlock[f.d.Replica]
		ttft := a * time.Duration(f.work)
		f.d.Done(DoneInfo{TTFT: ttft, Elapsed: ttft + 10*a, OutputTokens: 11})
	}
	for _, f := range flight {
		f.d.Done(DoneInfo{})
	}
	for _, st := range g.snap.Load().list {
		if _, ok := perBlock[st.name]; ok {
			require.NotZero(t, st.speed.Load(), "%s's speed learned", st.name)
		}
	}
}

// TestGatewayLearnsSpeeds: through Route and Done alone, the gateway
// learns each replica's speed; then the faster replicas take the misses,
// the decision predicts them, and Stats counts the objectives.
func TestGatewayLearnsSpeeds(t *testing.T) {
	g := mustNew(t, replicaNames(4), WithMode(ModeCacheAware))
	speeds := map[string]time.Duration{"r0": 10 * time.Millisecond, "r1": 10 * time.Millisecond, "r2": 30 * time.Millisecond, "r3": 30 * time.Millisecond}
	learnGateway(t, g, speeds)
	checkPoolSpeeds(t, g)
	counts := map[string]int{}
	for i := range 200 {
		d, err := g.RouteWith(keys.AppendHashes(nil, []uint64{uint64(10_000 + i), 1, 2, 3}), Target{TTFT: 60 * time.Millisecond})
		require.NoError(t, err)
		counts[d.Replica]++
		if d.Replica == "r0" {
			assert.InDelta(t, float64(10*time.Millisecond*time.Duration(d.Blocks-d.Matched+1)), float64(d.PredictedTTFT), float64(10*time.Millisecond), "prediction for %+v", d)
			assert.InDelta(t, float64(10*time.Millisecond), float64(d.PredictedTPOT), float64(time.Millisecond))
		}
		a := speeds[d.Replica]
		ttft := a * time.Duration(d.Blocks-d.Matched+1)
		d.Done(DoneInfo{TTFT: ttft, Elapsed: ttft + 10*a, OutputTokens: 11})
	}
	assert.Greater(t, counts["r0"]+counts["r1"], 3*(counts["r2"]+counts["r3"]), "counts %v", counts)
	st := g.Stats()
	assert.Equal(t, uint64(200), st.ObjectiveRequests)
	assert.Equal(t, uint64(200), st.TTFTMet+st.TTFTMissed)
	assert.Greater(t, st.TTFTMet, 3*st.TTFTMissed)
	assert.Zero(t, st.TPOTMet+st.TPOTMissed)

	// An objective no replica can meet routes best effort, with FallbackSLO.
	d, err := g.RouteWith(keys.AppendHashes(nil, []uint64{99, 1, 2, 3}), Target{TTFT: time.Microsecond, TPOT: time.Microsecond})
	require.NoError(t, err)
	assert.NotZero(t, d.Fallback&FallbackSLO)
	d.Done(DoneInfo{TTFT: time.Second, Elapsed: 2 * time.Second, OutputTokens: 11})
	st2 := g.Stats()
	assert.Equal(t, st.ObjectiveBestEffort+1, st2.ObjectiveBestEffort)
	assert.Equal(t, st.TTFTMissed+1, st2.TTFTMissed)
	assert.Equal(t, uint64(1), st2.TPOTMissed)

	// Removing a replica takes its speed out of the pool's.
	require.NoError(t, g.RemoveReplica("r2"))
	checkPoolSpeeds(t, g)

	// A replica back in rotation forgets its speed: priced as unknown, it
	// gets traffic to learn from again.
	require.NoError(t, g.SetHealthy("r3", false))
	require.NoError(t, g.SetHealthy("r3", false))
	require.NotZero(t, g.snap.Load().byName["r3"].speed.Load(), "still known while out of rotation")
	require.NoError(t, g.SetHealthy("r3", true))
	assert.Zero(t, g.snap.Load().byName["r3"].speed.Load())
	checkPoolSpeeds(t, g)
	require.NoError(t, g.SetHealthy("r0", true)) // healthy already: kept
	assert.NotZero(t, g.snap.Load().byName["r0"].speed.Load())

	_, err = g.RouteWith(keys.AppendHashes(nil, []uint64{1}), Target{TTFT: -1})
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "Target.TTFT -1ns")
}

// TestPDSplitTeachesDecodeOnly: the decode side of a split request
// (PD.Route) teaches its replica the time per output token after its first
// token, and nothing of prefill: that first token follows the prefill on
// another replica and the KV cache's transfer. Seen only at its end, it
// teaches nothing at all.
func TestPDSplitTeachesDecodeOnly(t *testing.T) {
	pd := PD{Decode: mustNew(t, replicaNames(1), WithMode(ModeLoadAware)), Prefill: mustNew(t, replicaNames(1), WithMode(ModeCacheAware)), MinUncached: 1}
	speed := func() (time.Duration, time.Duration) {
		st := pd.Decode.Replicas()[0]
		return st.BlockTime, st.TokenTime
	}
	for i := range 100 { // seen only at their ends
		plan, err := pd.Route(keys.AppendHashes(nil, []uint64{uint64(i), 1, 2, 3}), 16, Target{}, Target{})
		require.NoError(t, err)
		require.True(t, plan.Split)
		plan.Prefill.Done(DoneInfo{TTFT: 400 * time.Millisecond, Elapsed: 400 * time.Millisecond, OutputTokens: 1})
		plan.Decode.Done(DoneInfo{Elapsed: time.Second, OutputTokens: 11})
	}
	a, b := speed()
	require.Zero(t, a, "block time from ends of split requests")
	require.Zero(t, b, "token time from ends of split requests")
	for i := range 100 { // streamed: a 10 ms token time after the first token
		plan, err := pd.Route(keys.AppendHashes(nil, []uint64{uint64(1000 + i), 1, 2, 3}), 16, Target{}, Target{})
		require.NoError(t, err)
		require.True(t, plan.Split)
		plan.Prefill.Done(DoneInfo{TTFT: 400 * time.Millisecond, Elapsed: 400 * time.Millisecond, OutputTokens: 1})
		plan.Decode.Done(DoneInfo{TTFT: 500 * time.Millisecond, Elapsed: 600 * time.Millisecond, OutputTokens: 11})
	}
	a, b = speed()
	require.Zero(t, a, "block time from first tokens of split requests")
	require.InDelta(t, float64(10*time.Millisecond), float64(b), float64(time.Millisecond), "token time")
	require.NotZero(t, pd.Prefill.Replicas()[0].BlockTime, "the prefill replica learns its prefill")
}

// TestSpeedIgnoresNegativeTokens: a Done whose OutputTokens is negative,
// math.MinInt included, teaches no time per output token (before,
// OutputTokens-1 wrapped to math.MaxInt and fed the fit a sample).
func TestSpeedIgnoresNegativeTokens(t *testing.T) {
	g := mustNew(t, replicaNames(1), WithMode(ModeCacheAware))
	for i := range 200 {
		d, err := g.Route(keys.AppendHashes(nil, []uint64{uint64(i), 1}))
		require.NoError(t, err)
		d.Done(DoneInfo{TTFT: 10 * time.Millisecond, Elapsed: time.Second, OutputTokens: math.MinInt})
	}
	require.Zero(t, g.Replicas()[0].TokenTime)
}

// TestRouteAllocsWithSpeeds: routing with learned speeds and an objective
// allocates nothing.
func TestRouteAllocsWithSpeeds(t *testing.T) {
	g := mustNew(t, replicaNames(8), WithMode(ModeCacheAware))
	learnGateway(t, g, map[string]time.Duration{"r0": time.Millisecond, "r1": 3 * time.Millisecond})
	k := keys.AppendHashes(nil, []uint64{7, 8, 9})
	tg := Target{TTFT: 50 * time.Millisecond, TPOT: 20 * time.Millisecond}
	require.Zero(t, testing.AllocsPerRun(200, func() {
		d, err := g.RouteWith(k, tg)
		if err != nil {
			panic(err)
		}
		d.Done(DoneInfo{TTFT: time.Millisecond, Elapsed: 5 * time.Millisecond, OutputTokens: 5})
	}))
}

// TestObjectiveWithLoadFactor: when the only candidates predicted to meet
// the TTFT objective are over LoadFactor's cap, the request goes best
// effort to the cheapest candidate under the cap. It used to be left
// with no candidate at all: Pick returned -1, and Route failed with
// ErrInvalid.
func TestObjectiveWithLoadFactor(t *testing.T) {
	p := CacheAware{LoadFactor: 1}
	mk := func() []Candidate {
		return []Candidate{
			// holds the prompt at 10 ms a block (10 ms), but 10 in flight:
			// over the cap, ⌈1 × 11/3⌉ = 4
			{Name: "hot", Matched: 8, InFlight: 10, BlockTime: 10 * time.Millisecond, CacheBlocks: 64, AssignedPrefill: 8},
			// idle, 8 blocks at 30 ms: 270 ms
			{Name: "cold", BlockTime: 30 * time.Millisecond, CacheBlocks: 64, AssignedPrefill: 1},
			// idle, 8 blocks at 40 ms, and a queue: 400 ms
			{Name: "colder", PendingPrefill: 2, BlockTime: 40 * time.Millisecond, CacheBlocks: 64, AssignedPrefill: 1},
		}
	}
	for _, tt := range []struct {
		name string
		ttft time.Duration
		want string
	}{
		{"only the capped one meets: best effort under the cap", 100 * time.Millisecond, "cold"},
		{"an uncapped one meets too: it wins", 300 * time.Millisecond, "cold"},
		{"none meets", time.Millisecond, "cold"},
	} {
		cands := mk()
		req := caReq(8, cands)
		req.TTFT = tt.ttft
		i := p.Pick(req, cands)
		require.GreaterOrEqual(t, i, 0, tt.name)
		assert.Equal(t, tt.want, cands[i].Name, tt.name)
	}
}

// TestSpeedFitPartNearZeroRecovers: a time per token that answers seen
// only at their end put near 0 (their prefill drowning their decode) is
// learned from the decode samples that follow, not bounded to twice the
// near-0 fit and weighed as if exact. The draw is one rapid found for
// TestSpeedFitConverges: before the fix the fit's time per token was
// 0.00011 s after 300 samples, against 0.0057 s.
func TestSpeedFitPartNearZeroRecovers(t *testing.T) {
	a, b := 0.1, 0.0057373046875
	rng := rand.New(rand.NewPCG(0x3d120192c0d7, 1))
	var f speedFit
	within := -1
	for i := range 300 {
		f = feed(f, drawSample(rng, 0.5), a, b, 0.8+0.4*rng.Float64(), 0.8+0.4*rng.Float64())
		if i == 3 {
			require.Less(t, f.b, b/100, "the draw no longer puts the time per token near 0 first")
		}
		if within < 0 && math.Abs(f.b/b-1) <= 0.15 {
			within = i
		}
	}
	t.Logf("time per token within 15%% after sample %d", within)
	require.GreaterOrEqual(t, within, 0, "fit b=%g, true %g", f.b, b)
	require.Less(t, within, 20, "samples to learn the time per token")
	require.InDelta(t, 1, f.b/b, 0.15)
}

// TestMeasureSpeedSteps prints how many samples the fit takes to predict
// within 20% after a replica's speed steps by a factor (median, p90 and
// most of 200 seeds, ±10% noise), with every first token seen and with
// none (docs/limitations.md): EXA_MEASURE=1 go test -run
// TestMeasureSpeedSteps -v .
func TestMeasureSpeedSteps(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("set EXA_MEASURE=1 to measure")
	}
	for _, share := range []float64{1, 0} {
		for _, k := range []float64{2, 4, 10, 0.5, 0.1} {
			var ns []int
			for seed := range 200 {
				rng := rand.New(rand.NewPCG(uint64(seed), 3))
				a, b := 1e-3+rng.Float64()*1e-2, 1e-3+rng.Float64()*2e-2
				var f speedFit
				for range 300 {
					f = feed(f, drawSample(rng, share), a, b, 0.9+0.2*rng.Float64(), 0.9+0.2*rng.Float64())
				}
				n := 0
				for ; n < 5000 && predictionError(f, rand.New(rand.NewPCG(9, 9)), k*a, k*b) > 0.2; n++ {
					f = feed(f, drawSample(rng, share), k*a, k*b, 0.9+0.2*rng.Float64(), 0.9+0.2*rng.Float64())
				}
				ns = append(ns, n)
			}
			slices.Sort(ns)
			t.Logf("first tokens seen %v, step %gx: samples to within 20%%: median %d, p90 %d, most %d", share == 1, k, ns[100], ns[180], ns[199])
		}
	}
}

// TestSpeedUnknownUntilEnoughSamples: a fit publishes no speed before a
// decayed sample weight of speedMinSamples (5 samples: 4 weigh 3.94), and
// no time per block before about 36 first tokens (a decayed count of
// speedMinTTFT), so that a few samples do not steer routing: with no
// speed known it routes as if speed-blind.
func TestSpeedUnknownUntilEnoughSamples(t *testing.T) {
	var f speedFit
	for i := range 4 {
		f = f.add(0, 10, 0.1)
		require.Zero(t, f.packed(), "%d decode samples", i+1)
	}
	f = f.add(0, 10, 0.1)
	require.Equal(t, uint64(10_000_000), f.packed(), "10 ms per token after 5 samples")

	f = speedFit{}
	for i := range 35 {
		f = f.add(10, 0, 0.1)
		require.Zero(t, f.packed()>>32, "time per block after %d first tokens", i+1)
	}
	f = f.add(10, 0, 0.1)
	require.Equal(t, uint64(10_000_000)<<32, f.packed(), "10 ms per block after 36 first tokens")
}

// TestSpeedFitPrefillNearZeroRecovers: the time per block's counterpart
// of TestSpeedFitPartNearZeroRecovers: answers seen only at their end put
// it near 0 (their decode drowning their prefill), and the first tokens
// that follow are not bounded to twice that and weighed as if exact. A
// draw found by search over a copy of the fit without the rule (its time
// per block was 7.2e-5 s after 300 samples, against 4.1e-4 s).
func TestSpeedFitPrefillNearZeroRecovers(t *testing.T) {
	a, b := 0.0004095940812189107, 0.007029949142197064
	rng := rand.New(rand.NewPCG(109692, 1))
	var f speedFit
	within := -1
	for i := range 300 {
		n1, n2 := 0.8+0.4*rng.Float64(), 0.8+0.4*rng.Float64()
		f = feed(f, drawSample(rng, 0.5), a, b, n1, n2)
		if within < 0 && math.Abs(f.a/a-1) <= 0.15 {
			within = i
		}
	}
	t.Logf("time per block within 15%% after sample %d", within)
	require.GreaterOrEqual(t, within, 0, "fit a=%g, true %g", f.a, a)
	require.Less(t, within, 20, "samples to learn the time per block")
	require.InDelta(t, 1, f.a/a, 0.15, "fit a=%g, true %g", f.a, a)
}

// TestCacheAwareUniformDecodeNotPriced: in a pool whose times per output
// token agree (within the deadband), a replica's larger time per block is
// not priced: fitted without a fixed cost per request, it is what the
// holder of a prefix shows, its requests bringing little prefill. The
// holder keeps the request there; slower in decode too, it is priced
// slow and the request goes to the faster replica (e2e's
// TestGIESideBySide: 85.5% of prompt tokens hit, against 79% and less
// when such times were priced).
func TestCacheAwareUniformDecodeNotPriced(t *testing.T) {
	var p CacheAware
	mk := func(holderTokens time.Duration) []Candidate {
		return []Candidate{
			{Name: "holder", Matched: 6, BlockTime: 40 * time.Millisecond, TokenTime: holderTokens, CacheBlocks: 64, AssignedPrefill: 6},
			{Name: "other", BlockTime: 10 * time.Millisecond, TokenTime: 20 * time.Millisecond, CacheBlocks: 64, AssignedPrefill: 6},
		}
	}
	cands := mk(20 * time.Millisecond)
	assert.Equal(t, "holder", cands[p.Pick(caReq(8, cands), cands)].Name, "equal in decode")
	cands = mk(40 * time.Millisecond)
	assert.Equal(t, "other", cands[p.Pick(caReq(8, cands), cands)].Name, "slower in decode too")
}

// TestSpeedFitHidesUnexplainedBlockTime: a time per block that does not
// explain the first tokens it is fitted to (they are a fixed cost and a
// noise of a factor of several, not prefill work) is not published, and
// routing prices the replica as one whose speed is unknown; one that
// does, with the simulator's worst spread of first tokens (a typical
// factor of about 2.5) and a few stalled requests, is. (A fixed cost
// alone, with little noise, is fitted 2.2 times off here and published:
// the guard is against fits far off, not against every shape.)
func TestSpeedFitHidesUnexplainedBlockTime(t *testing.T) {
	for _, tt := range []struct {
		name    string
		sigma   float64 // log-normal noise of the first tokens
		fixed   float64 // seconds of each first token that are not prefill
		stalls  int     // first tokens 1,000 times late
		publish bool
	}{
		{"prefill work, little noise", 0.1, 0, 0, true},
		{"prefill work, the simulator's spread", 0.9, 0, 0, true},
		{"prefill work, a few stalls", 0.3, 0, 5, true},
		{"a fixed cost and a factor of 5", 1.6, 0.02, 0, false},
		{"a fixed cost and a factor of 3", 1.1, 0.02, 0, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			var f speedFit
			for i := range 400 {
				w := float64(1 + rng.IntN(200))
				y := 1e-4 * w
				if tt.fixed > 0 {
					y = tt.fixed
				}
				y *= math.Exp(tt.sigma * rng.NormFloat64())
				if i%50 == 0 && i/50 < tt.stalls {
					y *= 1000
				}
				f = f.add(w, 0, y)
				f = f.add(0, 10, 0.01*math.Exp(0.1*rng.NormFloat64()))
			}
			block, token := unpack(f.packed())
			assert.NotZero(t, token, "the time per token is published either way")
			assert.Equal(t, tt.publish, block > 0, "time per block %v, rms log residual %.2f", block, math.Sqrt(f.rr/f.nr))
		})
	}
}

// TestPDColocateAndRouteDecode: a split plan made co-located (its prefill
// failed) counts its uncached blocks as pending prefill on the decode
// replica again and teaches that replica's prefill speed; a decode routed
// again for a split request (RouteDecode) is handed off as Route's.
func TestPDColocateAndRouteDecode(t *testing.T) {
	pd := PD{Decode: mustNew(t, replicaNames(2), WithMode(ModeLoadAware)), Prefill: mustNew(t, replicaNames(1), WithMode(ModeCacheAware))}
	pending := func(name string) int {
		for _, st := range pd.Decode.Replicas() {
			if st.Name == name {
				return st.PendingPrefill
			}
		}
		return -1
	}
	for i := range 100 {
		plan, err := pd.Route(keys.AppendHashes(nil, []uint64{uint64(i), 1, 2, 3}), 16, Target{}, Target{})
		require.NoError(t, err)
		require.True(t, plan.Split)
		require.Zero(t, pending(plan.Decode.Replica))
		plan.Prefill.Done(DoneInfo{Err: errors.New("prefill failed")})
		plan.Colocate()
		require.False(t, plan.Split)
		require.Equal(t, 4, pending(plan.Decode.Replica), "the decode replica prefills it")
		plan.Colocate() // once only
		require.Equal(t, 4, pending(plan.Decode.Replica))
		plan.Decode.Done(DoneInfo{TTFT: 400 * time.Millisecond, Elapsed: 500 * time.Millisecond, OutputTokens: 11})
		require.Zero(t, pending(plan.Decode.Replica))

		r, err := pd.RouteDecode(keys.AppendHashes(nil, []uint64{uint64(i), 1, 2, 3}), Target{Exclude: plan.Decode.Replica})
		require.NoError(t, err)
		require.NotEqual(t, plan.Decode.Replica, r.Replica)
		require.Zero(t, pending(r.Replica), "a retried split decode does not prefill")
		r.Done(DoneInfo{TTFT: 4 * time.Second, Elapsed: 5 * time.Second, OutputTokens: 11})
	}
	for _, st := range pd.Decode.Replicas() {
		require.NotZero(t, st.BlockTime, "%s learns its prefill from co-located fallbacks", st.Name)
		require.Less(t, st.BlockTime, time.Second, "%s learns no prefill from retried split decodes", st.Name)
		require.Zero(t, st.InFlight)
	}
	var none PDDecision
	none.Colocate() // not split: nothing
	_, err := (*PD)(nil).RouteDecode(nil, Target{})
	require.ErrorIs(t, err, ErrInvalid)
}

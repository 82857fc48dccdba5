package gateway

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/examlops/gateway/keys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func caReq(n int, cands []Candidate) *Request {
	m := 0
	for _, c := range cands {
		m = max(m, c.Matched)
	}
	return &Request{Key: make(Key, n), MaxMatched: m}
}

// TestCacheAwareCost checks the cost terms one at a time on hand-made
// candidates.
func TestCacheAwareCost(t *testing.T) {
	tests := []struct {
		name  string
		cands []Candidate
		want  int
	}{
		{"longest match when idle", []Candidate{{Name: "a", Matched: 2}, {Name: "b", Matched: 8}}, 1},
		{"queued prefill outweighs a match", []Candidate{{Name: "a", Matched: 2}, {Name: "b", Matched: 8, PendingPrefill: 40}}, 0},
		{"decode load counts", []Candidate{{Name: "a", InFlight: 5}, {Name: "b", InFlight: 1}}, 1},
		{"engine queue counts", []Candidate{{Name: "a", Load: Load{QueueDepth: 3}}, {Name: "b"}}, 1},
		{"ties go to less assigned work", []Candidate{{Name: "a", AssignedPrefill: 30}, {Name: "b", AssignedPrefill: 10}, {Name: "c", AssignedPrefill: 20}}, 1},
		{"no match: fewer outstanding first", []Candidate{{Name: "a", InFlight: 3, AssignedPrefill: 0}, {Name: "b", InFlight: 2, AssignedPrefill: 50}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, (&CacheAware{}).Pick(caReq(10, tt.cands), tt.cands))
		})
	}
	t.Run("equal replicas take turns", func(t *testing.T) {
		// The gateway stamps LastPicked on the chosen replica each route.
		p := CacheAware{}
		cs := []Candidate{{Name: "a", Matched: 2}, {Name: "b", Matched: 2}, {Name: "c", Matched: 2}}
		var got []int
		for seq := range uint64(6) {
			i := p.Pick(caReq(10, cs), cs)
			cs[i].LastPicked = seq + 1
			got = append(got, i)
		}
		assert.Equal(t, []int{0, 1, 2, 0, 1, 2}, got)
	})
	t.Run("counts within their spread are not priced", func(t *testing.T) {
		// Least 20, mean 24: counts up to 20 + √24 ≈ 24.9 cost nothing.
		cs := []Candidate{{Name: "a", Matched: 3, InFlight: 24}, {Name: "b", InFlight: 20}, {Name: "c", InFlight: 28}}
		assert.Equal(t, 0, (&CacheAware{}).Pick(caReq(10, cs), cs), "a's match wins: its 24 are within the spread")
		cs[0].InFlight = 30 // mean 26: 4.9 beyond 20 + √26, 19.6 blocks, more than the match saves
		assert.Equal(t, 1, (&CacheAware{}).Pick(caReq(10, cs), cs))
	})
	t.Run("a busy cluster values hits more", func(t *testing.T) {
		// a holds 4 of 10 blocks with 8 blocks queued; b is idle; c is busy.
		cs := []Candidate{{Name: "a", Matched: 4, PendingPrefill: 8}, {Name: "b"}, {Name: "c", PendingPrefill: 40}}
		// λ = 1 + 48/3/10 = 2.6: a = 8 + 3.6·6 = 29.6, b = 3.6·10 = 36, c = 76.
		assert.Equal(t, 0, (&CacheAware{}).Pick(caReq(10, cs), cs))
		cs[2].PendingPrefill = 0
		cs[0].PendingPrefill = 12
		// λ = 1 + 12/3/10 = 1.4: a = 12 + 2.4·6 = 26.4 > b = 24.
		req := caReq(10, cs)
		i := (&CacheAware{}).Pick(req, cs)
		assert.Equal(t, 1, i)
		kind, fb := classify(cs[i].Matched, req.MaxMatched)
		assert.Equal(t, KindLoadAware, kind)
		assert.Equal(t, FallbackLoadGuard, fb)
	})
	t.Run("when saturated, waiting requests price a long prompt's blocks", func(t *testing.T) {
		// Every engine has requests waiting. a has less prefill queued but
		// 20 requests waiting; b more prefill behind 2. A short prompt
		// waits least at a; a long one's 64 uncached blocks would hold up
		// the about 20 that will queue behind them at a: λ = 1 + 200/64;
		// a = 100 + 5.125·64 + 4·(20 − 2 − √11) + 64·20 ≈ 1767,
		// b = 300 + 5.125·64 + 64·2 = 756.
		cs := []Candidate{{Name: "a", PendingPrefill: 100, Load: Load{QueueDepth: 20}}, {Name: "b", PendingPrefill: 300, Load: Load{QueueDepth: 2}}}
		assert.Equal(t, 1, (&CacheAware{}).Pick(caReq(64, cs), cs), "the long prompt goes where few wait")
		assert.Equal(t, 0, (&CacheAware{}).Pick(caReq(2, cs), cs), "the short one where the least work waits")
		assert.Equal(t, 0, (&CacheAware{WaitingWeight: -1}).Pick(caReq(64, cs), cs), "without the term, by queued work alone")
		// A cached prefix is not priced: with 62 of 64 blocks at a, the
		// long prompt stays (a = 100 + 5.125·2 + 58.7 + 2·20 ≈ 209).
		cs[0].Matched = 62
		assert.Equal(t, 0, (&CacheAware{}).Pick(caReq(64, cs), cs))
		// Not saturated: c, far busier in prefill, has no request
		// waiting, and the long prompt goes by queued work again
		// (λ = 1 + 1400/3/64; a ≈ 763, b ≈ 894, c ≈ 1594).
		cs[0].Matched = 0
		cs = append(cs, Candidate{Name: "c", PendingPrefill: 1000})
		assert.Equal(t, 0, (&CacheAware{}).Pick(caReq(64, cs), cs))
	})
	t.Run("a holder of the longest prefix prices decode counts in time", func(t *testing.T) {
		// Shared-prefix on 8 × 8b-h100: a holds 16 of the request's 17
		// blocks and has 14 requests decoding, the others 3–5 and none
		// of it. Spread 3 + √5: a's excess is 8.8. In blocks (4 each)
		// a = 2 + 35 = 37 against b = 2·17 = 34, and the request
		// recomputes 16 blocks elsewhere (~80 ms against ~11 ms for a
		// hit). In time, each costs its share of a step, TokenTime/14,
		// against a block's 7 ms: a = 2 + 8.8·7.5/(14·7) ≈ 2.7.
		cs := holderCands(14, 7*time.Millisecond, 7500*time.Microsecond)
		assert.Equal(t, 0, (&CacheAware{}).Pick(caReq(17, cs), cs), "speeds known: the holder keeps the request")
		cs = holderCands(14, 0, 0)
		assert.NotEqual(t, 0, (&CacheAware{}).Pick(caReq(17, cs), cs), "speeds unknown: in blocks, as before")
		cs = holderCands(14, 7*time.Millisecond, 7500*time.Microsecond)
		for i := range cs {
			cs[i].Matched = 16
			if i > 0 {
				cs[i].PendingPrefill = 3 // in time a (≈ 2.8) would win
			}
		}
		assert.NotEqual(t, 0, (&CacheAware{}).Pick(caReq(17, cs), cs), "every candidate holds the prefix: the load guard, in blocks")
		cs = holderCands(14, 7*time.Millisecond, 7500*time.Microsecond)
		for i := 4; i < len(cs); i++ {
			cs[i].BlockTime, cs[i].TokenTime = 14*time.Millisecond, 15*time.Millisecond // half the pool twice as slow: speed classes
		}
		assert.NotEqual(t, 0, (&CacheAware{}).Pick(caReq(17, cs), cs), "between speed classes: in blocks")
	})
	t.Run("a holder far beyond the spread is priced in blocks past timedExcess", func(t *testing.T) {
		// a holds 16 of 17 blocks with 30 requests decoding, the others
		// 3–5. Spread ≈ 3 + √7: a's excess is 21.4. All in time it would
		// cost 2 + 21.4·7.5/(30·7) ≈ 2.8 and keep the request however
		// long its queue; the first timedExcess (8) in time and the rest
		// at DecodeWeight, 2 + 0.3 + 4·13.4 ≈ 56, against 34 to recompute
		// the prompt elsewhere.
		cs := holderCands(30, 7*time.Millisecond, 7500*time.Microsecond)
		assert.NotEqual(t, 0, (&CacheAware{}).Pick(caReq(17, cs), cs), "30 decoding: the guard acts")
		cs[0].InFlight = 14
		assert.Equal(t, 0, (&CacheAware{}).Pick(caReq(17, cs), cs), "14 decoding: within timedExcess, the holder keeps it")
	})
	t.Run("a replicated prefix or fresh replicas keep the guard in blocks", func(t *testing.T) {
		// a holds the request's first 8 blocks with 12 requests
		// decoding; the others hold none, with 2 decoding and 3 blocks
		// of prefill pending. Spread 2 + √4.5: a's excess is 7.9, 32
		// blocks, or 7.9·7/(12·7) = 0.66 in time.
		cands := func(assigned int) []Candidate {
			cs := []Candidate{{Name: "a", Matched: 8, InFlight: 12, AssignedPrefill: 8}}
			for _, n := range []string{"b", "c", "d"} {
				cs = append(cs, Candidate{Name: n, InFlight: 2, PendingPrefill: 3, AssignedPrefill: assigned})
			}
			for i := range cs {
				cs[i].CacheBlocks, cs[i].BlockTime, cs[i].TokenTime = 1000, 7*time.Millisecond, 7*time.Millisecond
			}
			return cs
		}
		// Held by a quarter of the replicas, a prefix with 90% of the
		// traffic is replicated: the others are priced as holding it, and
		// load decides, in blocks: a = 2.2·2 + 32 = 36 against b = 3 +
		// 2.2·2 = 7.4 (in time a = 5.1 would keep it).
		cs := cands(5)
		req := caReq(10, cs)
		req.Demand = 0.9
		assert.NotEqual(t, 0, (&CacheAware{}).Pick(req, cs), "replicating: load decides, in blocks")
		// b, c and d never sent work, a 20-block request: priced as
		// holding the 8 blocks a, the only replica sent work, holds:
		// a = 2.1·12 + 32 = 57 against b = 3 + 2.1·12 = 28 (in time
		// a = 26).
		cs = cands(0)
		assert.NotEqual(t, 0, (&CacheAware{}).Pick(caReq(20, cs), cs), "fresh replicas: load decides, in blocks")
		// Neither: b, c and d would recompute a's 8 blocks (b = 3 +
		// 2.2·10 = 25): in time a keeps the request, in blocks it would not.
		cs = cands(5)
		assert.Equal(t, 0, (&CacheAware{}).Pick(caReq(10, cs), cs), "others lack the prefix: in time")
		cs[0].TokenTime = 0
		assert.NotEqual(t, 0, (&CacheAware{}).Pick(caReq(10, cs), cs), "others lack the prefix, a's time per token unknown: in blocks")
	})
	t.Run("negative weights switch terms off", func(t *testing.T) {
		cs := []Candidate{{Name: "a", Matched: 5, InFlight: 50, Load: Load{Running: 50}}, {Name: "b"}}
		assert.Equal(t, 1, (&CacheAware{}).Pick(caReq(10, cs), cs), "a's batch outweighs its match")
		assert.Equal(t, 0, (&CacheAware{DecodeWeight: -1}).Pick(caReq(10, cs), cs), "with no decode term a's match wins")
	})
}

// TestCacheAwareSpreadsMisses: with every replica idle and nothing cached,
// sequential requests for new prompts spread evenly (ties go to the replica
// sent the least prefill), instead of piling onto the first candidate.
func TestCacheAwareSpreadsMisses(t *testing.T) {
	g, err := New(replicaNames(4), WithMode(ModeCacheAware))
	require.NoError(t, err)
	counts := map[string]int{}
	for i := range 8 {
		d, err := g.Route(keys.AppendHashes(nil, []uint64{uint64(100 * i), 1, 2, 3, 4, 5, 6, 7, 8, 9}))
		require.NoError(t, err)
		counts[d.Replica]++
		d.Done(DoneInfo{})
	}
	assert.Equal(t, map[string]int{"r0": 2, "r1": 2, "r2": 2, "r3": 2}, counts)
}

// TestCacheAwareReplicatesHotPrefix: a prefix held by fewer replicas than
// its share of the traffic (Request.Demand × candidates) is replicated: the
// replicas lacking it are priced as if they held it, so a less loaded one
// warms up; with enough holders, or a cold prefix, the match is worth its
// prefill as usual.
func TestCacheAwareReplicatesHotPrefix(t *testing.T) {
	// 4 replicas; a holds 60 of 64 blocks and runs 3 requests; b, c and d
	// are idle and hold nothing. Warming one costs (1+λ)·64 blocks, far
	// more than a's load, so a myopic cost stays on a.
	cands := func() []Candidate {
		return []Candidate{
			{Name: "a", Matched: 60, InFlight: 3, PendingPrefill: 4},
			{Name: "b"}, {Name: "c"}, {Name: "d"},
		}
	}
	tests := []struct {
		name      string
		demand    float64
		holders   int // of the first candidates, given a's match
		want      int
		replicate bool
	}{
		{"cold prefix stays", 0, 1, 0, false},
		{"quarter of the traffic, one holder of four: enough", 0.25, 1, 0, false},
		{"half of the traffic, one holder: replicate", 0.5, 1, 1, true},
		{"all of the traffic, three holders: replicate", 1, 3, 3, true},
		{"all of the traffic, every replica holds it", 1, 4, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs := cands()
			for i := 1; i < tt.holders; i++ {
				cs[i].Matched, cs[i].InFlight, cs[i].PendingPrefill = 60, 3, 4
			}
			req := caReq(64, cs)
			req.Demand = tt.demand
			i := (&CacheAware{}).Pick(req, cs)
			assert.Equal(t, tt.want, i)
			kind, fb := classify(cs[i].Matched, req.MaxMatched)
			if tt.replicate {
				assert.Equal(t, KindLoadAware, kind)
				assert.Equal(t, FallbackLoadGuard, fb)
			} else {
				assert.Equal(t, KindAffinity, kind)
			}
		})
	}
}

// TestDemandShares: the sketch reports each longest-held prefix's share of
// recent requests (of at least demandPrior), counts requests with no held
// prefix in the total only, and halves its counts every demandWindow
// requests, so shares follow the traffic.
func TestDemandShares(t *testing.T) {
	var d demand
	hot, cold := keys.AppendHashes(nil, []uint64{1, 2, 3}), keys.AppendHashes(nil, []uint64{9})
	assert.Zero(t, d.observe(hot, 0), "nothing held: no share")
	assert.InDelta(t, 1.0/demandPrior, d.observe(hot, 3), 1e-9, "1 of 2 requests, but 2 are too few to tell")
	for range demandPrior {
		d.observe(cold, 1)
	}
	assert.InDelta(t, 2.0/(demandPrior+3), d.observe(hot, 3), 1e-9, "2 of demandPrior+3")
	assert.InDelta(t, 1.0/(demandPrior+4), d.observe(hot, 2), 1e-9, "a shorter prefix of the same key is another prefix")
	for range 4 * demandWindow {
		d.observe(hot, 3)
	}
	assert.Greater(t, d.observe(hot, 3), 0.99)
	for range 2 * demandWindow {
		d.observe(cold, 1)
	}
	// Without halving the hot prefix would still hold 4/6 of the counts.
	assert.Less(t, d.observe(hot, 3), 0.3, "old traffic decays")
	assert.Greater(t, d.observe(cold, 1), 0.7)
}

// TestCacheAwareColdStartKeepsAffinity: on a fresh gateway a prompt seen
// a few times is not hot yet: three requests for it, none finished, all go
// to the replica that got the first (and would find it cached there,
// queued behind its prefill) instead of warming three replicas.
func TestCacheAwareColdStartKeepsAffinity(t *testing.T) {
	g, err := New(replicaNames(4), WithMode(ModeCacheAware))
	require.NoError(t, err)
	key := keys.AppendHashes(nil, []uint64{1, 2, 3, 4, 5, 6, 7, 8})
	for i := range 3 {
		d, err := g.Route(key)
		require.NoError(t, err)
		assert.Equal(t, "r0", d.Replica, "request %d", i)
	}
}

// TestCacheAwareColdPrefixesKeepAffinity: sixteen prompts in random
// order, each about a sixteenth of the traffic, on eight replicas with
// four requests in flight finishing in random order: no prompt is hot
// enough to need a second replica, so each stays on the replica that got
// it first, though another is often idler.
func TestCacheAwareColdPrefixesKeepAffinity(t *testing.T) {
	g, err := New(replicaNames(8), WithMode(ModeCacheAware))
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(1, 2))
	ids := make([]uint64, 64)
	where := map[int]map[string]bool{}
	var open []Decision
	for range 512 {
		if len(open) == 4 {
			j := rng.IntN(len(open))
			open[j].Done(DoneInfo{})
			open = slices.Delete(open, j, j+1)
		}
		p := rng.IntN(16)
		ids[0] = uint64(p) // 64 blocks: no queue of four outweighs the match
		d, err := g.Route(keys.AppendHashes(nil, ids))
		require.NoError(t, err)
		if where[p] == nil {
			where[p] = map[string]bool{}
		}
		where[p][d.Replica] = true
		open = append(open, d)
	}
	for p, reps := range where {
		assert.Len(t, reps, 1, "prompt %d went to %v", p, reps)
	}
}

// holderCands are the candidates of a 17-block request of shared-prefix on
// 8 replicas: a holds 16 of its blocks with aOut requests decoding, b to h
// none of them with 3 to 5 each; all with the given times per block and
// per output token.
func holderCands(aOut int, block, token time.Duration) []Candidate {
	cs := []Candidate{{Name: "a", Matched: 16, InFlight: aOut}}
	for i, out := range []int{3, 4, 3, 5, 4, 3, 4} {
		cs = append(cs, Candidate{Name: string(rune('b' + i)), InFlight: out})
	}
	for i := range cs {
		cs[i].CacheBlocks, cs[i].BlockTime, cs[i].TokenTime = 1000, block, token
	}
	return cs
}

// TestCacheAwareWeightsFinite: New refuses a CacheAware whose weight is
// NaN or infinite, naming the field and the value.
func TestCacheAwareWeightsFinite(t *testing.T) {
	for _, tc := range []struct {
		p    CacheAware
		want string
	}{
		{CacheAware{Externality: math.NaN()}, "CacheAware.Externality NaN"},
		{CacheAware{WaitingWeight: math.Inf(1)}, "CacheAware.WaitingWeight +Inf"},
		{CacheAware{DecodeWeight: math.Inf(-1)}, "CacheAware.DecodeWeight -Inf"},
		{CacheAware{LoadFactor: math.NaN()}, "CacheAware.LoadFactor NaN"},
		{CacheAware{AdapterLoad: math.NaN()}, "CacheAware.AdapterLoad NaN"},
		{CacheAware{AdapterWait: math.Inf(1)}, "CacheAware.AdapterWait +Inf"},
	} {
		_, err := New(replicaNames(2), WithPolicy(&tc.p))
		require.ErrorIs(t, err, ErrInvalid, tc.want)
		require.Contains(t, err.Error(), tc.want)
	}
	_, err := New(replicaNames(2), WithPolicy(&CacheAware{Externality: -1, LoadFactor: 1.5}))
	require.NoError(t, err, "finite values, negative ones included, are taken as before")
}

// TestCacheAwareLoadFactorRange: a LoadFactor other than 0 (no cap) or at
// least 1 is refused by New, naming the field and the value: below 1 the
// policy set no cap at all, silently, where a tighter one was asked for.
func TestCacheAwareLoadFactorRange(t *testing.T) {
	for _, lf := range []float64{0.5, 0.999, -1} {
		_, err := New(replicaNames(2), WithPolicy(&CacheAware{LoadFactor: lf}))
		require.ErrorIs(t, err, ErrInvalid, "LoadFactor %v", lf)
		require.ErrorContains(t, err, fmt.Sprintf("CacheAware.LoadFactor %v", lf))
	}
	for _, lf := range []float64{0, 1, 1.25} {
		_, err := New(replicaNames(2), WithPolicy(&CacheAware{LoadFactor: lf}))
		require.NoError(t, err, "LoadFactor %v", lf)
	}
}

// TestCacheAwareAddedReplicaTakesItsShare: a replica never sent work (one
// just added) in a pool whose replicas all hold the shared system prompt
// is priced as holding it too (it will after one request), so it takes
// the next request at equal load, rather than none until the others'
// queues outweigh that prompt's prefill; not when the prompt is longer
// than the rest of the request, nor on the exact index, which knows it
// holds nothing.
func TestCacheAwareAddedReplicaTakesItsShare(t *testing.T) {
	cands := func(system int) []Candidate {
		cs := []Candidate{{Name: "new", CacheBlocks: 64}}
		for _, n := range []string{"a", "b", "c"} {
			cs = append(cs, Candidate{Name: n, Matched: system, AssignedPrefill: 8, CacheBlocks: 64})
		}
		return cs
	}
	cs := cands(2)
	assert.Equal(t, "new", cs[(&CacheAware{}).Pick(caReq(8, cs), cs)].Name, "priced as holding the 2-block prompt")
	req := caReq(8, cs)
	req.exact = true
	assert.NotEqual(t, "new", cs[(&CacheAware{}).Pick(req, cs)].Name, "exact index: priced as holding nothing")
	cs = cands(5)
	assert.NotEqual(t, "new", cs[(&CacheAware{}).Pick(caReq(8, cs), cs)].Name, "a 5-block prompt of 8 is longer than the rest")
}

// TestCacheAwareFreeCacheCredit: each uncached block costs
// freeCacheCredit more where it evicts another's (CacheBlocks −
// AssignedPrefill exhausted), so a replica with room wins over a full one
// holding a block more of the prompt: full 2·7 + 0.5·7 = 17.5 against
// 2·8 = 16; with room at both, the block decides (14 against 16).
func TestCacheAwareFreeCacheCredit(t *testing.T) {
	cs := []Candidate{
		{Name: "full", Matched: 1, CacheBlocks: 64, AssignedPrefill: 64},
		{Name: "room", CacheBlocks: 64, AssignedPrefill: 1},
	}
	assert.Equal(t, "room", cs[(&CacheAware{}).Pick(caReq(8, cs), cs)].Name)
	cs[0].CacheBlocks = 128
	assert.Equal(t, "full", cs[(&CacheAware{}).Pick(caReq(8, cs), cs)].Name)
}

package gateway

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestPropCandSum: the summary the gateway takes of the candidates while
// refreshing them (candSum.add, Request.sum) is what CacheAware's own
// first pass computes, and CacheAware decides alike with it and without
// it: the shortcut changes no decision.
func TestPropCandSum(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 12).Draw(t, "candidates")
		blocks := rapid.IntRange(1, 8).Draw(t, "blocks")
		cands := make([]Candidate, n)
		for i := range cands {
			cands[i] = Candidate{
				Name:            string(rune('a' + i)),
				Matched:         rapid.IntRange(0, blocks).Draw(t, "matched"),
				InFlight:        rapid.IntRange(0, 4).Draw(t, "inflight"),
				PendingPrefill:  rapid.IntRange(0, 16).Draw(t, "pending"),
				AssignedPrefill: rapid.IntRange(0, 3).Draw(t, "assigned"),
				CacheBlocks:     rapid.IntRange(1, 16).Draw(t, "cacheBlocks"),
				LastPicked:      uint64(rapid.IntRange(0, 3).Draw(t, "lastPicked")),
				Load: Load{QueueDepth: rapid.IntRange(0, 4).Draw(t, "queue"), Running: rapid.IntRange(0, 4).Draw(t, "running"),
					PeerPrefill: rapid.IntRange(0, 8).Draw(t, "peer")},
			}
		}
		sum, maxMatched := candSum{least: math.MaxInt, common: math.MaxInt}, 0
		for i := range cands {
			sum.add(&cands[i], &maxMatched)
		}
		// The oracle: each field from its definition.
		want := candSum{least: math.MaxInt, common: math.MaxInt}
		longest := 0
		for _, c := range cands {
			longest = max(longest, c.Matched)
		}
		for _, c := range cands {
			want.total += c.InFlight
			want.pending += c.PendingPrefill + c.Load.PeerPrefill
			o := max(c.InFlight, c.Load.QueueDepth+c.Load.Running)
			want.outstanding += o
			want.least = min(want.least, o)
			if c.Matched == longest {
				want.holders++
			}
			if c.AssignedPrefill > 0 {
				want.common = min(want.common, c.Matched)
			}
		}
		require.Equal(t, longest, maxMatched)
		require.Equal(t, want, sum)

		key := make(Key, blocks)
		for i := range key {
			key[i] = uint64(i + 1)
		}
		req := Request{Key: key, MaxMatched: maxMatched, Demand: rapid.Float64Range(0, 1).Draw(t, "demand"),
			Tie: rapid.Uint64().Draw(t, "tie"), exact: rapid.Bool().Draw(t, "exact")}
		p := &CacheAware{}
		if rapid.Bool().Draw(t, "capped") {
			p.LoadFactor = 1.25
		}
		without := p.Pick(&req, cands)
		sum.ok = true
		req.sum = sum
		require.Equal(t, without, p.Pick(&req, cands), "the gateway's summary changed the decision")
	})
}

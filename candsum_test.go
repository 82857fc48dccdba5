package gateway

import (
	"errors"
	"fmt"
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
		maxMatched := 0
		for _, c := range cands {
			maxMatched = max(maxMatched, c.Matched)
		}
		sum := candSum{least: math.MaxInt, common: math.MaxInt}
		for i := range cands {
			sum.add(&cands[i], maxMatched)
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

// maxPolicy records what the gateway tells a policy: the request's
// MaxMatched and the longest Matched among the candidates it was given.
type maxPolicy struct{ told, longest int }

func (p *maxPolicy) Pick(req *Request, cands []Candidate) int {
	p.told, p.longest = req.MaxMatched, 0
	for _, c := range cands {
		p.longest = max(p.longest, c.Matched)
	}
	return 0
}

// TestPropMaxMatched: the gateway's Request.MaxMatched (which it takes
// from the index's match of every replica, then recounts when replicas are
// left out) is the longest Matched among the candidates the policy sees,
// whatever replicas hold, are unhealthy or are left out.
func TestPropMaxMatched(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 6).Draw(t, "replicas")
		p := &maxPolicy{}
		g, err := New(replicaNames(n), WithPolicy(p))
		require.NoError(t, err)
		for range rapid.IntRange(0, 8).Draw(t, "stores") {
			k := drawKey(t, "stored", 8, 6)
			require.NoError(t, g.ApplyEvent(fmt.Sprintf("r%d", rapid.IntRange(0, n-1).Draw(t, "holder")), CacheEvent{Kind: BlocksStored, Blocks: k}))
		}
		for i := range n {
			if rapid.IntRange(0, 3).Draw(t, "unhealthy") == 0 {
				require.NoError(t, g.SetHealthy(fmt.Sprintf("r%d", i), false))
			}
		}
		var tg Target
		if rapid.Bool().Draw(t, "exclude") {
			tg.Exclude = fmt.Sprintf("r%d", rapid.IntRange(0, n-1).Draw(t, "excluded"))
		}
		_, err = g.RouteWith(drawKey(t, "key", 8, 6), tg)
		if errors.Is(err, ErrNoHealthyReplica) {
			return
		}
		require.NoError(t, err)
		require.Equal(t, p.longest, p.told)
	})
}

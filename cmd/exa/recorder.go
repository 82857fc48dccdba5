package main

import (
	"sync"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
)

// recorder wraps a gateway policy and counts what the gateway's Stats do
// not give per simulated run: each replica's requests and whole-prefix
// hits, the blocks routed and matched, cache-aware fallbacks, and the
// replicas left out of decisions (in the simulation no replica is ever
// unhealthy, so every exclusion is an SLO exclusion). Safe for concurrent
// use.
type recorder struct {
	inner    gateway.Policy
	replicas int

	mu                                sync.Mutex
	requests, hits, blocks, matched   uint64
	excluded, noMatch, loadGuard, slo uint64
	routed, replicaHits               map[string]uint64
}

// newRecorder returns a recorder for a cluster of the given size; inner is
// set when the simulation makes its policy.
func newRecorder(replicas int) *recorder {
	return &recorder{replicas: replicas, routed: map[string]uint64{}, replicaHits: map[string]uint64{}}
}

// Pick delegates to the wrapped policy and records its choice.
func (r *recorder) Pick(req *gateway.Request, cands []gateway.Candidate) gateway.Choice {
	c := r.inner.Pick(req, cands)
	if c.Index < 0 || c.Index >= len(cands) {
		return c
	}
	chosen := cands[c.Index]
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	r.routed[chosen.Name]++
	r.blocks += uint64(len(req.Key))
	r.matched += uint64(chosen.Matched)
	if chosen.Matched == len(req.Key) && len(req.Key) > 0 {
		r.hits++
		r.replicaHits[chosen.Name]++
	}
	if n := r.replicas - len(cands); n > 0 {
		r.excluded += uint64(n)
	}
	if c.Fallback&gateway.FallbackNoMatch != 0 {
		r.noMatch++
	}
	if c.Fallback&gateway.FallbackLoadGuard != 0 {
		r.loadGuard++
	}
	return c
}

// stats fills the router-side fields of rec from the counts.
func (r *recorder) stats(rec *config.RoutingStats, replicaNames []string, prefill []int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec.Requests, rec.Hits = r.requests, r.hits
	rec.HitRate = frac(r.hits, r.requests)
	rec.Blocks, rec.MatchedBlocks = r.blocks, r.matched
	rec.BlockHitRate = frac(r.matched, r.blocks)
	rec.SLOExcluded, rec.NoMatch, rec.LoadGuard = r.excluded, r.noMatch, r.loadGuard
	rec.Replicas = rec.Replicas[:0]
	for i, name := range replicaNames {
		rs := config.ReplicaStats{Name: name, Routed: r.routed[name], Hits: r.replicaHits[name], Share: frac(r.routed[name], r.requests), Healthy: true}
		if i < len(prefill) {
			rs.PrefillTokens = prefill[i]
		}
		rec.Replicas = append(rec.Replicas, rs)
	}
}

func frac(a, b uint64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

package gateway

import "sync/atomic"

// Stats counts a gateway's routing decisions since it was created.
type Stats struct {
	// Routed counts successful Route calls; Hits those whose chosen
	// replica held the whole prefix.
	Routed, Hits uint64
	// ByKind counts decisions by kind, keyed round_robin, affinity,
	// load_aware.
	ByKind map[string]uint64
	// SLOExcluded counts replicas left out of a decision for breaching
	// the SLO, summed over decisions.
	SLOExcluded uint64
	// SLOFallbacks counts decisions routed within the healthy set because
	// every healthy replica breached the SLO.
	SLOFallbacks uint64
	// NoMatch and LoadGuard count decisions that fell back to load
	// (Decision.Fallback): nothing matched, or the best match was too
	// loaded. RoundRobin and LoadAware make none.
	NoMatch, LoadGuard uint64
	// NoHealthy counts Route calls that failed for want of a healthy
	// replica.
	NoHealthy uint64
	// Blocks and MatchedBlocks sum the prefix blocks routed and the blocks
	// the chosen replicas held: their ratio is the block hit rate.
	Blocks, MatchedBlocks uint64
}

type counters struct {
	routed, hits, sloExcluded, sloFallbacks atomic.Uint64
	noMatch, loadGuard, noHealthy           atomic.Uint64
	blocks, matched                         atomic.Uint64
	byKind                                  [numKinds]atomic.Uint64
}

func (c *counters) record(d *Decision, excluded int) {
	c.routed.Add(1)
	if d.Hit {
		c.hits.Add(1)
	}
	if d.Kind >= 0 && d.Kind < numKinds {
		c.byKind[d.Kind].Add(1)
	}
	if excluded > 0 && d.Fallback&FallbackSLO == 0 {
		c.sloExcluded.Add(uint64(excluded))
	}
	if d.Fallback&FallbackSLO != 0 {
		c.sloFallbacks.Add(1)
	}
	if d.Fallback&FallbackNoMatch != 0 {
		c.noMatch.Add(1)
	}
	if d.Fallback&FallbackLoadGuard != 0 {
		c.loadGuard.Add(1)
	}
	c.blocks.Add(uint64(d.Blocks))
	c.matched.Add(uint64(d.Matched))
}

// Stats returns the gateway's counters.
func (g *Gateway) Stats() Stats {
	// Numerators are read before their denominators, which record
	// increments first, so ratios of the result never exceed 1.
	hits, matched := g.stats.hits.Load(), g.stats.matched.Load()
	s := Stats{
		Hits:          hits,
		Routed:        g.stats.routed.Load(),
		ByKind:        make(map[string]uint64, numKinds),
		SLOExcluded:   g.stats.sloExcluded.Load(),
		SLOFallbacks:  g.stats.sloFallbacks.Load(),
		NoMatch:       g.stats.noMatch.Load(),
		LoadGuard:     g.stats.loadGuard.Load(),
		NoHealthy:     g.stats.noHealthy.Load(),
		MatchedBlocks: matched,
		Blocks:        g.stats.blocks.Load(),
	}
	for k := range numKinds {
		s.ByKind[k.String()] = g.stats.byKind[k].Load()
	}
	return s
}

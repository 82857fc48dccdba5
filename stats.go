package gateway

import (
	"sync/atomic"
	"time"
)

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
	// ObjectiveRequests counts the routes asked with a latency objective
	// (Target.TTFT or TPOT), ObjectiveBestEffort those of them routed
	// although no replica was predicted to meet it (FallbackSLO).
	ObjectiveRequests, ObjectiveBestEffort uint64
	// TTFTMet and TTFTMissed count the requests with a TTFT objective
	// whose Done reported their TTFT, by outcome; TPOTMet and TPOTMissed
	// those with a TPOT objective whose Done reported TTFT, Elapsed and
	// more than one OutputTokens (TPOT: the time after the first token
	// over the tokens after it).
	TTFTMet, TTFTMissed, TPOTMet, TPOTMissed uint64
}

type counters struct {
	routed, hits, sloExcluded, sloFallbacks atomic.Uint64
	noMatch, loadGuard, noHealthy           atomic.Uint64
	blocks, matched                         atomic.Uint64
	byKind                                  [numKinds]atomic.Uint64
	// objective counters: Stats.ObjectiveRequests, ObjectiveBestEffort,
	// TTFTMet, TTFTMissed, TPOTMet, TPOTMissed
	objReq, objBest                          atomic.Uint64
	ttftMet, ttftMissed, tpotMet, tpotMissed atomic.Uint64
}

// attain counts a finished request's outcome against its objective o.
func (c *counters) attain(o *objective, info *DoneInfo) {
	if info.Err != nil || info.TTFT <= 0 {
		return
	}
	if o.ttft > 0 {
		if info.TTFT <= o.ttft {
			c.ttftMet.Add(1)
		} else {
			c.ttftMissed.Add(1)
		}
	}
	if o.tpot > 0 && info.OutputTokens > 1 && info.Elapsed >= info.TTFT {
		if (info.Elapsed-info.TTFT)/time.Duration(info.OutputTokens-1) <= o.tpot {
			c.tpotMet.Add(1)
		} else {
			c.tpotMissed.Add(1)
		}
	}
}

// record counts decision d; excluded replicas were left out for the
// latency SLO, and sloAll says every healthy one breached it (d's
// FallbackSLO may be its objective's instead).
func (c *counters) record(d *Decision, excluded int, sloAll bool) {
	c.routed.Add(1)
	if d.Hit {
		c.hits.Add(1)
	}
	if d.Kind >= 0 && d.Kind < numKinds {
		c.byKind[d.Kind].Add(1)
	}
	if excluded > 0 && !sloAll {
		c.sloExcluded.Add(uint64(excluded))
	}
	if sloAll {
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
		TTFTMet:       g.stats.ttftMet.Load(), TTFTMissed: g.stats.ttftMissed.Load(),
		TPOTMet: g.stats.tpotMet.Load(), TPOTMissed: g.stats.tpotMissed.Load(),
		ObjectiveBestEffort: g.stats.objBest.Load(),
		ObjectiveRequests:   g.stats.objReq.Load(),
	}
	for k := range numKinds {
		s.ByKind[k.String()] = g.stats.byKind[k].Load()
	}
	return s
}

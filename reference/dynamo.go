package reference

import "github.com/examlops/gateway"

// Dynamo is the KV-cache-aware router of NVIDIA Dynamo (docs "KV Cache
// Routing"): it sends a request to the replica with the lowest cost
// OverlapWeight × prefill blocks + decode blocks, where prefill blocks are
// the blocks of this prompt the replica lacks plus the prefill already
// queued there, and decode blocks are the KV blocks active there (here the
// reported KV utilisation times the capacity) plus this prompt's blocks.
// Ties go to fewer in-flight requests, then the earlier candidate
// (Dynamo's temperature 0).
//
// The zero value uses Dynamo's default overlap weight, 1.
type Dynamo struct {
	// OverlapWeight weighs prefill blocks against decode blocks; 0 means 1.
	OverlapWeight float64
}

var _ gateway.Policy = (*Dynamo)(nil)

// Pick implements gateway.Policy.
func (p *Dynamo) Pick(req *gateway.Request, cands []gateway.Candidate) gateway.Choice {
	w := p.OverlapWeight
	if w == 0 {
		w = 1
	}
	n := len(req.Key)
	best, bestCost := 0, 0.0
	for i := range cands {
		c := &cands[i]
		prefill := float64(c.PendingPrefill + n - c.Matched)
		decode := c.Load.KVUtilization*float64(c.CacheBlocks) + float64(n)
		cost := w*prefill + decode
		if i == 0 || cost < bestCost || (cost == bestCost && c.InFlight < cands[best].InFlight) {
			best, bestCost = i, cost
		}
	}
	ch := gateway.Choice{Index: best, Kind: gateway.KindAffinity}
	if cands[best].Matched == 0 {
		ch.Kind, ch.Fallback = gateway.KindLoadAware, gateway.FallbackNoMatch
	} else if cands[best].Matched < req.MaxMatched {
		ch.Kind, ch.Fallback = gateway.KindLoadAware, gateway.FallbackLoadGuard
	}
	return ch
}

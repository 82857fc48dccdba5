package reference

import "github.com/examlops/gateway"

// SGLang is the cache-aware policy of SGLang's router (sgl-router, "Cache-
// Aware Load-Balanced Router", SGLang v0.4 release notes and router
// documentation): when the load is imbalanced (the largest in-flight count
// exceeds the smallest by more than BalanceAbs and by a factor of more than
// BalanceRel) it routes to the replica with the fewest in-flight requests;
// otherwise to the replica with the longest prefix match if that match
// covers more than Threshold of the prompt, else to the replica with the
// most free cache. The router's radix-tree size is approximated by the
// replica's reported KV utilisation.
//
// The zero value uses SGLang's defaults (0.5, 32, 1.1).
type SGLang struct {
	// Threshold is the match ratio needed to follow the cache; 0 means 0.5.
	Threshold float64
	// BalanceAbs is the absolute imbalance threshold; 0 means 32.
	BalanceAbs int
	// BalanceRel is the relative imbalance threshold; 0 means 1.1.
	BalanceRel float64
}

var _ gateway.Policy = (*SGLang)(nil)

// Pick implements gateway.Policy.
func (p *SGLang) Pick(req *gateway.Request, cands []gateway.Candidate) gateway.Choice {
	thr, abs, rel := p.Threshold, p.BalanceAbs, p.BalanceRel
	if thr == 0 {
		thr = 0.5
	}
	if abs == 0 {
		abs = 32
	}
	if rel == 0 {
		rel = 1.1
	}
	lo, hi := 0, 0
	for i := range cands {
		if cands[i].InFlight < cands[lo].InFlight {
			lo = i
		}
		if cands[i].InFlight > cands[hi].InFlight {
			hi = i
		}
	}
	mn, mx := cands[lo].InFlight, cands[hi].InFlight
	if mx-mn > abs && float64(mx) > rel*float64(mn) {
		return gateway.Choice{Index: lo, Kind: gateway.KindLoadAware, Fallback: gateway.FallbackLoadGuard}
	}
	best := 0
	for i := range cands {
		if cands[i].Matched > cands[best].Matched {
			best = i
		}
	}
	if n := len(req.Key); n > 0 && float64(cands[best].Matched)/float64(n) > thr {
		return gateway.Choice{Index: best, Kind: gateway.KindAffinity}
	}
	free := 0
	for i := range cands {
		if cands[i].Load.KVUtilization < cands[free].Load.KVUtilization {
			free = i
		}
	}
	return gateway.Choice{Index: free, Kind: gateway.KindLoadAware, Fallback: gateway.FallbackNoMatch}
}

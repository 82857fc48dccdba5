package reference

import (
	"math"
	"sync"

	"github.com/examlops/gateway"
)

// Proposed is not from the field: it is the simulator's prototype of a
// better cost function for gateway.CacheAware, for the core to fold in.
// It routes to the candidate with the lowest
//
//	PendingPrefill + (1 + λ)·(len(Key) − Matched) + DecodeWeight·Outstanding
//
// blocks, where λ = Externality + mean PendingPrefill / len(Key). The first
// term and the blocks this prompt adds are the request's own wait, as in
// CacheAware; the factor λ charges the prompt's uncached blocks again for
// the wait they impose on the requests queued behind them, and grows with
// the cluster's queued prefill, so a busy cluster values cache hits (its
// throughput) more than an idle one. Exact ties, common when several
// replicas are idle and none holds the prefix, go to the replica that has
// been assigned the fewest uncached blocks so far, then to fewer in-flight
// requests: tie-breaking by candidate order instead piles misses on the
// first replica. There is no in-flight bound: balance comes from the
// prefill terms.
//
// The zero value uses Externality 1 and DecodeWeight 4. Safe for concurrent
// use.
type Proposed struct {
	// Externality is the base of λ; 0 means 1, negative means 0.
	Externality float64
	// DecodeWeight charges each outstanding request, in blocks: the decode
	// work it puts on the replica, which slows every step there. 0 means 4,
	// negative means none.
	DecodeWeight float64

	mu       sync.Mutex
	assigned map[string]float64
}

var _ gateway.Policy = (*Proposed)(nil)

// Pick implements gateway.Policy.
func (p *Proposed) Pick(req *gateway.Request, cands []gateway.Candidate) gateway.Choice {
	ext := p.Externality
	if ext == 0 {
		ext = 1
	} else if ext < 0 {
		ext = 0
	}
	dw := p.DecodeWeight
	if dw == 0 {
		dw = 4
	} else if dw < 0 {
		dw = 0
	}
	n := len(req.Key)
	pending := 0
	for i := range cands {
		pending += cands[i].PendingPrefill
	}
	lambda := ext + float64(pending)/float64(len(cands))/float64(n)

	p.mu.Lock()
	defer p.mu.Unlock()
	if p.assigned == nil {
		p.assigned = map[string]float64{}
	}
	best, bestCost, bestA := -1, math.Inf(1), 0.0
	for i := range cands {
		c := &cands[i]
		a := p.assigned[c.Name]
		cost := float64(c.PendingPrefill) + (1+lambda)*float64(n-c.Matched) + dw*float64(c.Outstanding())
		if best < 0 || cost < bestCost || (cost == bestCost && (a < bestA || (a == bestA && c.InFlight < cands[best].InFlight))) {
			best, bestCost, bestA = i, cost, a
		}
	}
	p.assigned[cands[best].Name] += float64(n - cands[best].Matched)
	ch := gateway.Choice{Index: best, Kind: gateway.KindAffinity}
	switch m := cands[best].Matched; {
	case req.MaxMatched == 0:
		ch.Kind, ch.Fallback = gateway.KindLoadAware, gateway.FallbackNoMatch
	case m < req.MaxMatched:
		ch.Kind, ch.Fallback = gateway.KindLoadAware, gateway.FallbackLoadGuard
	}
	return ch
}

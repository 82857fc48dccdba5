package gateway

import (
	"math"
)

// CacheAware routes a request to the replica that would give it the
// earliest first token, which is usually the replica already holding the
// longest prefix of it (affinity, R1), and otherwise a lightly loaded one.
//
// The load guard has two parts:
//
//  1. Estimated time to first token. Each candidate costs
//     PendingPrefill + (len(Key) − Matched) + DecodeWeight × Outstanding
//     blocks: the prefill already queued there, the part of this prompt it
//     would have to compute, and the slowdown from the batch it is
//     decoding. A cached prefix is worth exactly the prefill it saves, so a
//     hot replica with a deep queue loses to an idle one once its queue
//     outweighs the saving. On traffic whose requests share only a system
//     prompt, every replica holds that prompt, the saving is equal, and the
//     choice is made by load alone: it does not collapse onto one replica.
//  2. Bounded loads (consistent hashing with bounded loads, Mirrokni et
//     al. 2018): a replica is a candidate only while its in-flight count
//     plus this request stays within ⌈LoadFactor × the mean⌉, so no replica
//     runs far ahead of the others in requests even when prefill
//     estimates are wrong (unreported first tokens, engines shared with
//     other gateways).
//
// Ties go to the longer match, then fewer in-flight requests, then the
// earlier candidate: decisions are deterministic.
//
// The zero value uses the defaults below and is safe for concurrent use.
type CacheAware struct {
	// LoadFactor is the bounded-load factor, at least 1. Zero means
	// DefaultLoadFactor.
	LoadFactor float64
	// DecodeWeight is the cost, in blocks of prefill, of each outstanding
	// request at a replica. Zero means DefaultDecodeWeight; a negative
	// value means none.
	DecodeWeight float64
}

// Defaults of CacheAware.
const (
	// DefaultLoadFactor lets a replica carry 25% more in-flight requests
	// than the mean, KubeAI's and Vimeo's choice for CHWBL.
	DefaultLoadFactor = 1.25
	// DefaultDecodeWeight charges each outstanding request a quarter of a
	// block of prefill.
	DefaultDecodeWeight = 0.25
)

var _ Policy = (*CacheAware)(nil)

// Pick returns the candidate with the lowest estimated time to first token
// among those within the load bound.
func (p *CacheAware) Pick(req *Request, cands []Candidate) Choice {
	lf := p.LoadFactor
	if lf < 1 {
		lf = DefaultLoadFactor
	}
	dw := p.DecodeWeight
	if dw == 0 {
		dw = DefaultDecodeWeight
	} else if dw < 0 {
		dw = 0
	}
	total := 0
	for i := range cands {
		total += cands[i].InFlight
	}
	// A replica may take this request while its in-flight count stays
	// within ⌈LoadFactor × mean⌉, the mean counting this request. The least
	// loaded candidate always fits, so the bound never empties the set.
	bound := math.Ceil(lf * float64(total+1) / float64(len(cands)))
	n := len(req.Key)
	best, bestCost := -1, math.Inf(1)
	for i := range cands {
		c := &cands[i]
		if float64(c.InFlight+1) > bound {
			continue
		}
		cost := float64(c.PendingPrefill+n-c.Matched) + dw*float64(c.Outstanding())
		if best < 0 || cost < bestCost || (cost == bestCost && better(c, &cands[best])) {
			best, bestCost = i, cost
		}
	}
	ch := Choice{Index: best, Kind: KindAffinity}
	switch m := cands[best].Matched; {
	case req.MaxMatched == 0:
		ch.Kind, ch.Fallback = KindLoadAware, FallbackNoMatch
	case m < req.MaxMatched:
		ch.Kind, ch.Fallback = KindLoadAware, FallbackLoadGuard
	}
	return ch
}

// better breaks a cost tie: the longer match, then fewer in flight.
func better(a, b *Candidate) bool {
	if a.Matched != b.Matched {
		return a.Matched > b.Matched
	}
	return a.InFlight < b.InFlight
}

package gateway

import "sync/atomic"

// RoundRobin rotates across eligible replicas, the default policy.
// It ignores prefixes and load. As replicas come and go the rotation
// continues over whichever are eligible, so each gets an equal share of
// requests over any window of traffic in which the set is stable.
// The zero value is ready to use and safe for concurrent use.
type RoundRobin struct {
	next atomic.Uint64
}

var _ Policy = (*RoundRobin)(nil)

// Pick returns the next candidate in rotation. Given no candidates (which
// a Gateway never does) it returns Index -1, which Route rejects with
// ErrBadChoice, rather than dividing by zero.
func (p *RoundRobin) Pick(_ *Request, cands []Candidate) Choice {
	if len(cands) == 0 {
		return Choice{Index: -1, Kind: KindRoundRobin}
	}
	n := p.next.Add(1) - 1
	return Choice{Index: int(n % uint64(len(cands))), Kind: KindRoundRobin}
}

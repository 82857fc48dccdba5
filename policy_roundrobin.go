package gateway

import "sync/atomic"

// RoundRobin rotates across eligible replicas, the default policy.
// It ignores prefixes and load. As replicas come and go the rotation
// continues over whichever are eligible, so each gets an equal share of
// requests over any window of traffic in which the set is stable. Its
// decisions are of kind round_robin.
// The zero value is ready to use and safe for concurrent use.
type RoundRobin struct {
	next atomic.Uint64
}

var _ Policy = (*RoundRobin)(nil)

// Pick returns the next candidate in rotation. Given no candidates (which
// a Gateway never does) it returns -1, which Route rejects with an error
// wrapping ErrInvalid, rather than dividing by zero.
func (p *RoundRobin) Pick(_ *Request, cands []Candidate) int {
	if len(cands) == 0 {
		return -1
	}
	n := p.next.Add(1) - 1
	return int(n % uint64(len(cands)))
}

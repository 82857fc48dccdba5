package gateway

import "sync"

// sparesOuts pools the outstanding counts of Spares asked for more
// fallbacks than its stack buffer holds, so that it does not allocate.
var sparesOuts = sync.Pool{New: func() any { return new([]int) }}

// Spares appends to dst the names of up to n eligible replicas (healthy
// and within t), fewest outstanding requests first (Candidate.Outstanding),
// then in the order the replicas were added, and returns it. A front
// offers them as fallbacks to a data plane that retries on its own (the
// endpoint picker's fallback endpoints); t.Exclude leaves out the replica
// already chosen. It takes no lock, and does not allocate when dst has
// room for n names; t.Allow is called once per replica.
func (g *Gateway) Spares(dst []string, n int, t Target) []string {
	if n <= 0 {
		return dst
	}
	start := len(dst)
	// outs[i] is the outstanding count of dst[start+i]; kept on the stack
	// for the usual few fallbacks.
	var buf [8]int
	outs := buf[:0]
	list := g.snap.Load().list
	var pooled *[]int
	if m := min(n, len(list)); m > len(buf) {
		pooled = sparesOuts.Get().(*[]int)
		if cap(*pooled) < m {
			*pooled = make([]int, 0, m)
		}
		outs = (*pooled)[:0]
	}
	for _, rs := range list {
		if !t.eligible(rs) {
			continue
		}
		o := rs.outstanding()
		k := len(outs)
		if k == n {
			if o >= outs[n-1] {
				continue
			}
			k-- // displaces the last
		} else {
			dst = append(dst, "")
			outs = append(outs, 0)
		}
		// Insert at the first position with a larger count (stable: ties
		// keep table order).
		for k > 0 && outs[k-1] > o {
			outs[k], dst[start+k] = outs[k-1], dst[start+k-1]
			k--
		}
		outs[k], dst[start+k] = o, rs.name
	}
	if pooled != nil {
		sparesOuts.Put(pooled)
	}
	return dst
}

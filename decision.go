package gateway

import (
	"sync"
	"sync/atomic"
	"time"
)

// Decision is the outcome of Gateway.Route.
type Decision struct {
	// Replica is the chosen replica's name; Address its address, if any.
	Replica, Address string
	// Kind says how it was chosen: affinity, load_aware or round_robin.
	Kind Kind
	// Hit is true when the chosen replica held the whole prefix.
	Hit bool
	// Matched is how many leading blocks of the key the chosen replica
	// held, of Blocks in all.
	Matched, Blocks int
	// Fallback says why the decision fell back, if it did.
	Fallback Fallback

	rs      *replicaState
	t       *ticket
	gen     uint64
	adapter string // counted against rs until Done
}

// DoneInfo reports how a routed request ended.
type DoneInfo struct {
	// Latency is the request's latency as the caller measures it (time to
	// first token or end to end, the same measure as the SLO). Zero means
	// no sample.
	Latency time.Duration
	// Err is the request's error, if it failed. Failed requests feed no
	// latency sample.
	Err error
}

// ticket tracks one decision's reports, so that FirstToken and Done each
// take effect once however often they are called. Its state packs a
// generation (upper bits) and two flags; tickets are pooled, and a stale
// Decision whose generation has passed changes nothing.
type ticket struct{ state atomic.Uint64 }

const (
	flagFirst = 1
	flagDone  = 2
)

var tickets = sync.Pool{New: func() any { return new(ticket) }}

func newTicket() (*ticket, uint64) {
	t := tickets.Get().(*ticket)
	return t, t.state.Load() >> 2
}

// FirstToken reports that the request's first token has arrived: its
// prefill is over, so the replica's pending prefill shrinks. Optional;
// Done does it if FirstToken was not called. Safe to call more than once.
func (d Decision) FirstToken() {
	if d.t == nil {
		return
	}
	for {
		s := d.t.state.Load()
		if s>>2 != d.gen || s&3 != 0 {
			return
		}
		if d.t.state.CompareAndSwap(s, s|flagFirst) {
			addClamped(&d.rs.pending, -int64(d.Blocks-d.Matched))
			return
		}
	}
}

// Done reports that the request has finished, freeing its load on the
// replica and feeding its latency into the replica's smoothed latency.
// Only the first call has an effect.
func (d Decision) Done(info DoneInfo) {
	if d.t == nil {
		return
	}
	for {
		s := d.t.state.Load()
		if s>>2 != d.gen || s&flagDone != 0 {
			return
		}
		if d.t.state.CompareAndSwap(s, (d.gen+1)<<2) {
			if s&flagFirst == 0 {
				addClamped(&d.rs.pending, -int64(d.Blocks-d.Matched))
			}
			addClamped(&d.rs.inflight, -1)
			if d.adapter != "" {
				d.rs.lora.done(d.adapter)
			}
			if info.Err == nil && info.Latency > 0 {
				d.rs.observeLatency(info.Latency, d.rs.clock())
			}
			tickets.Put(d.t)
			return
		}
	}
}

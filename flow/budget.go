package flow

import (
	"fmt"
	"sync"
)

// Budget bounds what several queues hold together, as a front's queues
// (one per model) share its memory: set the same *Budget in each one's
// Config. A request that would take the budget past a limit displaces one
// request held by any of the queues, by Push's rule applied across them
// (a lower band's first; failing that, the newest of the longest flow of
// its own band if that flow holds at least two more than the request's
// own), so a flood on one model cannot keep another model's requests out;
// failing that it is refused with a *FullError of Scope "global". Safe for
// concurrent use.
type Budget struct {
	lim   Limits
	mu    sync.Mutex
	bytes int64
	n     int
	// members are the queues holding requests against the budget, in the
	// order they started to: the ones a request past the budget may
	// displace from. A queue joins when it holds its first request and
	// leaves when it holds none, so the list is bounded by the queues
	// holding requests.
	members []member
}

// member is a queue sharing a Budget, as the budget's displacement sees it.
type member interface {
	// offer returns the request this queue would give up for a request
	// of priority prio, by Push's rule: the newest of the longest flow of
	// its lowest band below prio, else of the longest flow of band prio.
	offer(prio int) (o offer, ok bool)
	// evict takes out the request offer would now make for prio if it is
	// still o's kind (o's band, a flow at least as long), transferring its
	// share of b to a request of size bytes if that then fits; it returns
	// the call that answers the displaced request. stale: it was not
	// taken because the queue changed since it offered.
	evict(prio int, o offer, b *Budget, bytes int64) (answer func(), ok, stale bool)
	// flowLen returns how many requests a request of flow id and priority
	// prio would join in this queue (Queue.joins).
	flowLen(prio int, id string) int
}

// offer is a member's candidate for displacement: its band's priority
// and the length of its flow.
type offer struct{ prio, n int }

// NewBudget returns a budget of l's limits; a zero field takes its
// default (DefaultMaxBytes, DefaultMaxRequests).
func NewBudget(l Limits) (*Budget, error) {
	switch {
	case l.MaxBytes < 0:
		return nil, fmt.Errorf("%w: budget MaxBytes %d is negative", ErrInvalid, l.MaxBytes)
	case l.MaxRequests < 0:
		return nil, fmt.Errorf("%w: budget MaxRequests %d is negative", ErrInvalid, l.MaxRequests)
	}
	if l.MaxBytes == 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxRequests == 0 {
		l.MaxRequests = DefaultMaxRequests
	}
	return &Budget{lim: l}, nil
}

// Held returns the requests and bytes held against the budget.
func (b *Budget) Held() (requests int, bytes int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n, b.bytes
}

// take counts a request of size bytes for priority prio in place of a
// held request of vb bytes (vn 1, else 0), whose share it takes (the
// caller lets that one go without give), or returns the *FullError of the
// limit it would break. A nil Budget takes anything.
func (b *Budget) take(bytes, vb int64, vn, prio int) error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.fits(bytes, vb, vn, prio); err != nil {
		return err
	}
	b.n += 1 - vn
	b.bytes += bytes - vb
	return nil
}

// fits is take's check; b.mu is held.
func (b *Budget) fits(bytes, vb int64, vn, prio int) error {
	switch {
	case b.n-vn+1 > b.lim.MaxRequests:
		return &FullError{Scope: "global", Resource: "requests", Priority: prio, Held: int64(b.n), Max: int64(b.lim.MaxRequests)}
	case bytes > b.lim.MaxBytes-(b.bytes-vb): // not b.bytes-vb+bytes, which may overflow
		return &FullError{Scope: "global", Resource: "bytes", Priority: prio, Held: b.bytes, Max: b.lim.MaxBytes, Bytes: bytes}
	}
	return nil
}

// transfer gives a held request's share of vb bytes to a request of size
// bytes if it then fits, and reports whether it did; b.mu is not held.
func (b *Budget) transfer(vb, bytes int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fits(bytes, vb, 1, 0) != nil {
		return false
	}
	b.bytes += bytes - vb
	return true
}

// give lets go of a request of size bytes. A nil Budget does nothing.
func (b *Budget) give(bytes int64) {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.n--
	b.bytes -= bytes
	b.mu.Unlock()
}

// join and leave add and remove a member; its lock is held. A nil Budget
// does nothing.
func (b *Budget) join(m member) {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.members = append(b.members, m)
	b.mu.Unlock()
}

func (b *Budget) leave(m member) {
	if b == nil {
		return
	}
	b.mu.Lock()
	for i, o := range b.members {
		if o == m {
			n := len(b.members) - 1
			copy(b.members[i:], b.members[i+1:])
			b.members[n] = nil
			b.members = b.members[:n]
			break
		}
	}
	b.mu.Unlock()
}

// reclaim makes room past the budget for a request of priority prio,
// flow id and size bytes pushed to queue q, by displacing one request of
// any member (Budget's rule), and returns the call that answers the
// displaced request. The room is the displaced request's share,
// transferred to the new one: the caller holds it, or gives it back (give)
// if it cannot. No queue's lock is held by the caller.
func (b *Budget) reclaim(q member, prio int, id string, bytes int64) (answer func(), ok bool) {
	// Another push may take the offered request first: look again, a
	// few times.
	for range 4 {
		answer, ok, stale := b.reclaimOnce(q, prio, id, bytes)
		if !stale {
			return answer, ok
		}
	}
	return nil, false
}

// reclaimOnce is one try of reclaim; stale: the member chosen had changed.
func (b *Budget) reclaimOnce(q member, prio int, id string, bytes int64) (answer func(), ok, stale bool) {
	b.mu.Lock()
	ms := append([]member(nil), b.members...)
	b.mu.Unlock()
	own := q.flowLen(prio, id)
	// The member offering the lowest band below prio (then the longest
	// flow, then the first to join); failing that, the longest flow of
	// band prio, at least two longer than the request's own.
	best, bi := offer{}, -1
	for i, m := range ms {
		o, ok := m.offer(prio)
		switch {
		case !ok:
		case bi < 0,
			o.prio < best.prio,
			o.prio == best.prio && o.n > best.n:
			best, bi = o, i
		}
	}
	if bi < 0 || (best.prio == prio && best.n < own+2) {
		return nil, false, false
	}
	return ms[bi].evict(prio, best, b, bytes)
}

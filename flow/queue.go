package flow

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Order is how a flow orders its own requests.
type Order uint8

const (
	// FCFS: first come, first served (GIE's default, fcfs-ordering-policy).
	FCFS Order = iota
	// EDF: earliest deadline first; equal deadlines in arrival order.
	EDF
)

// Fairness is how a band chooses among its flows.
type Fairness uint8

const (
	// RoundRobin: flows take turns (GIE's round-robin-fairness-policy).
	RoundRobin Fairness = iota
	// GlobalStrict: the head that comes first by the flows' Order goes
	// first, whatever its flow (GIE's default, global-strict-fairness-policy).
	GlobalStrict
)

// Defaults of Config's zero fields.
const (
	DefaultMaxBytes    = 64 << 20
	DefaultMaxRequests = 4096
	DefaultMaxFlows    = 256
	DefaultTTL         = 10 * time.Second
	// MaxFlowID is the longest fairness id accepted, in bytes.
	MaxFlowID = 256
	// OverflowFlow is the flow that requests of a band already holding
	// MaxFlows flows join, whatever their id.
	OverflowFlow = "\x00overflow"
)

// Limits bound what a band, or the whole queue, holds.
type Limits struct {
	// MaxBytes: the most bytes held (the sum of Request.Bytes).
	// 0: DefaultMaxBytes (for a band: the total's).
	MaxBytes int64
	// MaxRequests: the most requests held. 0: DefaultMaxRequests (for a
	// band: the total's).
	MaxRequests int
}

// Config configures a Queue. The zero value is usable: FCFS, RoundRobin,
// the defaults above.
type Config struct {
	// Total bounds the whole queue.
	Total Limits
	// Band bounds each priority band.
	Band Limits
	// TTL is the deadline of a request that names none: its arrival plus
	// TTL. 0: DefaultTTL.
	TTL time.Duration
	// MaxFlows bounds the flows of a band. 0: DefaultMaxFlows.
	MaxFlows int
	// Order within a flow; Fairness among a band's flows.
	Order    Order
	Fairness Fairness
	// Budget, when not nil, bounds this queue together with the others
	// that share it (see Budget). Nil: none.
	Budget *Budget
}

// Request is what a Queue holds.
type Request[T any] struct {
	// Value is the caller's, handed back by Next and Expire.
	Value T
	// Flow is the fairness id; "" is a flow like any other.
	Flow string
	// Priority is the band: higher goes first; negative is sheddable,
	// never held.
	Priority int
	// Bytes is what holding the request costs, counted against the
	// limits. At least 0.
	Bytes int64
	// Deadline: the request is answered by Expire once it has passed.
	// Zero: the push's time plus Config.TTL.
	Deadline time.Time
}

// Handle names a held request, for Remove. The zero value names none.
type Handle[T any] struct{ it *item[T] }

var (
	// ErrInvalid is returned for a bad argument; nothing changes.
	ErrInvalid = errors.New("flow: invalid argument")
	// ErrFull is wrapped by every *FullError.
	ErrFull = errors.New("flow: queue full")
	// ErrSheddable is returned by Push for a negative priority: such a
	// request is served only if it can go at once, never held.
	ErrSheddable = errors.New("flow: sheddable request not held")
)

// FullError is Push's refusal of a request that would break a bound.
type FullError struct {
	// Scope is "band" or "total"; Resource is "bytes" or "requests".
	Scope, Resource string
	// Priority is the request's band; Held and Max the bound's use and
	// size before the push.
	Priority  int
	Held, Max int64
}

func (e *FullError) Error() string {
	return fmt.Sprintf("flow: queue full: %s %s (priority %d): %d held of %d", e.Scope, e.Resource, e.Priority, e.Held, e.Max)
}

// Unwrap makes errors.Is(err, ErrFull) hold.
func (e *FullError) Unwrap() error { return ErrFull }

// item is one held request.
type item[T any] struct {
	req    Request[T]
	seq    uint64
	key    int64 // order within the flow: 0 (FCFS) or the deadline (EDF)
	flow   *flowQ[T]
	fi, ei int // indexes in the flow's heap and the expiry heap; -1 when not held
}

// flowQ is a flow of one band.
type flowQ[T any] struct {
	id    string
	band  *band[T]
	items itemHeap[T] // by (key, seq)
}

// band is a priority band.
type band[T any] struct {
	prio  int
	flows map[string]*flowQ[T]
	ring  []*flowQ[T] // flows holding requests, in turn order
	next  int         // RoundRobin: the ring index whose turn it is
	bytes int64
	n     int
}

// Queue holds requests past capacity. Make one with New.
type Queue[T any] struct {
	mu    sync.Mutex
	cfg   Config
	bands []*band[T]  // by priority, highest first
	exp   itemHeap[T] // by (deadline, seq)
	// scratch holds a band's flows while GlobalStrict orders them.
	scratch []*flowQ[T]
	seq     uint64
	bytes   int64
	n       int
}

// New returns an empty Queue, or ErrInvalid naming a negative field.
func New[T any](c Config) (*Queue[T], error) {
	switch {
	case c.Total.MaxBytes < 0:
		return nil, fmt.Errorf("%w: Total.MaxBytes %d is negative", ErrInvalid, c.Total.MaxBytes)
	case c.Total.MaxRequests < 0:
		return nil, fmt.Errorf("%w: Total.MaxRequests %d is negative", ErrInvalid, c.Total.MaxRequests)
	case c.Band.MaxBytes < 0:
		return nil, fmt.Errorf("%w: Band.MaxBytes %d is negative", ErrInvalid, c.Band.MaxBytes)
	case c.Band.MaxRequests < 0:
		return nil, fmt.Errorf("%w: Band.MaxRequests %d is negative", ErrInvalid, c.Band.MaxRequests)
	case c.TTL < 0:
		return nil, fmt.Errorf("%w: TTL %v is negative", ErrInvalid, c.TTL)
	case c.MaxFlows < 0:
		return nil, fmt.Errorf("%w: MaxFlows %d is negative", ErrInvalid, c.MaxFlows)
	case c.Order > EDF:
		return nil, fmt.Errorf("%w: Order %d is not FCFS or EDF", ErrInvalid, c.Order)
	case c.Fairness > GlobalStrict:
		return nil, fmt.Errorf("%w: Fairness %d is not RoundRobin or GlobalStrict", ErrInvalid, c.Fairness)
	}
	if c.Total.MaxBytes == 0 {
		c.Total.MaxBytes = DefaultMaxBytes
	}
	if c.Total.MaxRequests == 0 {
		c.Total.MaxRequests = DefaultMaxRequests
	}
	if c.Band.MaxBytes == 0 {
		c.Band.MaxBytes = c.Total.MaxBytes
	}
	if c.Band.MaxRequests == 0 {
		c.Band.MaxRequests = c.Total.MaxRequests
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.MaxFlows == 0 {
		c.MaxFlows = DefaultMaxFlows
	}
	return &Queue[T]{cfg: c, exp: itemHeap[T]{exp: true}}, nil
}

// Config returns the queue's configuration with its defaults filled in.
func (q *Queue[T]) Config() Config { return q.cfg }

// Push holds r, arriving at now, and returns its handle. It refuses, with
// nothing changed: a negative Bytes or a Flow over MaxFlowID bytes
// (ErrInvalid); a negative Priority (ErrSheddable); a request that would
// take its band or the queue past a limit (a *FullError), unless it can
// displace one held request to make room.
//
// Displacement, when displaced is not nil: a request past the total limit
// takes the place of the last request (by its flow's order) of the longest
// flow of the lowest band below its own; failing that, or past its band's
// limit, of the longest flow of its own band, if that flow holds at least
// two more requests than the request's own flow. So a flood fills the
// queue only until others arrive: a quiet flow is refused only when it is
// itself among the longest. One request at most is displaced, and only if
// r then fits; displaced is called with it after the queue is unlocked,
// for the caller to answer.
func (q *Queue[T]) Push(r Request[T], now time.Time, displaced func(T)) (Handle[T], error) {
	switch {
	case r.Bytes < 0:
		return Handle[T]{}, fmt.Errorf("%w: Bytes %d is negative", ErrInvalid, r.Bytes)
	case len(r.Flow) > MaxFlowID:
		return Handle[T]{}, fmt.Errorf("%w: Flow of %d bytes is longer than %d", ErrInvalid, len(r.Flow), MaxFlowID)
	case r.Priority < 0:
		return Handle[T]{}, fmt.Errorf("%w: priority %d", ErrSheddable, r.Priority)
	}
	if r.Deadline.IsZero() {
		r.Deadline = now.Add(q.cfg.TTL)
	}
	q.mu.Lock()
	b := q.band(r.Priority)
	var victim *item[T]
	if err := q.fits(r, b, nil); err != nil {
		if displaced != nil {
			victim = q.victim(r, b)
		}
		if victim == nil || q.fits(r, b, victim) != nil {
			q.mu.Unlock()
			return Handle[T]{}, err
		}
	}
	var vb int64
	var vn int
	if victim != nil {
		vb, vn = victim.req.Bytes, 1
	}
	if err := q.cfg.Budget.take(r.Bytes, vb, vn, r.Priority); err != nil {
		q.mu.Unlock()
		return Handle[T]{}, err
	}
	if victim != nil {
		q.remove(victim)
		b = q.band(r.Priority) // removing the victim may have dropped the band
	}
	h := q.hold(r, b)
	q.mu.Unlock()
	if victim != nil {
		displaced(victim.req.Value)
	}
	return h, nil
}

// fits returns the *FullError of the first limit r would break, were
// without (if not nil) taken out first, or nil.
func (q *Queue[T]) fits(r Request[T], b *band[T], without *item[T]) error {
	tn, tb := int64(q.n), q.bytes
	var bn, bb int64
	if b != nil {
		bn, bb = int64(b.n), b.bytes
	}
	if without != nil {
		tn, tb = tn-1, tb-without.req.Bytes
		if without.flow.band == b {
			bn, bb = bn-1, bb-without.req.Bytes
		}
	}
	full := func(scope, res string, held, max int64) error {
		return &FullError{Scope: scope, Resource: res, Priority: r.Priority, Held: held, Max: max}
	}
	switch {
	case tn+1 > int64(q.cfg.Total.MaxRequests):
		return full("total", "requests", tn, int64(q.cfg.Total.MaxRequests))
	case tb+r.Bytes > q.cfg.Total.MaxBytes:
		return full("total", "bytes", tb, q.cfg.Total.MaxBytes)
	case bn+1 > int64(q.cfg.Band.MaxRequests):
		return full("band", "requests", bn, int64(q.cfg.Band.MaxRequests))
	case bb+r.Bytes > q.cfg.Band.MaxBytes:
		return full("band", "bytes", bb, q.cfg.Band.MaxBytes)
	}
	return nil
}

// victim returns the request r may displace (Push's rule), or nil.
func (q *Queue[T]) victim(r Request[T], b *band[T]) *item[T] {
	if b == nil || q.fitsBand(r, b) {
		// Only the total is broken (Push asked because something is):
		// the lowest band below r's first.
		for i := len(q.bands) - 1; i >= 0 && q.bands[i].prio < r.Priority; i-- {
			if f := q.bands[i].longest(); f != nil {
				return f.last()
			}
		}
	}
	if b == nil {
		return nil
	}
	own := 0
	if f := b.flows[r.Flow]; f != nil {
		own = len(f.items.s)
	} else if f := b.flows[OverflowFlow]; f != nil && len(b.flows) >= q.cfg.MaxFlows {
		own = len(f.items.s)
	}
	if f := b.longest(); f != nil && len(f.items.s) >= own+2 {
		return f.last()
	}
	return nil
}

// fitsBand reports whether r fits its band's own limits; b is not nil.
func (q *Queue[T]) fitsBand(r Request[T], b *band[T]) bool {
	return b.n+1 <= q.cfg.Band.MaxRequests && b.bytes+r.Bytes <= q.cfg.Band.MaxBytes
}

// longest returns the band's flow holding the most requests (the first in
// turn order among equals), or nil.
func (b *band[T]) longest() *flowQ[T] {
	var l *flowQ[T]
	for _, f := range b.ring {
		if l == nil || len(f.items.s) > len(l.items.s) {
			l = f
		}
	}
	return l
}

// last returns the flow's request that comes last in its order.
func (f *flowQ[T]) last() *item[T] {
	l := f.items.s[0]
	for _, it := range f.items.s[1:] {
		if l.before(it) {
			l = it
		}
	}
	return l
}

// hold adds r to band b (made if nil) and its flow.
func (q *Queue[T]) hold(r Request[T], b *band[T]) Handle[T] {
	if b == nil {
		b = q.addBand(r.Priority)
	}
	f := b.flows[r.Flow]
	if f == nil {
		id := r.Flow
		if len(b.flows) >= q.cfg.MaxFlows {
			id = OverflowFlow
			f = b.flows[id]
		}
		if f == nil {
			f = &flowQ[T]{id: id, band: b}
			if b.flows == nil {
				b.flows = make(map[string]*flowQ[T])
			}
			b.flows[id] = f
			b.ring = append(b.ring, f)
		}
	}
	q.seq++
	it := &item[T]{req: r, seq: q.seq, flow: f}
	if q.cfg.Order == EDF {
		it.key = r.Deadline.UnixNano()
	}
	f.items.push(it)
	q.exp.push(it)
	b.bytes += r.Bytes
	b.n++
	q.bytes += r.Bytes
	q.n++
	return Handle[T]{it}
}

// Next removes and returns the request to dispatch now, if one held has
// room: bands in priority order; in each, flows in the Fairness order, each
// flow offering only its head (a flow's later request never passes its
// head). room is called with heads until one has room.
func (q *Queue[T]) Next(room func(T) bool) (T, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, b := range q.bands {
		var pick *flowQ[T]
		switch q.cfg.Fairness {
		case RoundRobin:
			k := len(b.ring)
			for i := 0; i < k; i++ {
				j := (b.next + i) % k
				if f := b.ring[j]; room(f.items.s[0].req.Value) {
					pick = f
					b.next = (j + 1) % k // the turn passes to the flow after it
					break
				}
			}
		case GlobalStrict:
			pick = q.strictPick(b, room)
		}
		if pick != nil {
			it := pick.items.s[0]
			q.remove(it)
			return it.req.Value, true
		}
	}
	var zero T
	return zero, false
}

// strictPick returns the flow of band b whose head comes first by the
// order among the heads with room, or nil. It asks room about heads in
// that order and stops at the first yes, since room binds the request it
// has room for (the fronts route it): a younger head asked first would
// be bound and left held.
func (q *Queue[T]) strictPick(b *band[T], room func(T) bool) *flowQ[T] {
	var first *flowQ[T]
	for _, f := range b.ring {
		if first == nil || f.items.s[0].before(first.items.s[0]) {
			first = f
		}
	}
	if first == nil || room(first.items.s[0].req.Value) {
		return first
	}
	// The oldest head has no room: the others, in order (rare at the
	// fronts, whose room is mostly the same for every request).
	q.scratch = append(q.scratch[:0], b.ring...)
	defer func() { clear(q.scratch); q.scratch = q.scratch[:0] }()
	slices.SortFunc(q.scratch, func(x, y *flowQ[T]) int {
		if x.items.s[0].before(y.items.s[0]) {
			return -1
		}
		return 1 // heads are never equal: seq breaks ties
	})
	for _, f := range q.scratch[1:] { // [0] is first
		if room(f.items.s[0].req.Value) {
			return f
		}
	}
	return nil
}

// Expire removes every request whose deadline is at or before now,
// oldest deadline first, calls fn with each, and returns how many.
func (q *Queue[T]) Expire(now time.Time, fn func(T)) int {
	n := 0
	for {
		q.mu.Lock()
		if len(q.exp.s) == 0 || q.exp.s[0].req.Deadline.After(now) {
			q.mu.Unlock()
			return n
		}
		it := q.exp.s[0]
		q.remove(it)
		q.mu.Unlock()
		n++
		if fn != nil {
			fn(it.req.Value)
		}
	}
}

// NextDeadline returns the earliest deadline held, if any.
func (q *Queue[T]) NextDeadline() (time.Time, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.exp.s) == 0 {
		return time.Time{}, false
	}
	return q.exp.s[0].req.Deadline, true
}

// Remove takes out the request h names, as when its client goes away, and
// reports whether it was still held.
func (q *Queue[T]) Remove(h Handle[T]) bool {
	if h.it == nil {
		return false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if h.it.ei < 0 {
		return false
	}
	q.remove(h.it)
	return true
}

// Stats is a queue's content.
type Stats struct {
	// Requests and Bytes held in all.
	Requests int
	Bytes    int64
	// Bands, highest priority first, holding requests.
	Bands []BandStats
}

// BandStats is one band's content.
type BandStats struct {
	Priority, Requests, Flows int
	Bytes                     int64
}

// Stats returns what the queue holds.
func (q *Queue[T]) Stats() Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	s := Stats{Requests: q.n, Bytes: q.bytes, Bands: make([]BandStats, len(q.bands))}
	for i, b := range q.bands {
		s.Bands[i] = BandStats{Priority: b.prio, Requests: b.n, Flows: len(b.ring), Bytes: b.bytes}
	}
	return s
}

// Len returns how many requests are held.
func (q *Queue[T]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// band returns the band of priority p, or nil.
func (q *Queue[T]) band(p int) *band[T] {
	for _, b := range q.bands {
		if b.prio == p {
			return b
		}
	}
	return nil
}

// addBand adds an empty band of priority p in order.
func (q *Queue[T]) addBand(p int) *band[T] {
	b := &band[T]{prio: p}
	i := 0
	for i < len(q.bands) && q.bands[i].prio > p {
		i++
	}
	q.bands = append(q.bands, nil)
	copy(q.bands[i+1:], q.bands[i:])
	q.bands[i] = b
	return b
}

// remove takes a held item out of its flow, the expiry heap and the
// counts, and drops its flow and band when they empty.
func (q *Queue[T]) remove(it *item[T]) {
	f, b := it.flow, it.flow.band
	f.items.removeAt(it.fi)
	q.exp.removeAt(it.ei)
	it.fi, it.ei = -1, -1
	q.cfg.Budget.give(it.req.Bytes)
	b.bytes -= it.req.Bytes
	b.n--
	q.bytes -= it.req.Bytes
	q.n--
	if len(f.items.s) > 0 {
		return
	}
	delete(b.flows, f.id)
	for j, g := range b.ring {
		if g == f {
			b.ring = append(b.ring[:j], b.ring[j+1:]...)
			if j < b.next {
				b.next--
			}
			break
		}
	}
	if b.next >= len(b.ring) {
		b.next = 0
	}
	if b.n > 0 {
		return
	}
	for j, c := range q.bands {
		if c == b {
			q.bands = append(q.bands[:j], q.bands[j+1:]...)
			break
		}
	}
}

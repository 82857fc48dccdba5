package flow

import (
	"errors"
	"fmt"
	"math"
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
	// Deadlines after the year 2262 (or before 1678) count as equal.
	EDF
)

// Fairness is how a band chooses among its flows.
type Fairness uint8

const (
	// RoundRobin: flows take turns, in the order of start-time fair
	// queueing (Goyal, Vin and Cheng, SIGCOMM 1996), each request costing
	// 1: backlogged flows alternate as in GIE's
	// round-robin-fairness-policy, and a flow that becomes backlogged
	// takes the next turn unless it has already had its turn in the
	// current round. See Queue.Next for the bound.
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
	// Scope is "band", "total" (the queue's) or "global" (its Budget's);
	// Resource is "bytes" or "requests".
	Scope, Resource string
	// Priority is the request's band; Held and Max the bound's use and
	// size before the push.
	Priority  int
	Held, Max int64
	// Bytes is the request's size when Resource is "bytes", else 0.
	Bytes int64
}

func (e *FullError) Error() string {
	s := fmt.Sprintf("flow: queue full: %s %s (priority %d): %d held of %d", e.Scope, e.Resource, e.Priority, e.Held, e.Max)
	if e.Resource == "bytes" {
		s += fmt.Sprintf(", the request %d", e.Bytes)
	}
	return s
}

// Unwrap makes errors.Is(err, ErrFull) hold.
func (e *FullError) Unwrap() error { return ErrFull }

// item is one held request.
type item[T any] struct {
	req    Request[T]
	gone   func(T) // Push's displaced: answers it if another queue's request displaces it
	seq    uint64
	key    int64 // order within the flow: 0 (FCFS) or the deadline (EDF)
	flow   *flowQ[T]
	fi, ei int // indexes in the flow's heap and the expiry heap; -1 when not held
}

// flowQ is a flow of one band: backlogged (holding requests), or idle,
// kept only to remember its finish tag (see band.idle).
type flowQ[T any] struct {
	id    string
	band  *band[T]
	items itemHeap[T] // by (key, seq)
	// Start-time fair queueing, each request costing 1: tag is the
	// virtual start tag of the flow's head while it is backlogged, fin
	// the finish tag of its last dispatched request (its start tag + 1);
	// ts orders equal tags, by when they were given (first given, first
	// served).
	tag, fin int64
	ts       uint64
	// idle: in the band's flows map without requests; listed: in idle.
	idle, listed bool
}

// band is a priority band.
type band[T any] struct {
	prio  int
	flows map[string]*flowQ[T] // backlogged and idle flows
	ring  []*flowQ[T]          // backlogged flows, in the order they became so
	// v is the band's virtual time: the largest start tag dispatched.
	// A flow that becomes backlogged starts at max(its fin, v).
	v int64
	// idle lists the flows that emptied with fin > v: their fin still
	// counts when they come back. Once v passes it, it does not, and
	// they are dropped; also when MaxFlows are listed, which bounds the
	// map to MaxFlows backlogged, MaxFlows idle and the overflow flow.
	idle  []*flowQ[T]
	bytes int64
	n     int
}

// Queue holds requests past capacity. Make one with New.
type Queue[T any] struct {
	mu    sync.Mutex
	cfg   Config
	bands []*band[T]  // by priority, highest first
	exp   itemHeap[T] // by (deadline, seq)
	// pend are the requests whose room is kept while they reclaim room
	// past the Budget (pushPastBudget).
	pend []pending
	// joined: a member of its Budget, from its first request held until
	// it holds none and keeps no room (pend), so that a request taking
	// the place of its only one keeps its place among the members.
	joined bool
	// scratch holds a band's flows while Next orders them.
	scratch []*flowQ[T]
	// spare and free keep an emptied band and up to maxFree dropped
	// flows for reuse, so that bands and flows coming and going do not
	// allocate.
	spare *band[T]
	free  []*flowQ[T]
	seq   uint64
	bytes int64
	n     int
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
// for the caller to answer. Past the limits of its Budget (shared with
// other queues), a request displaces by the same rule across all the
// queues sharing it (see Budget); a request held by one of them is
// answered with the displaced function it was pushed with, and one pushed
// with none is never displaced by another queue's request.
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
		if victim != nil || displaced == nil {
			q.mu.Unlock()
			return Handle[T]{}, err
		}
		// r's room in this queue is kept while the budget is reclaimed.
		q.pend = append(q.pend, pending{r.Priority, r.Bytes})
		q.mu.Unlock()
		return q.pushPastBudget(r, displaced, err)
	}
	// Held before the victim goes, so that the queue never empties (and
	// keeps its place among the budget's members); take counted r in the
	// victim's share.
	h := q.hold(r, b, displaced)
	if victim != nil {
		q.unhold(victim)
	}
	q.mu.Unlock()
	if victim != nil {
		displaced(victim.req.Value)
	}
	return h, nil
}

// pending is a request Push let go of q.mu for while it reclaims room
// past the Budget (pushPastBudget): fits counts it as held.
type pending struct {
	prio  int
	bytes int64
}

// unpend forgets one pending request of priority prio and size bytes.
// q.mu is held.
func (q *Queue[T]) unpend(prio int, bytes int64) {
	if i := slices.Index(q.pend, pending{prio, bytes}); i >= 0 {
		q.pend = slices.Delete(q.pend, i, i+1)
	}
}

// pushPastBudget holds r, which fits this queue but not its Budget (full
// is the budget's refusal), by displacing a request of any queue sharing
// the budget (Budget.reclaim), or returns full. q.mu is not held.
func (q *Queue[T]) pushPastBudget(r Request[T], displaced func(T), full error) (Handle[T], error) {
	answer, ok := q.cfg.Budget.reclaim(q, r.Priority, r.Flow, r.Bytes)
	q.mu.Lock()
	q.unpend(r.Priority, r.Bytes)
	if !ok {
		q.leaveIfIdle()
		q.mu.Unlock()
		return Handle[T]{}, full
	}
	defer answer() // the displaced request is gone, whatever follows
	b := q.band(r.Priority)
	if err := q.fits(r, b, nil); err != nil {
		// Cannot happen while r's room was kept (q.pend); should it, the
		// share goes back.
		q.cfg.Budget.give(r.Bytes)
		q.leaveIfIdle()
		q.mu.Unlock()
		return Handle[T]{}, err
	}
	h := q.hold(r, b, displaced)
	q.mu.Unlock()
	return h, nil
}

// candidate returns the request q would give up for a request of
// priority prio past its Budget: the newest of the longest flow of its
// lowest band below prio, else of the longest flow of band prio; nil if
// none, or if it was pushed with no displaced function. q.mu is held.
func (q *Queue[T]) candidate(prio int) *item[T] {
	it := q.lowestBelow(prio)
	if b := q.band(prio); it == nil && b != nil {
		it = b.longest().last()
	}
	if it == nil || it.gone == nil {
		return nil
	}
	return it
}

// lowestBelow returns the newest request of the longest flow of q's
// lowest band if that band is below prio, else nil.
func (q *Queue[T]) lowestBelow(prio int) *item[T] {
	if n := len(q.bands); n > 0 && q.bands[n-1].prio < prio {
		return q.bands[n-1].longest().last()
	}
	return nil
}

func (q *Queue[T]) offer(prio int) (offer, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	it := q.candidate(prio)
	if it == nil {
		return offer{}, false
	}
	return offer{prio: it.flow.band.prio, n: len(it.flow.items.s)}, true
}

func (q *Queue[T]) evict(prio int, o offer, b *Budget, bytes int64) (func(), bool, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	it := q.candidate(prio)
	if it == nil || it.flow.band.prio != o.prio || (o.prio == prio && len(it.flow.items.s) < o.n) {
		return nil, false, true // changed since it was offered
	}
	if !b.transfer(it.req.Bytes, bytes) {
		return nil, false, false
	}
	q.unhold(it)
	return func() { it.gone(it.req.Value) }, true, false
}

func (q *Queue[T]) flowLen(prio int, id string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	b := q.band(prio)
	if b == nil {
		return 0
	}
	if f := b.flows[q.joins(b, id)]; f != nil {
		return len(f.items.s)
	}
	return 0
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
	for _, p := range q.pend { // requests whose room is kept
		tn, tb = tn+1, tb+p.bytes
		if p.prio == r.Priority {
			bn, bb = bn+1, bb+p.bytes
		}
	}
	full := func(scope, res string, held, max int64) error {
		e := &FullError{Scope: scope, Resource: res, Priority: r.Priority, Held: held, Max: max}
		if res == "bytes" {
			e.Bytes = r.Bytes
		}
		return e
	}
	switch {
	case tn+1 > int64(q.cfg.Total.MaxRequests):
		return full("total", "requests", tn, int64(q.cfg.Total.MaxRequests))
	case r.Bytes > q.cfg.Total.MaxBytes-tb: // not tb+r.Bytes, which may overflow
		return full("total", "bytes", tb, q.cfg.Total.MaxBytes)
	case bn+1 > int64(q.cfg.Band.MaxRequests):
		return full("band", "requests", bn, int64(q.cfg.Band.MaxRequests))
	case r.Bytes > q.cfg.Band.MaxBytes-bb:
		return full("band", "bytes", bb, q.cfg.Band.MaxBytes)
	}
	return nil
}

// victim returns the request r may displace (Push's rule), or nil.
func (q *Queue[T]) victim(r Request[T], b *band[T]) *item[T] {
	if b == nil || q.fitsBand(r, b) {
		// Only the total is broken (Push asked because something is):
		// the lowest band below r's first.
		if it := q.lowestBelow(r.Priority); it != nil {
			return it
		}
	}
	if b == nil {
		return nil
	}
	own := 0
	if f := b.flows[q.joins(b, r.Flow)]; f != nil {
		own = len(f.items.s)
	}
	if f := b.longest(); f != nil && len(f.items.s) >= own+2 {
		return f.last()
	}
	return nil
}

// joins returns the id of the flow a request of flow id joins in band b:
// its own while that holds requests; else, a flow becoming backlogged,
// its own while fewer than MaxFlows are, else the overflow flow. Push's
// displacement (victim) and hold both ask it, so that the flow whose
// length the displacement rule weighs is the one the request joins.
func (q *Queue[T]) joins(b *band[T], id string) string {
	if f := b.flows[id]; f != nil && len(f.items.s) > 0 {
		return id
	}
	if len(b.ring) >= q.cfg.MaxFlows {
		return OverflowFlow
	}
	return id
}

// fitsBand reports whether r fits its band's own limits; b is not nil.
func (q *Queue[T]) fitsBand(r Request[T], b *band[T]) bool {
	return b.n+1 <= q.cfg.Band.MaxRequests && r.Bytes <= q.cfg.Band.MaxBytes-b.bytes
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

// hold adds r to band b (made if nil) and its flow; gone answers it if
// another queue's request displaces it.
func (q *Queue[T]) hold(r Request[T], b *band[T], gone func(T)) Handle[T] {
	if b == nil {
		b = q.addBand(r.Priority)
	}
	id := q.joins(b, r.Flow)
	f := b.flows[id]
	if f == nil {
		f = q.newFlow(id, b)
		if b.flows == nil {
			b.flows = make(map[string]*flowQ[T])
		}
		b.flows[id] = f
	}
	if len(f.items.s) == 0 { // the flow becomes backlogged
		f.idle = false
		f.tag = max(f.fin, b.v)
		q.seq++
		f.ts = q.seq
		b.ring = append(b.ring, f)
	}
	q.seq++
	it := &item[T]{req: r, gone: gone, seq: q.seq, flow: f}
	if q.cfg.Order == EDF {
		it.key = edfKey(r.Deadline)
	}
	f.items.push(it)
	q.exp.push(it)
	b.bytes += r.Bytes
	b.n++
	q.bytes += r.Bytes
	q.n++
	if !q.joined {
		q.cfg.Budget.join(q)
		q.joined = true
	}
	return Handle[T]{it}
}

// edfKey is EDF's key of a deadline: its Unix time in nanoseconds,
// saturated, since UnixNano wraps past the years 1678 and 2262 (a
// "never" deadline of the year 9999 would go first).
func edfKey(d time.Time) int64 {
	switch {
	case d.Before(minKey):
		return math.MinInt64
	case d.After(maxKey):
		return math.MaxInt64
	}
	return d.UnixNano()
}

var minKey, maxKey = time.Unix(0, math.MinInt64), time.Unix(0, math.MaxInt64)

// Next removes and returns the request to dispatch now, if one held has
// room: bands in priority order; in each, flows in the Fairness order, each
// flow offering only its head (a flow's later request never passes its
// head). room is called with heads in that order until one has room, and
// no further: room binds what it says yes to (the fronts route it).
//
// RoundRobin's order is start-time fair queueing's, a request costing 1
// whatever its size: the flow with the smallest start tag goes first,
// equal tags in the order they were given. A flow's next request starts
// where its last dispatched one finished (its start tag + 1); a flow that
// becomes backlogged starts at max(the finish tag of its last dispatched
// request, the band's virtual time, the largest start tag dispatched).
// Fairness bound: while every head has room, the start tags of a band's
// backlogged flows are all v or v+1 (v the virtual time), the flows at v
// go in the order their tags were given, and a round (v constant) serves
// each flow once, in the order of the round before; so over any run of
// dispatches during which two flows stay backlogged, their dispatch counts
// differ by at most one (TestPropFairQueueingBound). A flow that becomes
// backlogged after its last request went in an earlier round starts at v:
// it goes before every flow that has had its turn in this round, after at
// most one request of each flow still owed one (TestNewlyBackloggedGoesNext),
// where a plain ring would put it behind a whole round. A flow that sends
// its next request as soon as one is dispatched starts at v+1 again: it
// gets no more than a backlogged flow, one turn a round. A flow skipped
// for want of room keeps its tag, so once it has room it goes first until
// it has caught up with the turns it missed while backlogged.
func (q *Queue[T]) Next(room func(T) bool) (T, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, b := range q.bands {
		var pick *flowQ[T]
		switch q.cfg.Fairness {
		case RoundRobin:
			pick = q.pick(b, room, (*flowQ[T]).startsBefore)
		case GlobalStrict:
			pick = q.pick(b, room, (*flowQ[T]).headBefore)
		}
		if pick != nil {
			it := pick.items.s[0]
			if pick.tag > b.v {
				q.forget(b) // the idle flows' finish tags are all ≤ the new v
				b.v = pick.tag
			}
			pick.fin = pick.tag + 1
			q.remove(it)
			if len(pick.items.s) > 0 {
				// Its next request starts where this one finished.
				pick.tag = pick.fin
				q.seq++
				pick.ts = q.seq
			}
			return it.req.Value, true
		}
	}
	var zero T
	return zero, false
}

// startsBefore orders flows by start tag (RoundRobin).
func (f *flowQ[T]) startsBefore(g *flowQ[T]) bool {
	if f.tag != g.tag {
		return f.tag < g.tag
	}
	return f.ts < g.ts
}

// headBefore orders flows by their heads (GlobalStrict).
func (f *flowQ[T]) headBefore(g *flowQ[T]) bool { return f.items.s[0].before(g.items.s[0]) }

// pick returns the first flow of band b, by before, whose head has room,
// or nil. It asks room about heads in that order and stops at the first
// yes, since room binds the request it has room for (the fronts route
// it): a later head asked first would be bound and left held.
func (q *Queue[T]) pick(b *band[T], room func(T) bool, before func(f, g *flowQ[T]) bool) *flowQ[T] {
	var first *flowQ[T]
	for _, f := range b.ring {
		if first == nil || before(f, first) {
			first = f
		}
	}
	if first == nil || room(first.items.s[0].req.Value) {
		return first
	}
	// The first head has no room: the others, in order (rare at the
	// fronts, whose room is mostly the same for every request).
	q.scratch = append(q.scratch[:0], b.ring...)
	defer func() { clear(q.scratch); q.scratch = q.scratch[:0] }()
	slices.SortFunc(q.scratch, func(x, y *flowQ[T]) int {
		if before(x, y) {
			return -1
		}
		return 1 // never equal: seq and ts break ties
	})
	for _, f := range q.scratch[1:] { // [0] is first
		if room(f.items.s[0].req.Value) {
			return f
		}
	}
	return nil
}

// forget drops band b's idle flows.
func (q *Queue[T]) forget(b *band[T]) {
	for _, f := range b.idle {
		f.listed = false
		if f.idle {
			q.dropFlow(f)
		}
	}
	clear(b.idle)
	b.idle = b.idle[:0]
}

// maxFree bounds the dropped flows kept for reuse.
const maxFree = 64

// newFlow returns an empty flow id of band b, reused if one is free.
func (q *Queue[T]) newFlow(id string, b *band[T]) *flowQ[T] {
	if n := len(q.free); n > 0 {
		f := q.free[n-1]
		q.free[n-1] = nil
		q.free = q.free[:n-1]
		f.id, f.band = id, b
		return f
	}
	return &flowQ[T]{id: id, band: b, fin: math.MinInt64}
}

// dropFlow takes the empty flow f out of its band's map, keeping it for
// reuse.
func (q *Queue[T]) dropFlow(f *flowQ[T]) {
	delete(f.band.flows, f.id)
	f.idle = false
	if f.listed || len(q.free) >= maxFree {
		return // still in its band's idle list (which skips it): not reused
	}
	s := f.items.s[:0]
	if cap(s) > maxFree {
		s = nil // a long flow's heap is not kept
	}
	*f = flowQ[T]{items: itemHeap[T]{s: s}, fin: math.MinInt64}
	q.free = append(q.free, f)
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
	b := q.spare
	if b != nil {
		q.spare = nil
		b.prio = p
	} else {
		b = &band[T]{prio: p}
	}
	i := 0
	for i < len(q.bands) && q.bands[i].prio > p {
		i++
	}
	q.bands = append(q.bands, nil)
	copy(q.bands[i+1:], q.bands[i:])
	q.bands[i] = b
	return b
}

// leaveIfIdle leaves the Budget's members if q holds no request and
// keeps no room (pend). q.mu is held.
func (q *Queue[T]) leaveIfIdle() {
	if q.joined && q.n == 0 && len(q.pend) == 0 {
		q.cfg.Budget.leave(q)
		q.joined = false
	}
}

// remove takes a held item out of the queue and gives its share of the
// Budget back.
func (q *Queue[T]) remove(it *item[T]) {
	q.cfg.Budget.give(it.req.Bytes)
	q.unhold(it)
}

// unhold takes a held item out of its flow, the expiry heap and the
// counts, and drops its flow and band when they empty; its share of the
// Budget is the caller's.
func (q *Queue[T]) unhold(it *item[T]) {
	f, b := it.flow, it.flow.band
	f.items.removeAt(it.fi)
	q.exp.removeAt(it.ei)
	it.fi, it.ei = -1, -1
	b.bytes -= it.req.Bytes
	b.n--
	q.bytes -= it.req.Bytes
	q.n--
	q.leaveIfIdle()
	if len(f.items.s) > 0 {
		return
	}
	for j, g := range b.ring {
		if g == f {
			b.ring = append(b.ring[:j], b.ring[j+1:]...)
			break
		}
	}
	if f.fin > b.v {
		// Its last request went in this round: it must not start
		// again before the others' turns when it comes back.
		if len(b.idle) >= q.cfg.MaxFlows {
			q.forget(b)
		}
		f.idle = true
		if !f.listed {
			f.listed = true
			b.idle = append(b.idle, f)
		}
	} else {
		q.dropFlow(f)
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
	// The band goes, its idle flows with it: nothing waits in it for
	// them to be fair to.
	q.forget(b)
	if q.spare == nil {
		*b = band[T]{flows: b.flows, ring: b.ring[:0], idle: b.idle[:0]}
		q.spare = b
	}
}

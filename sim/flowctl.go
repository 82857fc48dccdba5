package sim

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/examlops/gateway/flow"
)

// Flow control in the simulated front (issue 28). With
// Config.FlowControl.Enabled, the gateway's own policies (those without
// Policy.Source) hold a request instead of shedding it: every arriving
// request is pushed into its gateway's flow.Queue (one per gateway, the
// simulated cluster being one model pool), and the queue's Next is asked
// for the request to dispatch, with room = flow.Bind under
// Config.Admission for the request's target (the fronts' bind rule:
// Gateway.Saturated, then RouteWith), after every arrival, after every
// engine step that completed a request, and after every load refresh. A
// dispatched request is so routed then (late binding: at dispatch, not at
// arrival), and its TTFT counts from its arrival, its
// time in queue up to its dispatch. At each held request's deadline Expire
// answers it: it counts as expired (Result.Expired), apart from the shed.
// A request the queue refuses (a bound) or displaces counts as shed, with
// its reason (Result.ShedReasons). The simulated clock is the queue's.
//
// Policy.GIEFlowControl runs a policy behind a model of GIE v1.5.0's flow
// controller instead (see gieflow.go).

// FlowControl configures flow control in the simulated front.
type FlowControl struct {
	// Enabled turns it on for the gateway's own policies; it needs
	// Config.Admission, the rule that says when a replica has room.
	// Default false: today's shedding (Config.Admission) or nothing.
	Enabled bool
	// Queue configures each gateway's queue: its bounds (a request's
	// Bytes is 4 per prompt token), TTL, fairness and order. The zero
	// value takes package flow's defaults (10 s TTL, 4,096 requests,
	// 64 MiB, round-robin among tenants, FCFS within one).
	Queue flow.Config
	// UsageLimits maps a priority to its band's usage limit in (0, 1], as
	// the fronts' flow.Options.UsageLimits: its requests have room only
	// under Config.Admission scaled by it (flow.Limit). Unlisted: 1.
	UsageLimits map[int]float64
}

// BytesPerToken is the size a held request is counted at, per prompt
// token (about 4 bytes of text per token), against the queue's byte bounds.
const BytesPerToken = 4

// front is how a policy's front treats a request before routing it.
type front uint8

const (
	frontNone front = iota // route every request at once
	frontShed              // shed while Saturated (Config.Admission)
	frontFlow              // flow control: hold, dispatch at room
	frontGIE               // GIE v1.5.0's flow controller
)

// validFlow checks Config.FlowControl.
func validFlow(c *Config) error {
	if !c.FlowControl.Enabled {
		return nil
	}
	if !admits(c.Admission) {
		return fmt.Errorf("%w: FlowControl needs Admission (queue depth, KV, outstanding or pending-prefill threshold) to say when a replica has room", ErrInvalidConfig)
	}
	if _, err := flow.New[*seq](c.FlowControl.Queue); err != nil {
		return fmt.Errorf("%w: FlowControl.Queue: %w", ErrInvalidConfig, err)
	}
	for _, p := range slices.Sorted(maps.Keys(c.FlowControl.UsageLimits)) { // the same error every run
		if l := c.FlowControl.UsageLimits[p]; !flow.ValidUsageLimit(l) {
			return fmt.Errorf("%w: FlowControl.UsageLimits[%d] %v, want (0, 1]", ErrInvalidConfig, p, l)
		}
	}
	return nil
}

// Events of the flow-control fronts, beside load refreshes (-1).
const (
	evExpire  int32 = -2 // the earliest held deadline
	evGIETick int32 = -3 // GIE's dispatch ticker
	evPeers   int32 = -4 // the gateways share their pending prefill (Config.PeerRefreshInterval)
)

// never is the deadline of a request held without a TTL (GIE's default).
var never = time.Unix(0, math.MaxInt64)

// hold pushes s, arriving now through router gi, into that router's
// queue and dispatches what has room.
func (e *engine) hold(s *seq, gi int) {
	gw := &e.gws[gi]
	r := flow.Request[*seq]{Value: s, Flow: e.tenantName(s), Priority: s.prio, Bytes: int64(s.in) * BytesPerToken}
	if e.front == frontGIE {
		r.Deadline = never
	}
	_, err := gw.fq.Push(r, time.Unix(0, e.now), e.displaced)
	if err != nil {
		e.shed(s, shedReason(err))
		return
	}
	e.queued++
	if e.front == frontGIE {
		e.gieCycle(gi)
		e.gieTick()
		return
	}
	e.dispatchAll()
	e.scheduleExpiry()
}

// shedReason names why Push refused a request.
func shedReason(err error) string {
	var fe *flow.FullError
	switch {
	case errors.As(err, &fe):
		return "full: " + fe.Scope + " " + fe.Resource
	case errors.Is(err, flow.ErrSheddable):
		return "sheddable"
	}
	return "invalid"
}

func (e *engine) displaced(s *seq) {
	e.queued--
	e.shed(s, "displaced")
}

// reasonSaturated is the reason of a request Config.Admission sheds.
const reasonSaturated = "saturated"

// shed counts s as shed for reason and frees it.
func (e *engine) shed(s *seq, reason string) {
	e.res.Dropped++
	e.res.Shed++
	if reason != reasonSaturated { // Admission's sheds are not broken down
		if e.res.ShedReasons == nil {
			e.res.ShedReasons = map[string]int{}
		}
		e.res.ShedReasons[reason]++
	}
	e.group(s, func(g *groupAcc) { g.shed++ })
	e.pool = append(e.pool, s)
}

// dispatchAll dispatches, from every gateway's queue, each request Next
// gives while one has room.
func (e *engine) dispatchAll() {
	if e.queued == 0 {
		return
	}
	for i := range e.gws {
		gw := &e.gws[i]
		// The fronts' bind rule: room, then routed at that moment.
		room := func(s *seq) bool {
			a := flow.Limit(e.cfg.Admission, e.cfg.FlowControl.UsageLimits[s.prio]) // its band's usage limit (unlisted: unchanged)
			ok, d, routed := flow.Bind(gw.g, s.key, s.target, a, false)
			if routed {
				s.d = d // dispatch sends it there
			}
			return ok
		}
		for {
			s, ok := gw.fq.Next(room)
			if !ok {
				break
			}
			e.queued--
			if e.now-s.arrival > int64(gw.fq.Config().TTL) {
				e.res.Late++
			}
			e.dispatch(s, s.heldBase())
		}
	}
}

// scheduleExpiry schedules an expiry event at the earliest held deadline
// unless one is scheduled at or before it.
func (e *engine) scheduleExpiry() {
	at := int64(math.MaxInt64)
	for i := range e.gws {
		if d, ok := e.gws[i].fq.NextDeadline(); ok && d != never {
			at = min(at, d.UnixNano())
		}
	}
	if at == math.MaxInt64 || (e.expAt != 0 && e.expAt <= at) {
		return
	}
	e.expAt = at
	e.push(max(at, e.now), event{rep: evExpire})
}

// expire answers every held request whose deadline has come.
func (e *engine) expire() {
	now := time.Unix(0, e.now)
	for i := range e.gws {
		e.gws[i].fq.Expire(now, func(s *seq) {
			late := e.now - (s.arrival + int64(e.gws[i].fq.Config().TTL))
			e.lateMax, e.lateMin = max(e.lateMax, late), min(e.lateMin, late)
			if late > 0 {
				e.res.Late++
			}
			e.queued--
			e.res.Expired++
			e.group(s, func(g *groupAcc) { g.expired++ })
			e.pool = append(e.pool, s)
		})
	}
	e.expAt = 0
	e.scheduleExpiry()
}

// flowEvent handles the events of the flow-control fronts.
func (e *engine) flowEvent(ev event) {
	switch ev.rep {
	case evExpire:
		e.expire()
	case evGIETick:
		e.gieTicking = false
		for i := range e.gws {
			e.gieCycle(i)
		}
		e.gieTick()
	}
}

// afterEvent runs the front's dispatch after a refresh or a step that
// completed requests.
func (e *engine) afterEvent() {
	switch e.front {
	case frontFlow:
		e.dispatchAll()
		e.scheduleExpiry()
	case frontGIE:
		e.gieTick()
	}
}

package sim

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/flow"
	fronts "github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/keys"
	"github.com/examlops/gateway/reference"
)

// Test hooks: checkInvariants verifies every replica's cache after each
// step; noMacro simulates decode one step per event; noSkip ticks the
// load refreshes through idle gaps (nextTick).
var checkInvariants, noMacro, noSkip bool

// errShed is the error a request shed by a full queue reports to the gateway.
var errShed = errors.New("gateway: sim: shed, queue full")

// seq is a request in flight on a replica.
type seq struct {
	id        uint64
	arrival   int64
	in, out   int
	key       gateway.Key // prompt blocks, chained
	outKey    gateway.Key // answer blocks cached at completion
	buf       gateway.Key // backing store of key and outKey
	slots     []int32     // cache slots of key's blocks once pinned
	private   int         // blocks reserved beyond the prompt
	committed int         // leading blocks cached: found at admission, then filled by its chunks
	published int         // leading blocks the replica's KV events have told of
	left      int         // prompt tokens still to prefill
	pos       int         // tokens of context before the next chunk
	chunk     int         // tokens prefilled in the current step
	ttft      int64
	routed    int64 // when the gateway routed it (dispatch), ns

	finish  int64 // step at which the last token is produced
	ctxBase int64 // context at step s is ctxBase + s
	d       gateway.Decision
	gw      *router // the gateway that routed it
	adapter int32   // LoRA adapter id, 0 for the base model (lora.go)
	skipped int64   // when it first waited for an adapter slot, -1 never
	quiet   bool    // the client does not stream: d hears nothing at the first token

	// Kept from the request for routing at dispatch (flow control).
	user uint64      // Request.Blocks[UserBlock], for a Tracker
	base gateway.Key // the unsalted key of an adapter's request, for a Tracker
	// Tenant and class (indexes in the engine's groups, -1 none),
	// priority band and TTFT objective in ns.
	tenant, class int16
	prio          int
	slo           int64
	tpotSLO       int64 // TPOT objective in ns, 0 none (objectives.go)
	// target is what the request asks of the router: its adapter and,
	// when Config.ObjectiveHeaders, its own objectives.
	target gateway.Target
}

type replica struct {
	name    string
	cache   *kvCache
	waiting fifo
	prefill []*seq
	decode  minHeap[*seq] // by (finish, id)
	nChunk  int

	step    int64 // steps done
	sumBase int64 // Σ ctxBase over decode

	busy      bool
	ver       uint32
	stepStart int64
	stepK     int64
	u, v      float64 // a macro step of k decode steps takes k·u + v·k(k−1)/2

	prefillTokens int64
	work          int64 // tokens admitted, prompts and answers: more than its steps (stall.go)
	requests      int64
	lora          loraReplica // adapter slots (lora.go)
	speed         float64     // multiplier of the preset's compute speed (speeds.go)
}

func (r *replica) running() int { return len(r.prefill) + len(r.decode) }

// event is the end of a replica's step, valid if ver is still the
// replica's, or a load refresh; events are ordered by (time, the order
// they were pushed in).
type event struct {
	rep int32 // -1: load refresh
	ver uint32
}

type engine struct {
	cfg   *Config
	p     Preset
	bt    int
	cap   int
	reps  []*replica
	byNm  map[string]int32
	gws   []router // Config.Gateways of them
	exact bool
	// peerOwn, peerLeast and peerMean are sharePending's scratch.
	peerOwn, peerLeast, peerMean []int
	// With Config.PeerRefreshInterval: peerShared is the PeerPrefill each
	// gateway was last pushed (gateway-major), lastLoad each replica's
	// load as last scraped.
	peerShared []int
	lastLoad   []gateway.Load

	now    int64
	events minHeap[event]
	evSeq  uint64
	nextID uint64
	pool   []*seq

	inflight int
	// releases are the timers of front.ReleaseAtPrediction (the fronts'
	// rule for a request whose first token they cannot see), by when they
	// fire: the Decision's FirstToken when its prefill is predicted over.
	releases minHeap[func()]
	stored   gateway.Key // scratch: the answer blocks release cached
	// own: the policy is one of the gateway's own, run behind the fronts'
	// rules (sloRule: what a front does with a request no replica is
	// predicted to meet, Config.Unattainable).
	own     bool
	sloRule fronts.Objectives
	front   front // what the policy's front does before routing

	// Flow control (flowctl.go, gieflow.go).
	queued     int   // requests held in the gateways' queues
	expAt      int64 // the expiry event scheduled, 0 none
	gieSat     float64
	scraped    int64 // when the load was last scraped (refresh), ns
	gieTicking bool
	freed      bool // a request completed in the step just ended, or released pending prefill a room rule counts
	// lateMax and lateMin: the most and least time an expired request
	// was answered after its deadline (for the tests: both 0).
	lateMax, lateMin int64
	qtime            hist
	tenants          groups
	classes          groups

	res      Result
	ttft     hist
	e2e      hist
	inTok    int64
	cachedTk int64
	routerTk int64
	hitReqs  int
	sloMet   int
	outTok   int64
	first    int64
	last     int64
	lora     loraSim // adapter ids, slots and figures (lora.go)
	speeds   speedClock
	// stall is the first replica found stalled, quiet the requests
	// answered + 1 at the last refresh that found the run quiet, 0 none
	// (stall.go).
	stall error
	quiet int64
}

func newEngine(cfg *Config, pol Policy) (*engine, error) {
	e := &engine{cfg: cfg, p: cfg.Preset, bt: cfg.Workload.BlockTokens(), byNm: map[string]int32{}, first: -1}
	e.cap = e.p.KVTokens / e.bt
	e.exact = cfg.Index == IndexExact || pol.Exact
	e.lora.init(cfg)
	reps := make([]gateway.Replica, cfg.Replicas)
	for i := range reps {
		name := "r" + strconv.Itoa(i)
		reps[i] = gateway.Replica{Name: name, CacheBlocks: e.cap}
		// A per-run secret places the blocks in each replica's table.
		e.reps = append(e.reps, &replica{name: name, cache: newKVCache(e.cap, rand.Uint64()), speed: cfg.speedOf(i)})
		e.byNm[name] = int32(i)
	}
	clock := func() time.Time { return time.Unix(0, e.now) } // the simulated clock
	e.gws = make([]router, max(1, cfg.Gateways))
	for i := range e.gws {
		gw := &e.gws[i]
		opts := []gateway.Option{gateway.WithClock(clock)}
		if e.exact {
			opts = append(opts, gateway.WithExactIndex())
		}
		if pol.New != nil {
			gp := pol.New(policySeed(cfg.Seed, i))
			gw.policy = gp
			gw.tracker, _ = gp.(reference.Tracker)
			gw.kv, _ = gp.(reference.KVListener)
			gw.pred, _ = gp.(reference.Predictor)
			if c, ok := gp.(reference.Clocked); ok { // a peer timing what it hears reads the simulated clock
				c.SetClock(clock)
			}
			opts = append(opts, gateway.WithPolicy(gp))
		} else {
			opts = append(opts, gateway.WithMode(pol.Mode))
		}
		// A peer with its own tracking hears first tokens as its front does
		// (Policy.BlindToUnstreamed); the gateway's own policies hear them
		// unless their fronts forward such requests unchanged
		// (Config.UpstreamStream off).
		gw.blind = gw.tracker == nil && !cfg.UpstreamStream || gw.tracker != nil && pol.BlindToUnstreamed
		if cfg.RouterSLO > 0 {
			opts = append(opts, gateway.WithSLOLatency(cfg.RouterSLO))
		}
		g, err := gateway.New(reps, opts...)
		if err != nil {
			return nil, fmt.Errorf("%w: policy %q: %w", ErrInvalidConfig, pol.Name, err)
		}
		gw.g = g
		if cfg.RateLimit.Rate.PerSecond > 0 {
			if gw.rate, err = flow.NewRateLimiter(cfg.RateLimit); err != nil {
				return nil, fmt.Errorf("%w: RateLimit: %w", ErrInvalidConfig, err)
			}
		}
	}
	e.res.Policy = pol.Name
	e.own = pol.Source == "" && !pol.GIEFlowControl
	e.sloRule.Unattainable = cfg.Unattainable
	switch {
	case pol.GIEFlowControl:
		e.front = frontGIE
	case pol.Source != "":
	case cfg.FlowControl.Enabled:
		e.front = frontFlow
	case admits(cfg.Admission):
		e.front = frontShed
	}
	if e.front == frontFlow || e.front == frontGIE {
		qc := cfg.FlowControl.Queue
		if e.front == frontGIE {
			qc = gieQueueConfig()
		}
		for i := range e.gws {
			q, err := flow.New[*seq](qc)
			if err != nil {
				return nil, fmt.Errorf("%w: policy %q: flow control: %w", ErrInvalidConfig, pol.Name, err)
			}
			e.gws[i].fq = q
		}
	}
	return e, nil
}

// run simulates the whole stream. tick is called after every arrival.
func (e *engine) run(st Stream, tick func()) error {
	var req Request
	have := false
	next := func() error {
		err := st.Next(&req)
		if err == io.EOF {
			have = false
			return nil
		}
		if err != nil {
			return err
		}
		have = true
		return nil
	}
	if err := next(); err != nil {
		return err
	}
	if have {
		e.push(int64(req.Arrival), event{rep: -1})
		if e.peerApart() {
			e.push(int64(req.Arrival), event{rep: evPeers})
		}
		e.speeds.init(e.cfg, int64(req.Arrival))
	}
	for {
		if e.stall != nil {
			return e.stall
		}
		if n := len(e.releases); n > 0 && (len(e.events) == 0 || e.releases[0].key <= e.events[0].key) && (!have || e.releases[0].key <= int64(req.Arrival)) {
			it := e.releases.pop()
			e.now = max(e.now, it.key)
			it.v()
			continue
		}
		if e.speedDue(have, int64(req.Arrival)) {
			continue
		}
		if have && (len(e.events) == 0 || int64(req.Arrival) < e.events[0].key) {
			e.now = max(e.now, int64(req.Arrival))
			e.arrive(&req)
			tick()
			if err := next(); err != nil {
				return err
			}
			continue
		}
		if len(e.events) == 0 {
			break
		}
		it := e.events.pop()
		ev := it.v
		e.now = it.key
		if ev.rep == evPeers {
			e.sharePeers()
			if have || e.inflight > 0 || e.queued > 0 {
				e.push(e.nextTick(e.cfg.PeerRefreshInterval, have, int64(req.Arrival)), event{rep: evPeers})
			}
			e.afterEvent()
			continue
		}
		if ev.rep < -1 {
			e.flowEvent(ev)
			continue
		}
		if ev.rep < 0 {
			e.refresh()
			if have || e.inflight > 0 || e.queued > 0 {
				e.push(e.nextTick(e.cfg.RefreshInterval, have, int64(req.Arrival)), event{rep: -1})
			}
			e.afterEvent()
			e.stallRun()
			continue
		}
		r := e.reps[ev.rep]
		if ev.ver != r.ver || !r.busy {
			continue
		}
		e.stepEnd(int(ev.rep))
		if e.freed {
			e.freed = false
			e.afterEvent()
		}
	}
	return nil
}

// nextTick returns when a periodic event due every d (a load refresh, a
// share of the peers' pending prefill) fires next: now+d or, while the
// cluster is idle until the next arrival (nothing in flight or held, no
// release timer, no replica stepping), its last tick at or before that
// arrival. The ticks skipped would each push the same idle load, so the
// run is the same; but a long gap between two arrivals (a trace's) costs
// no tick per interval.
func (e *engine) nextTick(d time.Duration, have bool, arrival int64) int64 {
	next := e.now + int64(d)
	if noSkip || !have || next >= arrival || !e.idle() {
		return next
	}
	return e.now + (arrival-e.now)/int64(d)*int64(d)
}

// idle reports whether nothing can happen before the next arrival but
// periodic ticks and speed changes: no request in flight or held, no
// release timer and no replica stepping.
func (e *engine) idle() bool {
	if e.inflight > 0 || e.queued > 0 || len(e.releases) > 0 {
		return false
	}
	for _, r := range e.reps {
		if r.busy {
			return false
		}
	}
	return true
}

// refresh pushes every replica's load, as scraped now, to every gateway,
// and with Config.SharePending the other gateways' pending prefill.
func (e *engine) refresh() {
	apart := e.peerApart()
	share := !apart && e.sharePending()
	if apart && len(e.lastLoad) != len(e.reps) {
		e.lastLoad = make([]gateway.Load, len(e.reps))
		e.peerShared = make([]int, len(e.reps)*len(e.gws))
	}
	for ri, r := range e.reps {
		l := gateway.Load{
			QueueDepth:    r.waiting.len(),
			Running:       r.running(),
			KVUtilization: min(1, float64(r.cache.used())/float64(e.cap)),
		}
		if apart {
			e.lastLoad[ri] = l
			e.lastLoad[ri].At = time.Unix(0, e.now) // its age, kept by the peers' pushes
		}
		rep, ok := e.lora.report(r)
		for i := range e.gws {
			switch {
			case share:
				l.PeerPrefill = e.peerPrefill(i, ri)
			case apart:
				l.PeerPrefill = e.peerShared[i*len(e.reps)+ri]
			}
			_ = e.gws[i].g.UpdateLoad(r.name, l)
			if ok {
				_ = e.gws[i].g.UpdateAdapters(r.name, rep)
			}
		}
	}
	e.scraped = e.now
	if e.front == frontGIE {
		e.gieSat = e.gieSaturation()
	}
	e.afterRefresh()
}

func (e *engine) newSeq() *seq {
	if n := len(e.pool); n > 0 {
		s := e.pool[n-1]
		e.pool = e.pool[:n-1]
		return s
	}
	return &seq{}
}

func (e *engine) arrive(req *Request) {
	e.res.Requests++
	if e.first < 0 {
		e.first = e.now
	}
	s := e.newSeq()
	e.nextID++
	s.id, s.arrival, s.in, s.out = e.nextID, e.now, req.InputTokens, max(1, req.OutputTokens)
	s.buf = keys.AppendHashes(keys.AppendHashes(s.buf[:0], req.Blocks), req.OutBlocks)
	s.key, s.outKey = s.buf[:len(req.Blocks)], s.buf[len(req.Blocks):]
	base := e.lora.arrive(s, req.Adapter)
	if cap(s.slots) < len(s.key) {
		s.slots = make([]int32, len(s.key), 2*len(s.key))
	}
	s.slots = s.slots[:len(s.key)]
	s.private = max(0, blocksOf(s.in+s.out, e.bt)-len(s.key), len(s.outKey))
	s.tenant, s.class, s.prio, s.slo = e.tenants.of(req.Tenant), e.classes.of(req.Class), req.Priority, int64(e.cfg.SLO)
	if req.SLO > 0 {
		s.slo = int64(req.SLO)
	}
	s.tpotSLO = int64(req.TPOTSLO)
	s.target = gateway.Target{Adapter: req.Adapter}
	if e.cfg.ObjectiveHeaders {
		// The client sends its objectives (x-slo-ttft-ms, x-slo-tpot-ms).
		s.target.TTFT, s.target.TPOT = req.SLO, req.TPOTSLO
	}
	e.group(s, func(g *groupAcc) { g.requests++; g.obj.on = g.obj.on || s.tpotSLO > 0 })
	gi := gatewayOf(e.cfg.Seed, s.id, len(e.gws))
	gw := &e.gws[gi]
	if gw.rate != nil {
		// The front's first check, before the body is read: the tenant
		// is the client (its header, or its address). A request that
		// fails below spends its tenant's rate as at the gateway.
		if ok, _ := gw.rate.Allow(gw.rate.Client(tenantHeader(req.Tenant), req.Tenant), time.Unix(0, e.now)); !ok {
			e.res.Dropped++
			e.res.RateLimited++
			e.group(s, func(g *groupAcc) { g.shed++ })
			e.pool = append(e.pool, s)
			return
		}
	}
	if len(s.key) == 0 || s.in < 1 || len(s.key)+s.private > e.cap {
		e.res.Failed++
		e.pool = append(e.pool, s)
		return
	}
	s.gw = gw
	if e.front == frontShed && gw.g.Saturated(gateway.Target{}, e.cfg.Admission) {
		e.shed(s, reasonSaturated)
		return
	}
	s.user = req.Blocks[min(max(req.UserBlock, 0), len(req.Blocks)-1)]
	if e.front == frontFlow || e.front == frontGIE {
		s.base = append(s.base[:0], base...) // base is scratch, reused by the next arrival
		e.hold(s, gi)
		return
	}
	e.dispatch(s, base)
}

// dispatch routes s and queues it at the replica chosen: at its arrival,
// or, under flow control, when its queue dispatches it. base is the
// unsalted key of an adapter's request, for a Tracker.
func (e *engine) dispatch(s *seq, base gateway.Key) {
	gw := s.gw
	if e.front == frontFlow || e.front == frontGIE {
		q := float64(e.now-s.arrival) / 1e9
		e.qtime.add(q)
		e.group(s, func(g *groupAcc) { g.queue.add(q) })
	}
	if gw.tracker != nil {
		gw.tracker.Arrive(reference.Arrival{
			ID: s.id, Time: time.Unix(0, e.now), Tokens: s.in, BlockTokens: e.bt,
			UserContent: s.user,
			BaseKey:     base,
		})
	}
	d, err := s.d, error(nil) // routed by flow control's bind (flowctl.go), or now
	s.d = gateway.Decision{}
	if d.Replica == "" {
		d, err = gw.g.RouteWith(s.key, s.target)
	}
	if err != nil {
		e.res.Failed++
		e.pool = append(e.pool, s)
		return
	}
	if e.own && e.sloRule.Refuse(fronts.SLO{TTFT: s.target.TTFT, TPOT: s.target.TPOT}, &d) {
		// The fronts' rule (--slo-unattainable reject): a 429, the
		// decision released.
		e.shed(s, fronts.CodeSLOUnattainable)
		return
	}
	ri := e.byNm[d.Replica]
	r := e.reps[ri]
	if e.cfg.MaxQueue > 0 && r.waiting.len() >= e.cfg.MaxQueue {
		d.Done(gateway.DoneInfo{Err: errShed})
		e.res.Dropped++
		e.group(s, func(g *groupAcc) { g.shed++ })
		e.pool = append(e.pool, s)
		return
	}
	s.d = d
	s.quiet = gw.blind && e.nonStreamed(s.id)
	s.routed = e.now
	if e.cfg.PredictedRelease && e.own {
		// The fronts' rule: a first token they cannot see releases the
		// request's pending prefill when the prefill is predicted over.
		// A peer's front has no such rule: it hears the first token it
		// cannot see at the end.
		fronts.ReleaseAtPrediction(d, !s.quiet, e.afterFunc)
	}
	r.requests++
	e.speeds.admitted(int(ri))
	// Counted only once admitted, like inTok, RouterTokenHitRate's
	// denominator: a shed request's prediction is not a hit.
	predicted := d.Matched
	if gw.pred != nil {
		predicted = gw.pred.Predicted()
	}
	e.routerTk += int64(min(predicted*e.bt, s.in-1))
	e.inflight++
	r.waiting.push(s)
	e.res.PeakQueue = max(e.res.PeakQueue, r.waiting.len())
	r.lora.queued(s)
	switch {
	case !r.busy:
		e.plan(int(ri))
	case r.stepK > 1 && r.running() < e.p.MaxRunning:
		h := r.waiting.front()
		if r.cache.fits(h.key, h.slots, r.cache.match(h.key, h.slots), h.private) {
			e.truncate(int(ri))
		}
	}
}

// nonStreamed reports whether request id's client does not stream
// (Config.NonStreamed): a draw from the seed and id alone, so that every
// policy's run has the same clients stream.
func (e *engine) nonStreamed(id uint64) bool {
	f := e.cfg.NonStreamed
	switch {
	case f <= 0:
		return false
	case f >= 1:
		return true
	}
	return float64(mix64(e.cfg.Seed^0xbb67ae8584caa73b, id)>>11)/(1<<53) < f
}

// macro returns the time in ns of the first k steps of r's decode run.
func (r *replica) macro(k int64) int64 {
	kf := float64(k)
	return max(1, int64(math.Round((kf*r.u+r.v*kf*(kf-1)/2)*1e9)))
}

// truncate ends r's decode run at the end of the step in progress, so that
// a waiting request is admitted there.
func (e *engine) truncate(ri int) {
	r := e.reps[ri]
	el := e.now - r.stepStart
	E := float64(el) / 1e9
	var j int64
	if r.v > 0 {
		a, b := r.v/2, r.u-r.v/2
		j = int64(math.Ceil((-b + math.Sqrt(b*b+4*a*E)) / (2 * a)))
	} else {
		j = int64(math.Ceil(E / r.u))
	}
	j = min(max(j, 1), r.stepK)
	for j > 1 && r.macro(j-1) >= el {
		j--
	}
	for j < r.stepK && r.macro(j) < el {
		j++
	}
	if j >= r.stepK {
		return
	}
	r.stepK = j
	r.ver++
	e.push(r.stepStart+r.macro(j), event{rep: int32(ri), ver: r.ver})
}

// plan admits waiting requests and starts r's next step, if it has work.
// Like vLLM's v1 scheduler, the step's token budget goes to the decoding
// sequences, then to the prefills already running, in admission order, and
// only what is left admits waiting requests: a request queued behind a
// long prefill waits for it, and then finds the blocks it computed cached.
func (e *engine) plan(ri int) {
	r := e.reps[ri]
	r.busy = false
	p := &e.p
	B := int64(len(r.decode))
	budget := p.MaxBatchTokens - int(B)
	r.nChunk = 0
	chunks := 0.0
	// take gives s the next chunk of the budget; r.prefill[:r.nChunk] run
	// a chunk this step.
	take := func(s *seq) {
		s.chunk = min(s.left, budget)
		chunks += p.prefillCost(s.pos, s.chunk)
		budget -= s.chunk
		r.nChunk++
	}
	for _, s := range r.prefill {
		if budget <= 0 {
			break
		}
		take(s)
		e.commitScheduled(r, s)
	}
	skipped := e.lora.skipped[:0]
	for budget > 0 && r.waiting.len() > 0 && r.running() < p.MaxRunning {
		s := r.waiting.front()
		if !e.lora.fits(r, s) { // every adapter slot is taken: skip it, as vLLM does
			skipped = append(skipped, e.lora.skip(r.waiting.pop(), e.now))
			continue
		}
		m := r.cache.match(s.key, s.slots)
		if !r.cache.fits(s.key, s.slots, m, s.private) {
			break
		}
		r.waiting.pop()
		chunks += e.lora.admit(r, s, e.now)
		r.cache.admit(s.key, s.slots, m, s.private) // its evictions are told of at the step's end
		s.committed, s.published = m, m
		cached := min(m*e.bt, s.in-1)
		s.pos, s.left = cached, s.in-cached
		e.inTok += int64(s.in)
		r.work += int64(s.in + s.out)
		e.cachedTk += int64(cached)
		if m > 0 {
			e.hitReqs++
		}
		r.prefill = append(r.prefill, s)
		take(s)
		e.commitScheduled(r, s)
	}
	e.lora.skipped = requeue(&r.waiting, skipped)
	C0 := float64(r.sumBase + B*r.step)
	fixed := p.StepOverhead + p.DecodePerSeq*float64(B) + p.DecodePerContextToken*C0
	switch {
	case len(r.prefill) > 0:
		cost := (fixed + chunks) / r.speed
		r.stepK = 1
		r.stepStart = e.now
		r.busy = true
		r.ver++
		e.push(e.now+max(1, int64(math.Round(cost*1e9))), event{rep: int32(ri), ver: r.ver})
	case B > 0:
		r.u, r.v = fixed/r.speed, p.DecodePerContextToken*float64(B)/r.speed
		r.stepK = r.decode[0].key - r.step
		if noMacro {
			r.stepK = 1
		}
		r.stepStart = e.now
		r.busy = true
		r.ver++
		e.push(e.now+r.macro(r.stepK), event{rep: int32(ri), ver: r.ver})
	default:
		e.stallReplica(ri)
	}
}

func (e *engine) stepEnd(ri int) {
	r := e.reps[ri]
	r.step += r.stepK
	if r.step > r.work {
		e.stallSteps(ri)
	}
	// The blocks the step's admissions evicted, told of with the step's
	// other KV events, after it ran, as vLLM v1 publishes them
	// (Scheduler.update_from_output).
	e.flushEvictions(r)
	if r.nChunk > 0 {
		keep := r.prefill[:0]
		for i, s := range r.prefill {
			if i < r.nChunk {
				s.left -= s.chunk
				s.pos += s.chunk
				r.prefillTokens += int64(s.chunk)
				s.chunk = 0
				if s.left == 0 {
					e.firstToken(r, s)
					continue
				}
				e.commitComputed(r, s)
			}
			keep = append(keep, s)
		}
		clear(r.prefill[len(keep):])
		r.prefill = keep
		r.nChunk = 0
	}
	for len(r.decode) > 0 && r.decode[0].key <= r.step {
		s := r.decode.pop().v
		r.sumBase -= s.ctxBase
		e.complete(r, s)
	}
	if checkInvariants {
		r.cache.check()
	}
	e.plan(ri)
}

// commitComputed caches the blocks of a prefill in progress that its
// chunks so far have filled, so that requests admitted later find them,
// and publishes them at the end of the step that computed them, as vLLM
// v1 publishes a step's KV events (Scheduler.update_from_output). With
// Config.CacheAtSchedule, commitScheduled has cached them already.
func (e *engine) commitComputed(r *replica, s *seq) {
	upto := min(len(s.key), s.pos/e.bt)
	e.commitUpTo(r, s, upto)
	if upto > s.published {
		s.published = upto
		e.event(r, gateway.BlocksStored, s.key[:upto])
	}
}

// commitScheduled, with Config.CacheAtSchedule, caches the full blocks s's
// chunk in this step will fill when the step is scheduled, as vLLM v1's
// KVCacheManager.allocate_slots does: a request admitted after s in the
// same step matches them. They are pinned by s (kvCache.commit) until it
// completes, so no eviction takes them before they are computed; the
// gateways hear of them at the step's end (commitComputed, firstToken).
func (e *engine) commitScheduled(r *replica, s *seq) {
	if !e.cfg.CacheAtSchedule {
		return
	}
	e.commitUpTo(r, s, min(len(s.key), (s.pos+s.chunk)/e.bt))
}

// commitUpTo caches s's leading upto blocks at r, those past s.committed,
// pinned by s until it completes.
func (e *engine) commitUpTo(r *replica, s *seq, upto int) {
	if upto > s.committed {
		r.cache.commit(s.key[:upto], s.slots, s.committed)
		s.committed = upto
	}
}

func (e *engine) firstToken(r *replica, s *seq) {
	s.ttft = e.now - s.arrival
	if !s.quiet {
		s.d.FirstToken() // a Tracker hears of it through the Decision
		// Its pending prefill is released: a replica closed by
		// Admission.PendingPrefill may have room (the fronts kick their
		// queue at a first token likewise).
		e.freed = e.freed || fronts.FirstTokenFreesRoom(e.cfg.Admission)
	}
	r.cache.commit(s.key, s.slots, s.committed)
	e.event(r, gateway.BlocksStored, s.key)
	t := float64(s.ttft) / 1e9
	e.ttft.add(t)
	met := s.ttft <= s.slo
	if met {
		e.sloMet++
	}
	e.group(s, func(g *groupAcc) {
		g.ttft.add(t)
		if met {
			g.met++
		}
	})
	if s.out <= 1 {
		e.complete(r, s)
		return
	}
	s.finish = r.step + int64(s.out) - 1
	s.ctxBase = int64(s.in) + 1 - r.step
	r.sumBase += s.ctxBase
	r.decode.push(s.finish, s.id, s)
}

func (e *engine) complete(r *replica, s *seq) {
	// Tell the index only of the answer blocks the replica really cached,
	// after the evictions release made.
	e.stored = r.cache.release(s.slots, s.private, s.outKey, e.stored[:0])
	e.flushEvictions(r)
	if len(e.stored) > 0 {
		e.event(r, gateway.BlocksStored, e.stored)
	}
	// What the front measures: from routing to the first token (if the
	// client streams) and to the end, and the answer's length; its
	// latency sample is from arrival to the answer's first byte, which
	// for a client that does not stream is its end.
	info := gateway.DoneInfo{Latency: time.Duration(s.ttft), Elapsed: time.Duration(e.now - s.routed), OutputTokens: s.out}
	if !s.quiet {
		info.TTFT = time.Duration(s.ttft - (s.routed - s.arrival))
	} else {
		info.Latency = time.Duration(e.now - s.arrival)
	}
	if s.quiet && s.gw.tracker != nil {
		// A blind peer's front sees the answer's first byte now.
		s.d.FirstToken()
	}

	s.d.Done(info) // and of this
	r.lora.done(s)
	e.objectives(s)
	s.d, s.gw = gateway.Decision{}, nil
	e.e2e.add(float64(e.now-s.arrival) / 1e9)
	e.res.Completed++
	e.group(s, func(g *groupAcc) { g.completed++ })
	e.freed = true
	e.outTok += int64(s.out)
	e.last = max(e.last, e.now)
	e.inflight--
	e.pool = append(e.pool, s)
}

func (e *engine) flushEvictions(r *replica) {
	if len(r.cache.evicted) == 0 {
		return
	}
	e.event(r, gateway.BlocksRemoved, r.cache.evicted)
	r.cache.evicted = r.cache.evicted[:0]
}

// event publishes a KV event of r's engine to every gateway: to its exact
// index and to its policy if it listens.
func (e *engine) event(r *replica, kind gateway.CacheEventKind, blocks gateway.Key) {
	ev := gateway.CacheEvent{Kind: kind, Blocks: blocks}
	for i := range e.gws {
		gw := &e.gws[i]
		if e.exact {
			_ = gw.g.ApplyEvent(r.name, ev)
		}
		if gw.kv != nil {
			gw.kv.KVEvent(r.name, ev)
		}
	}
}

// result finishes the run's figures.
func (e *engine) result() Result {
	res := e.res
	res.Dropped += e.inflight + e.queued // unreachable in a finished run; counted rather than lost
	if e.inTok > 0 {
		res.TokenHitRate = float64(e.cachedTk) / float64(e.inTok)
		res.RouterTokenHitRate = float64(e.routerTk) / float64(e.inTok)
	}
	if admitted := res.Completed; admitted > 0 {
		res.RequestHitRate = float64(e.hitReqs) / float64(admitted)
		res.SLOAttainment = float64(e.sloMet) / float64(res.Requests)
	}
	res.TTFT = latencyOf(&e.ttft)
	res.E2E = latencyOf(&e.e2e)
	if e.last > e.first && e.first >= 0 {
		res.Duration = float64(e.last-e.first) / 1e9
		res.Throughput = float64(e.outTok) / res.Duration
		res.RequestRate = float64(res.Completed) / res.Duration
		res.Goodput = float64(e.sloMet) / res.Duration
	}
	for _, r := range e.reps {
		res.PrefillTokens = append(res.PrefillTokens, r.prefillTokens)
		res.RequestsPerReplica = append(res.RequestsPerReplica, r.requests)
	}
	res.Share.RequestsMin, res.Share.RequestsMax = spread(res.RequestsPerReplica)
	res.Share.PrefillMin, res.Share.PrefillMax = spread(res.PrefillTokens)
	res.Imbalance = res.Share.PrefillMax
	res.Index = indexName(e.cfg.Index)
	switch {
	case e.gws[0].pred != nil:
		res.Index = "own"
	case e.exact:
		res.Index = "exact"
	}
	res.LoRA = e.lora.result(e.reps)
	res.Router = routerStats(e.gws)
	res.RouterReplicas = routerReplicas(e.gws)
	res.Decisions = res.Router.ByKind
	res.ttft = &e.ttft
	if e.front == frontFlow || e.front == frontGIE {
		q := latencyOf(&e.qtime)
		res.QueueTime = &q
	}
	res.front = e.front
	res.Tenants = e.tenants.result(res.Duration)
	res.Classes = e.classes.result(res.Duration)
	return res
}

func latencyOf(h *hist) Latency {
	return Latency{Mean: h.mean(), P50: h.quantile(0.5), P90: h.quantile(0.9), P99: h.quantile(0.99), Max: h.max}
}

// push schedules ev at time t, after the events already scheduled then.
func (e *engine) push(t int64, ev event) {
	e.evSeq++
	e.events.push(t, e.evSeq, ev)
}

// fifo is a ring-buffer queue of sequences.
type fifo struct {
	buf        []*seq
	head, size int
}

func (f *fifo) len() int { return f.size }

func (f *fifo) front() *seq { return f.buf[f.head] }

func (f *fifo) push(s *seq) {
	if f.size == len(f.buf) {
		nb := make([]*seq, max(16, 2*len(f.buf)))
		for i := range f.size {
			nb[i] = f.buf[(f.head+i)%len(f.buf)]
		}
		f.buf, f.head = nb, 0
	}
	f.buf[(f.head+f.size)%len(f.buf)] = s
	f.size++
}

func (f *fifo) pop() *seq {
	s := f.buf[f.head]
	f.buf[f.head] = nil
	f.head = (f.head + 1) % len(f.buf)
	f.size--
	return s
}

// afterFunc runs f after d on the simulated clock, as time.AfterFunc does
// for the fronts; its stop is never needed (a Decision's FirstToken does
// nothing once the request is done) and reports false.
func (e *engine) afterFunc(d time.Duration, f func()) func() bool {
	e.evSeq++
	e.releases.push(e.now+int64(d), e.evSeq, f)
	return func() bool { return false }
}

package gateway

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Gateway routes requests across a table of replicas with a Policy. Create
// one with New. All methods are safe for concurrent use.
type Gateway struct {
	policy Policy
	obs    Observer // policy, if it is one
	kind   Kind     // the kind of every decision, if fixed is set
	fixed  bool     // the policy ignores prefixes (RoundRobin, LoadAware)
	// summing: the policy is a *CacheAware, which is handed the
	// candidates as refreshed and so may take their summary (Request.sum)
	// instead of its own first pass; a policy wrapping one may change them.
	summing bool
	slo     time.Duration
	ttl     time.Duration
	index   indexMode
	clock   func() time.Time

	snap atomic.Pointer[table]

	mu     sync.Mutex // guards idx, the scratch below, and table changes
	idx    *index
	demand demand
	// demandAt is where the request being routed is counted in demand,
	// once its pick is valid (RouteWith).
	demandAt demandAt
	seq      uint64 // requests routed; stamps picked
	match    []int32
	picked   []uint64 // by replica slot: seq when last routed there, 0 if never
	// loraSet says the last Route filled the candidates' LoRA state,
	// which a route for the base model must clear.
	loraSet bool
	all     []Candidate // one per replica of built, refreshed per Route
	built   *table
	state   []uint8     // eligibility per replica of built, this Route
	cands   []Candidate // eligible subset of all, when not all are eligible
	owner   []*replicaState
	req     Request
	names   map[string]string // interned adapter names (intern)

	stats counters
	// speeds sums the replicas' known times per block and counts them
	// (speed.go, poolMean): the reference CacheAware prices speeds
	// against; growths sums their growths (speedload.go), which set
	// its placement horizon.
	speeds, growths atomic.Uint64
}

// table is an immutable snapshot of the replica set; changes publish a new
// one, so signal updates find replicas without taking the routing lock.
type table struct {
	list   []*replicaState
	byName map[string]*replicaState
}

// New returns a Gateway routing across replicas. It needs at least one
// replica, each with a distinct, non-empty name.
func New(replicas []Replica, opts ...Option) (*Gateway, error) {
	if len(replicas) == 0 {
		return nil, fmt.Errorf("%w: New needs at least one replica, got none", ErrInvalid)
	}
	c := settings{ttl: defaultLatencyTTL}
	for i, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: option %d of %d is nil", ErrInvalid, i+1, len(opts))
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	idx := newIndex()
	if c.secret != nil {
		idx = newIndexSecret(*c.secret)
	}
	g := &Gateway{
		policy: c.policy,
		slo:    c.slo,
		ttl:    c.ttl,
		index:  c.index,
		clock:  c.clock,
		idx:    idx,
	}
	if g.clock == nil {
		g.clock = time.Now
	}
	if g.policy == nil {
		switch c.mode {
		case ModeCacheAware:
			g.policy = &CacheAware{}
		case ModeLoadAware:
			g.policy = &LoadAware{}
		default:
			g.policy = &RoundRobin{}
		}
	}
	g.obs, _ = g.policy.(Observer)
	switch p := g.policy.(type) {
	case *CacheAware:
		if err := p.validate(); err != nil {
			return nil, err
		}
		g.summing = true
	case *RoundRobin:
		g.fixed, g.kind = true, KindRoundRobin
	case *LoadAware:
		if err := p.Weights.validate(); err != nil {
			return nil, err
		}
		g.fixed, g.kind = true, KindLoadAware
	}
	g.snap.Store(&table{byName: map[string]*replicaState{}})
	for _, r := range replicas {
		if err := g.AddReplica(r); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// AddReplica adds a replica to the table, healthy unless r.Unhealthy.
func (g *Gateway) AddReplica(r Replica) error {
	if r.Name == "" {
		return fmt.Errorf("%w: replica with an empty Name (address %q)", ErrInvalid, r.Address)
	}
	if r.CacheBlocks < 0 || r.CacheBlocks > MaxCacheBlocks {
		return fmt.Errorf("%w: replica %q: CacheBlocks %d, want 0..%d", ErrInvalid, r.Name, r.CacheBlocks, MaxCacheBlocks)
	}
	if r.CacheBlocks == 0 {
		r.CacheBlocks = defaultCacheBlocks
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	old := g.snap.Load()
	if _, ok := old.byName[r.Name]; ok {
		return fmt.Errorf("%w: duplicate replica %q", ErrInvalid, r.Name)
	}
	if len(old.list) >= MaxReplicas {
		return fmt.Errorf("%w: replica %q: gateway already has %d replicas, the most it holds", ErrInvalid, r.Name, MaxReplicas)
	}
	rs := &replicaState{name: r.Name, addr: r.Address, cacheBlocks: r.CacheBlocks, clock: g.clock, learner: &speedLearner{pool: &g.speeds, growths: &g.growths}}
	rs.healthy.Store(!r.Unhealthy)
	rs.slot = g.idx.addReplica(r.CacheBlocks)
	if n := len(g.idx.reps); n > len(g.match) {
		g.match = make([]int32, n)
		g.picked = append(g.picked, make([]uint64, n-len(g.picked))...)
	}
	g.picked[rs.slot] = 0
	t := &table{list: append(old.list[:len(old.list):len(old.list)], rs), byName: make(map[string]*replicaState, len(old.list)+1)}
	for _, x := range t.list {
		t.byName[x.name] = x
	}
	g.snap.Store(t)
	return nil
}

// RemoveReplica removes a replica and drops its cache index. Decisions
// already made for it stay valid: their Done still works. Removing the
// last replica is allowed (a pool may scale to zero, or a replica be
// replaced by removing it first); until one is added, Route returns an
// error wrapping ErrNoHealthyReplica.
func (g *Gateway) RemoveReplica(name string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	old := g.snap.Load()
	rs, ok := old.byName[name]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownReplica, name)
	}
	g.idx.removeReplica(rs.slot)
	rs.learner.leave()
	t := &table{list: make([]*replicaState, 0, len(old.list)-1), byName: make(map[string]*replicaState, len(old.list))}
	for _, x := range old.list {
		if x != rs {
			t.list = append(t.list, x)
			t.byName[x.name] = x
		}
	}
	g.snap.Store(t)
	return nil
}

func (g *Gateway) lookup(name string) (*replicaState, error) {
	rs, ok := g.snap.Load().byName[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownReplica, name)
	}
	return rs, nil
}

// SetHealthy marks a replica healthy or unhealthy. Unhealthy replicas are
// never chosen. A replica marked healthy again forgets its learned speed
// (speed.go): an engine back in rotation has often restarted.
func (g *Gateway) SetHealthy(name string, healthy bool) error {
	rs, err := g.lookup(name)
	if err != nil {
		return err
	}
	if !rs.healthy.Swap(healthy) && healthy {
		// Back in rotation (an engine readmitted, often restarted): its
		// learned speed no longer holds, and a replica priced as slow
		// would get no traffic to learn otherwise.
		rs.learner.forget(&rs.speed)
	}
	return nil
}

// UpdateLoad records the load signals a replica reports. Negative counts,
// a NaN or out-of-range KV utilisation, a negative latency and an At
// outside 1677–2262 (its Unix nanoseconds would overflow) are errors
// wrapping ErrInvalid, and change nothing.
func (g *Gateway) UpdateLoad(name string, l Load) error {
	if err := l.validate(name); err != nil {
		return err
	}
	rs, err := g.lookup(name)
	if err != nil {
		return err
	}
	rs.queue.Store(int32(l.QueueDepth))
	rs.running.Store(int32(l.Running))
	rs.kv.Store(math.Float64bits(l.KVUtilization))
	rs.peer.Store(int32(l.PeerPrefill))
	now := g.clock().UnixNano()
	if !l.At.IsZero() {
		now = min(now, l.At.UnixNano()) // never ahead of this gateway's clock
	}
	rs.loadAt.Store(now)
	if l.Latency > 0 {
		rs.latency.Store(int64(l.Latency))
		rs.latencyAt.Store(now)
	}
	return nil
}

// Replicas returns the status of every replica, in the order they were
// added.
func (g *Gateway) Replicas() []ReplicaStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	t := g.snap.Load()
	out := make([]ReplicaStatus, len(t.list))
	for i, rs := range t.list {
		out[i] = ReplicaStatus{
			Name:            rs.name,
			Address:         rs.addr,
			Healthy:         rs.healthy.Load(),
			Load:            rs.load(),
			InFlight:        int(rs.inflight.Load()),
			PendingPrefill:  int(rs.pending.Load()),
			AssignedPrefill: int(rs.assigned.Load()),
			Routed:          rs.routed.Load(),
			Hits:            rs.hits.Load(),
			CachedBlocks:    g.idx.cached(rs.slot),
			CacheBlocks:     rs.cacheBlocks,
		}
		out[i].BlockTime, out[i].TokenTime = unpack(rs.speed.Load())
		if a := rs.lora.rep.Load(); a != nil {
			out[i].Adapters = AdapterReport{Running: slices.Clone(a.Running), Waiting: slices.Clone(a.Waiting), MaxLoras: a.MaxLoras}
		}
	}
	return out
}

// breaches reports whether a replica's smoothed latency is over the SLO
// and recent enough to count.
func (g *Gateway) breaches(rs *replicaState, now int64) bool {
	lat := rs.latency.Load()
	if lat <= int64(g.slo) {
		return false
	}
	return g.ttl == 0 || now-rs.latencyAt.Load() < int64(g.ttl)
}

// Route chooses a replica for a request whose prefix is key: RouteWith
// with the zero Target.
func (g *Gateway) Route(key Key) (Decision, error) {
	return g.RouteWith(key, Target{})
}

// Target narrows a route. The zero value lets the policy choose among
// every healthy replica, for the base model.
type Target struct {
	// Adapter is the LoRA adapter the request targets; "" (the default)
	// is the base model. For an adapter the policy sees it
	// (Request.Adapter) and each replica's state for it (Candidate.LoRA),
	// and the gateway counts the request against the adapter on the chosen
	// replica until its Done. The key should be salted with it
	// (keys.Salt).
	Adapter string
	// Allow, when non-nil, leaves out every replica whose name it rejects,
	// as if it were unhealthy: a picker given a subset of endpoints by its
	// data plane stays within it, an adapter's request within the replicas
	// serving it. It is called once per replica under the gateway's lock,
	// so it must be quick and must not call the Gateway. nil accepts all.
	Allow func(name string) bool
	// Exclude leaves out the replica of that name: the one a retry
	// avoids, which the health checks may not have ejected yet. "" (the
	// default) excludes none.
	Exclude string
	// NoPrompt says the request has no prompt to match (an embeddings or
	// tokenize request, which the HTTP gateway passes through): its key
	// must be empty, and the replica is chosen by load alone, whatever
	// the policy: by the gateway's policy if it is a *LoadAware, else by
	// LoadAware's defaults. Such a request counts in flight (and so in
	// every later decision's load) until its Done, like any other, but
	// not in Stats, which describe prompts, nor in the index, and the
	// policy's Observer does not hear of it (no Pick placed it); its Done
	// teaches the replica no speed (speed.go), as it has no prefill or
	// decode to time. Default false: key must not be empty.
	NoPrompt bool
	// TTFT and TPOT are the request's latency objective: the time to
	// first token and per output token it asks for (llm-d's x-slo-ttft-ms
	// and x-slo-tpot-ms); 0, the default, sets none. See objective.go:
	// CacheAware routes to the cheapest replica predicted to meet the TTFT
	// objective; when the chosen replica is not predicted to meet both,
	// the request goes there best effort, with Decision.Fallback
	// FallbackSLO. A negative value is an error wrapping ErrInvalid.
	TTFT, TPOT time.Duration
}

// allows reports whether t admits replica name (health aside).
func (t *Target) allows(name string) bool {
	return (t.Allow == nil || t.Allow(name)) && (t.Exclude == "" || t.Exclude != name)
}

// eligible reports whether rs may be chosen within t: healthy and
// admitted (the rule Saturated, Spares and the P/D plan's queue check
// share; RouteWith adds the latency SLO).
func (t *Target) eligible(rs *replicaState) bool {
	return rs.healthy.Load() && t.allows(rs.name)
}

// narrowed reports whether t leaves any replica out.
func (t *Target) narrowed() bool { return t.Allow != nil || t.Exclude != "" }

// RouteWith chooses a replica for a request whose prefix is key, within
// t. It never chooses an unhealthy replica or one t leaves out, nor one
// over the latency SLO while an eligible one is within it; if every
// eligible replica breaches the SLO it chooses among them and the
// decision's Fallback says so. With no eligible replica (or none at all)
// it returns an error wrapping ErrNoHealthyReplica; an empty key is an
// error wrapping ErrInvalid unless t.NoPrompt, which wants one.
//
// On the approximate index (the default) the chosen replica is recorded as
// holding key.
// The caller should call the decision's Done when the request finishes.
// RouteWith does not allocate.
func (g *Gateway) RouteWith(key Key, tg Target) (Decision, error) {
	narrowed := tg.narrowed()
	if len(key) == 0 && !tg.NoPrompt {
		return Decision{}, fmt.Errorf("%w: Route needs a key of at least one block, got an empty Key", ErrInvalid)
	}
	if len(key) > 0 && tg.NoPrompt {
		return Decision{}, fmt.Errorf("%w: a Target with NoPrompt routes an empty Key, got a key of %d blocks", ErrInvalid, len(key))
	}
	obj := objective{tg.TTFT, tg.TPOT}
	if err := obj.validate(); err != nil {
		return Decision{}, err
	}
	var now int64
	if g.slo > 0 {
		now = g.clock().UnixNano()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	// The gateway keeps the adapter's name (in the request the policy
	// sees, the decision, the replica's counts): its interned copy, so that
	// the caller's Target, Allow closure included, does not escape.
	adapter := g.intern(tg.Adapter)
	t := g.snap.Load()
	if len(t.list) == 0 { // every replica was removed
		g.stats.noHealthy.Add(1)
		return Decision{}, fmt.Errorf("%w: the gateway has no replicas", ErrNoHealthyReplica)
	}
	mk := g.idx.mixKey(key)
	// The longest match of every replica in t.list (the index's active
	// slots are theirs).
	maxMatched := g.idx.match(mk, g.match)
	if g.built != t { // the replica set changed: rebuild the static fields
		g.all = g.all[:0]
		for _, rs := range t.list {
			g.all = append(g.all, Candidate{Name: rs.name, CacheBlocks: rs.cacheBlocks})
		}
		g.state = make([]uint8, len(t.list))
		g.built = t
	}
	// Refresh every replica's signals; when all are eligible (the usual
	// case) the policy sees g.all itself, else a compacted copy.
	healthy, excluded := 0, 0
	all, state := g.all[:len(t.list)], g.state[:len(t.list)]
	// sum summarises the candidates for the policy (Request.sum) when
	// every replica turns out to be one.
	sum := candSum{least: math.MaxInt, common: math.MaxInt}
	if !narrowed && g.slo <= 0 && adapter == "" && !g.loraSet {
		// The usual case, the other loop without its calls (which make
		// the compiler spill the loop's registers): eligible means
		// healthy, and no LoRA state to set or clear.
		sum.ok = g.summing
		for i, rs := range t.list {
			c := &all[i]
			c.Matched = int(g.match[rs.slot])
			rs.loadInto(&c.Load)
			c.InFlight = int(rs.inflight.Load())
			c.PendingPrefill = int(rs.pending.Load())
			c.AssignedPrefill = int(rs.assigned.Load())
			c.LastPicked = g.picked[rs.slot]
			c.BlockTime, c.TokenTime = unpack(rs.speed.Load())
			if sum.ok {
				sum.add(c, maxMatched)
			}
			if rs.healthy.Load() {
				state[i] = stateEligible
				healthy++
			} else {
				state[i] = stateUnhealthy
			}
		}
	} else {
		for i, rs := range t.list {
			c := &all[i]
			c.Matched = int(g.match[rs.slot])
			rs.loadInto(&c.Load)
			c.InFlight = int(rs.inflight.Load())
			c.PendingPrefill = int(rs.pending.Load())
			c.AssignedPrefill = int(rs.assigned.Load())
			c.LastPicked = g.picked[rs.slot]
			c.BlockTime, c.TokenTime = unpack(rs.speed.Load())
			if adapter != "" {
				c.LoRA = rs.lora.state(adapter)
			} else if g.loraSet {
				c.LoRA = LoRAState{}
			}
			switch {
			case !rs.healthy.Load() || (narrowed && !tg.allows(rs.name)):
				state[i] = stateUnhealthy
			case g.slo > 0 && g.breaches(rs, now):
				state[i] = stateOverSLO
				healthy++
				excluded++
			default:
				state[i] = stateEligible
				healthy++
			}
		}
	}
	g.loraSet = adapter != ""
	cands, owner := g.all, t.list
	var fb Fallback
	if healthy < len(t.list) || excluded > 0 {
		if healthy == 0 {
			g.stats.noHealthy.Add(1)
			switch {
			case narrowed && adapter != "":
				return Decision{}, fmt.Errorf("%w: none of the %d replicas is both healthy and allowed for adapter %q", ErrNoHealthyReplica, len(t.list), adapter)
			case narrowed:
				return Decision{}, fmt.Errorf("%w: none of the %d replicas is both healthy and allowed", ErrNoHealthyReplica, len(t.list))
			}
			return Decision{}, fmt.Errorf("%w: all %d replicas are unhealthy", ErrNoHealthyReplica, len(t.list))
		}
		slo := excluded < healthy // some healthy replica is within the SLO
		if !slo {
			fb = FallbackSLO
		}
		cands, owner = g.cands[:0], g.owner[:0]
		for i, rs := range t.list {
			if st := g.state[i]; st == stateUnhealthy || (st == stateOverSLO && slo) {
				continue
			}
			cands, owner = append(cands, g.all[i]), append(owner, rs)
		}
		g.cands, g.owner = cands, owner
		// The longest match among the candidates left, whom sum does not
		// summarise.
		sum.ok, maxMatched = false, 0
		for i := range cands {
			maxMatched = max(maxMatched, cands[i].Matched)
		}
	}
	ref := poolMean(g.speeds.Load())
	var pick int
	if tg.NoPrompt {
		pick = g.pickByLoad(cands)
	} else {
		var share float64
		share, g.demandAt = g.demand.peek(mk, maxMatched) // counted once the pick is valid
		g.req = Request{Key: key, MaxMatched: maxMatched, Demand: share, Adapter: adapter, Tie: g.seq, TTFT: tg.TTFT, TPOT: tg.TPOT, exact: g.index == indexExact, sum: sum, ref: ref, growths: g.growths.Load()}
		pick = g.policy.Pick(&g.req, cands)
		g.req.Key = nil
	}
	if pick < 0 || pick >= len(cands) {
		return Decision{}, fmt.Errorf("%w: policy %T chose candidate %d of %d", ErrInvalid, g.policy, pick, len(cands))
	}
	if !tg.NoPrompt {
		g.demand.count(g.demandAt)
	}
	rs := owner[pick]
	pc := &cands[pick]
	matched := pc.Matched
	// The chosen replica's predictions; an unknown time per block is the
	// mean of the gateway's known ones (ref).
	a := float64(pc.BlockTime)
	if a == 0 {
		a = ref
	}
	// every healthy replica breaches the latency SLO (fb's only reason
	// yet; the objective's below shares its flag)
	sloAll := fb&FallbackSLO != 0
	if obj.set() && !tg.NoPrompt {
		g.stats.objReq.Add(1)
		if !obj.meets(pc, len(key), a) {
			fb |= FallbackSLO
			g.stats.objBest.Add(1)
		}
	} else {
		obj = objective{}
	}
	kind := g.kind
	switch {
	case tg.NoPrompt:
		kind = KindLoadAware
	case !g.fixed:
		var why Fallback
		kind, why = classify(matched, maxMatched)
		fb |= why
	}
	if g.index == indexApproximate && !tg.NoPrompt {
		g.idx.storeMatched(rs.slot, mk, matched)
	}
	d := Decision{
		Replica:  rs.name,
		Address:  rs.addr,
		Kind:     kind,
		Hit:      matched == len(key) && !tg.NoPrompt,
		Matched:  matched,
		Blocks:   len(key),
		Fallback: fb,
		rs:       rs,
	}
	work := pc.work(len(key))
	d.PredictedTTFT = math.MaxInt64 // past the longest Duration
	if p := a * float64(work); p < math.MaxInt64 {
		d.PredictedTTFT = time.Duration(p)
	}
	d.PredictedTPOT = pc.TokenTime
	g.seq++
	g.picked[rs.slot] = g.seq
	rs.inflight.Add(1)
	if adapter != "" {
		rs.lora.route(adapter)
		d.adapter = adapter
	}
	rs.pending.Add(int64(len(key) - matched))
	rs.assigned.Add(int64(len(key) - matched))
	d.t, d.gen = newTicket()
	d.t.work, d.t.load, d.t.stats, d.t.obj = work, pc.Outstanding()+1, &g.stats, obj
	d.t.ttl = 0
	if g.slo > 0 {
		d.t.ttl = g.ttl
	}
	if tg.NoPrompt { // no Pick placed it: not the observer's
		d.t.work = -1 // no prefill or decode to time: teaches no speed
		return d, nil
	}
	if g.obs != nil {
		d.obs, d.id = g.obs, g.seq
		g.obs.Routed(d.id, rs.name)
	}
	rs.routed.Add(1)
	if d.Hit {
		rs.hits.Add(1)
	}
	g.stats.record(&d, excluded, sloAll)
	return d, nil
}

// pickByLoad chooses among cands for a request without a prompt
// (Target.NoPrompt): the least loaded, by the gateway's policy if it is a
// *LoadAware, else by LoadAware's default weights.
func (g *Gateway) pickByLoad(cands []Candidate) int {
	var w LoadWeights
	if la, ok := g.policy.(*LoadAware); ok {
		w = la.Weights
	}
	return leastLoaded(cands, w, g.seq)
}

// maxInterned bounds how many adapter names a gateway interns; past it a
// name is copied per request (an allocation) instead, as is a name longer
// than MaxAdapterName, whatever the count. At the bound, with
// names of MaxAdapterName bytes, the table holds 4.28 MiB
// (EXA_MEASURE=1 go test -run TestInternedNamesMemory -v .).
const maxInterned = 4096

// intern returns a copy of name that the gateway keeps: the same string
// for every request naming it, allocated once. g.mu must be held.
func (g *Gateway) intern(name string) string {
	if name == "" {
		return ""
	}
	if s, ok := g.names[name]; ok {
		return s
	}
	s := strings.Clone(name)
	if len(g.names) < maxInterned && len(s) <= MaxAdapterName {
		if g.names == nil {
			g.names = map[string]string{}
		}
		g.names[s] = s
	}
	return s
}

// classify labels the decision of a prefix-aware policy: affinity when the
// chosen replica holds the longest prefix any candidate holds, else load,
// because no candidate holds any (no match) or despite a longer match
// elsewhere (load guard).
func classify(matched, maxMatched int) (Kind, Fallback) {
	switch {
	case maxMatched == 0:
		return KindLoadAware, FallbackNoMatch
	case matched < maxMatched:
		return KindLoadAware, FallbackLoadGuard
	}
	return KindAffinity, 0
}

// Eligibility of a replica in one Route call.
const (
	stateEligible uint8 = iota
	stateOverSLO
	stateUnhealthy
)

// CacheEventKind is the kind of a CacheEvent.
type CacheEventKind int

// The kinds of cache event, after vLLM's KV events.
const (
	// BlocksStored: the replica cached Blocks, a chain from the root.
	BlocksStored CacheEventKind = iota
	// BlocksRemoved: the replica evicted Blocks.
	BlocksRemoved
	// AllCleared: the replica dropped its whole prefix cache.
	AllCleared
)

// CacheEvent reports a change in a replica's prefix cache.
type CacheEvent struct {
	// Kind says what happened; the zero value is BlocksStored.
	Kind CacheEventKind
	// Blocks are the block hashes concerned; unused for AllCleared.
	Blocks Key
}

// ApplyEvent updates the cache index with an event from a replica's engine.
// It works on either index; on the exact one (WithExactIndex) it is the
// only way the index changes.
func (g *Gateway) ApplyEvent(name string, ev CacheEvent) error {
	if ev.Kind < BlocksStored || ev.Kind > AllCleared {
		return fmt.Errorf("%w: replica %q: cache event kind %d", ErrInvalid, name, int(ev.Kind))
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	rs, ok := g.snap.Load().byName[name]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownReplica, name)
	}
	switch ev.Kind {
	case BlocksStored:
		g.idx.store(rs.slot, g.idx.mixKey(ev.Blocks))
	case BlocksRemoved:
		g.idx.remove(rs.slot, g.idx.mixKey(ev.Blocks))
	case AllCleared:
		g.idx.clear(rs.slot)
	}
	return nil
}

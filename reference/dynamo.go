package reference

import (
	"sync"

	"github.com/examlops/gateway"
)

// Dynamo is the KV router of NVIDIA Dynamo, followed from ai-dynamo/dynamo
// lib/llm/src/kv_router/scheduler.rs at db19bd2a (DefaultWorkerSelector,
// early 2026, Dynamo 1.0–1.1) and its active-sequence tracker
// (ActiveSequences in lib/llm/src/kv_router/sequence.rs of the same
// period):
//
//   - Overlap is the blocks of the prompt a worker holds according to the
//     router's indexer, which by default (use_kv_events true) is fed the
//     engines' KV events: an exact index. The simulator runs this policy
//     on the gateway's exact index, so Candidate.Matched is that overlap.
//   - The router tracks, per worker, the requests it sent there: their
//     prompt blocks, each counted once however many requests share it
//     (router_assume_kv_reuse), and, until their first token, their
//     uncached prompt tokens (active prefill tokens).
//   - A worker's cost is OverlapWeight · prefill blocks + decode blocks,
//     where prefill blocks are (the prompt's uncached tokens + the
//     worker's active prefill tokens) / block size, and decode blocks are
//     the worker's active blocks plus the prompt's blocks not among them.
//   - The lowest cost wins (router_temperature 0); ties go to the worker
//     whose indexer tree holds the fewest blocks, then at random.
//
// Output blocks are not tracked (router_track_output_blocks false), and
// the router queue (router_queue_threshold, on by default from March to
// July 2026, then off again) is not modelled. The tree sizes come from KV
// events (KVListener); the active sequences from Arrive, FirstToken and
// Done (Tracker). Main has since (May 2026, PR #9516) dropped the tree-size
// tie-break for random ties alone.
//
// The zero value uses Dynamo's defaults: overlap weight 1
// (KvRouterConfig::default) and a tie-break source seeded with 0. Safe for
// concurrent use.
type Dynamo struct {
	// OverlapWeight weighs prefill blocks against decode blocks; 0 means
	// 1 (--kv-overlap-score-weight).
	OverlapWeight float64
	// Seed seeds the random tie-breaks.
	Seed uint64

	mu      sync.Mutex
	rng     seeded
	ready   bool
	pend    pending
	workers map[string]*dynWorker
	reqs    map[uint64]*dynRequest
	placed  *dynRequest // the last Pick's request, until Routed
	ties    ties
	best    []int
}

// dynWorker is one worker's state as the router tracks it.
type dynWorker struct {
	unique       map[uint64]int32 // active blocks, with the requests holding each
	activeTokens int              // uncached prompt tokens of requests before their first token
	stored       map[uint64]struct{}
}

type dynRequest struct {
	w          *dynWorker
	blocks     []uint64
	prefill    int
	prefilling bool
}

// NewDynamo returns Dynamo's KV router with its defaults, drawing ties from
// seed.
func NewDynamo(seed uint64) *Dynamo { return &Dynamo{Seed: seed} }

var (
	_ gateway.Policy = (*Dynamo)(nil)
	_ Tracker        = (*Dynamo)(nil)
	_ KVListener     = (*Dynamo)(nil)
)

func (p *Dynamo) init() {
	if !p.ready {
		p.rng = newSeeded(p.Seed, 0xd1a)
		p.workers = map[string]*dynWorker{}
		p.reqs = map[uint64]*dynRequest{}
		p.ready = true
	}
}

func (p *Dynamo) worker(name string) *dynWorker {
	w := p.workers[name]
	if w == nil {
		w = &dynWorker{unique: map[uint64]int32{}, stored: map[uint64]struct{}{}}
		p.workers[name] = w
	}
	return w
}

// Arrive implements Tracker.
func (p *Dynamo) Arrive(a Arrival) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.init()
	p.pend = pending{a: a, set: true}
}

// FirstToken implements gateway.Observer: the request's prefill tokens
// stop counting (mark_prefill_completed).
func (p *Dynamo) FirstToken(id uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.init()
	if r := p.reqs[id]; r != nil && r.prefilling {
		r.w.activeTokens -= r.prefill
		r.prefilling = false
	}
}

// Done implements gateway.Observer: the request's blocks are freed.
func (p *Dynamo) Done(id uint64, _ gateway.DoneInfo) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.init()
	r := p.reqs[id]
	if r == nil {
		return
	}
	if r.prefilling {
		r.w.activeTokens -= r.prefill
	}
	for _, b := range r.blocks {
		if n := r.w.unique[b] - 1; n > 0 {
			r.w.unique[b] = n
		} else {
			delete(r.w.unique, b)
		}
	}
	delete(p.reqs, id)
}

// KVEvent implements KVListener: the indexer's per-worker tree, whose size
// breaks ties.
func (p *Dynamo) KVEvent(replica string, ev gateway.CacheEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.init()
	w := p.worker(replica)
	switch ev.Kind {
	case gateway.BlocksStored:
		for _, b := range ev.Blocks {
			w.stored[b] = struct{}{}
		}
	case gateway.BlocksRemoved:
		for _, b := range ev.Blocks {
			delete(w.stored, b)
		}
	case gateway.AllCleared:
		clear(w.stored)
	}
}

// Pick implements gateway.Policy.
func (p *Dynamo) Pick(req *gateway.Request, cands []gateway.Candidate) int {
	wt := p.OverlapWeight
	if wt == 0 {
		wt = 1
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.init()
	a := p.pend.take()
	bt := max(a.BlockTokens, 1)
	isl := a.Tokens
	if isl <= 0 {
		isl = len(req.Key) * bt
	}
	// The router hashes full blocks only.
	seq := req.Key[:min(len(req.Key), max(1, isl/bt))]
	p.best = p.best[:0]
	bestCost := 0.0
	for i := range cands {
		c := &cands[i]
		w := p.worker(c.Name)
		newTokens := max(0, isl-c.Matched*bt)
		prefill := float64(newTokens+w.activeTokens) / float64(bt)
		decode := len(w.unique)
		for _, b := range seq {
			if _, ok := w.unique[b]; !ok {
				decode++
			}
		}
		cost := wt*prefill + float64(decode)
		switch {
		case len(p.best) == 0 || cost < bestCost:
			p.best, bestCost = append(p.best[:0], i), cost
		case cost == bestCost:
			p.best = append(p.best, i)
		}
	}
	// Ties: the smallest indexer tree, then at random.
	p.ties.reset()
	smallest := -1
	for _, i := range p.best {
		n := len(p.worker(cands[i].Name).stored)
		switch {
		case smallest < 0 || n < smallest:
			p.ties.reset()
			p.ties.add(i)
			smallest = n
		case n == smallest:
			p.ties.add(i)
		}
	}
	best := p.ties.draw(p.rng)
	c := &cands[best]
	w := p.worker(c.Name)
	p.placed = nil
	if a.ID != 0 || a.Tokens > 0 {
		p.placed = &dynRequest{w: w, blocks: append([]uint64(nil), seq...), prefill: max(0, isl-c.Matched*bt), prefilling: true}
	}
	return best
}

// Routed implements gateway.Observer: the request the last Pick placed
// becomes active on its worker (add_request).
func (p *Dynamo) Routed(id uint64, _ string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.init()
	r := p.placed
	p.placed = nil
	if r == nil || p.reqs[id] != nil {
		return
	}
	p.reqs[id] = r
	r.w.activeTokens += r.prefill
	for _, b := range r.blocks {
		r.w.unique[b]++
	}
}

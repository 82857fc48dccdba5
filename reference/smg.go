package reference

import (
	"sync"
	"time"

	"github.com/examlops/gateway"
)

// SMG is the cache-aware policy of Shepherd Model Gateway, the maintained
// successor of SGLang's router, followed from lightseekorg/smg at
// 73da68ca (v1.9.0-48, Aug 2026), model_gateway/src/policies/cache_aware.rs
// (last changed at 9f2fd591, Jun 2026), kv_index's string_tree.rs and
// event_tree.rs, and the defaults of model_gateway/src/main.rs:
//
//   - Load is the router's own count of requests in flight per worker
//     (Worker::load, here Candidate.InFlight); each worker also counts the
//     requests the policy sent it (processed). The least loaded worker is
//     the smallest (load, processed, worker index): fewest in flight, then
//     fewest sent so far, then the earliest registered (the router's order,
//     which service discovery makes arbitrary: here an order drawn from the
//     seed, fixed for the run).
//   - When the largest load exceeds the smallest by more than BalanceAbs
//     and by a factor of more than BalanceRel, the request goes to the
//     least loaded worker, its prompt still inserted in the tree. (The KV
//     triggers, balance_token_usage_threshold and
//     overload_token_usage_threshold, are off by default, 1.0, and not
//     modelled.)
//   - HTTP workers (Events false): the request's longest match in the
//     approximate radix tree (every routed prompt, as SGLang's; a node's
//     tenant is its cached last tenant, else the first in the node's map)
//     decides: a match of more than CacheThreshold of the prompt goes to
//     that tenant, a lower one to the least loaded worker; the prompt is
//     inserted for the worker chosen. Every EvictionInterval each worker's
//     tree is cut to MaxTreeChars characters, least recently used first.
//   - gRPC workers with KV events (Events true, once the indexer holds any
//     block): the worker holding the longest prefix of the prompt by the
//     engines' events wins, ties to fewer in flight, then the smaller
//     indexer tree, then the last in the router's order (Rust's
//     max_by_key); no cache threshold. With no overlap anywhere, the least
//     loaded worker. The simulator runs this mode on the exact index, so
//     Candidate.Matched is the overlap.
//
// Sizes and matches are in blocks of the gateway's keys (see SGLang). The
// zero value uses the command-line defaults (main.rs: cache threshold 0.3,
// balance 64 and 1.5, eviction every 120 s to 2^26 characters), which a
// deployed smg runs with; CacheAwareConfig::default() (0.5, 32, 1.1, 30 s,
// 10,000) is the library's. Safe for concurrent use.
type SMG struct {
	// CacheThreshold is the match ratio a prompt needs, exceeded, to
	// follow the tree; 0 means 0.3.
	CacheThreshold float64
	// BalanceAbs is the absolute load spread beyond which the load is
	// imbalanced; 0 means 64.
	BalanceAbs int
	// BalanceRel is the relative load spread beyond which the load is
	// imbalanced; 0 means 1.5.
	BalanceRel float64
	// EvictionInterval is the period of tree eviction; 0 means 120 s.
	EvictionInterval time.Duration
	// MaxTreeChars is each worker's tree size after eviction, in
	// characters; 0 means 2^26.
	MaxTreeChars int
	// Events selects the event-driven mode (gRPC workers publishing KV
	// events); false is the HTTP mode's approximate tree.
	Events bool
	// Seed seeds the router's worker order and the tree's tenant order.
	Seed uint64

	mu        sync.Mutex
	ready     bool
	tree      SGLang // the approximate tree and its paths, with minLoad set
	processed map[string]uint64
	order     map[string]uint64 // the router's worker order
	regRng    seeded
	stored    map[string]map[uint64]struct{} // events: each worker's indexed blocks
	blocks    int                            // events: indexed blocks in all
	predicted int
}

// NewSMG returns SMG's cache-aware policy with its command-line defaults,
// in HTTP mode, or in event-driven mode when events is true, drawing from
// seed.
func NewSMG(seed uint64, events bool) *SMG { return &SMG{Seed: seed, Events: events} }

var (
	_ gateway.Policy = (*SMG)(nil)
	_ Tracker        = (*SMG)(nil)
	_ KVListener     = (*SMG)(nil)
	_ Predictor      = (*SMG)(nil)
)

func (p *SMG) init() {
	if p.ready {
		return
	}
	p.tree = SGLang{
		CacheThreshold:   orF(p.CacheThreshold, sglangCLIThreshold),
		BalanceAbs:       orI(p.BalanceAbs, sglangCLIBalanceAbs),
		BalanceRel:       orF(p.BalanceRel, sglangCLIBalanceRel),
		EvictionInterval: p.EvictionInterval,
		MaxTreeChars:     orI(p.MaxTreeChars, sglangCLIMaxTreeChars),
		Seed:             p.Seed,
		minLoad:          p.minLoad,
	}
	if p.tree.EvictionInterval == 0 {
		p.tree.EvictionInterval = sglangCLIEviction
	}
	p.processed = map[string]uint64{}
	p.order = map[string]uint64{}
	p.regRng = newSeeded(p.Seed, 0x5a6)
	p.stored = map[string]map[uint64]struct{}{}
	p.ready = true
}

func orF(v, d float64) float64 {
	if v == 0 {
		return d
	}
	return v
}

func orI(v, d int) int {
	if v == 0 {
		return d
	}
	return v
}

// rank returns name's place in the router's worker order.
func (p *SMG) rank(name string) uint64 {
	r, ok := p.order[name]
	if !ok {
		r = p.regRng.rng.Uint64()
		p.order[name] = r
	}
	return r
}

// minLoad returns the candidate with the smallest (load, processed,
// worker index). p.mu must be held.
func (p *SMG) minLoad(cands []gateway.Candidate) int {
	best := 0
	for i := 1; i < len(cands); i++ {
		a, b := &cands[i], &cands[best]
		switch {
		case a.InFlight != b.InFlight:
			if a.InFlight < b.InFlight {
				best = i
			}
		case p.processed[a.Name] != p.processed[b.Name]:
			if p.processed[a.Name] < p.processed[b.Name] {
				best = i
			}
		case p.rank(a.Name) < p.rank(b.Name):
			best = i
		}
	}
	return best
}

// Arrive implements Tracker; it also runs the tree's eviction cycles due
// by then.
func (p *SMG) Arrive(a Arrival) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.init()
	p.tree.Arrive(a)
}

// FirstToken implements gateway.Observer; SMG's cache-aware policy does not use it.
func (p *SMG) FirstToken(uint64) {}

// Done implements gateway.Observer; the load is the gateway's in-flight count.
func (p *SMG) Done(uint64, gateway.DoneInfo) {}

// Routed implements gateway.Observer; the request is the last Pick's.
func (p *SMG) Routed(uint64, string) {}

// Predicted implements Predictor: the blocks the tree (HTTP mode) or the
// event indexer (event-driven mode) matched on the chosen worker.
func (p *SMG) Predicted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.predicted
}

// KVEvent implements KVListener: in event-driven mode, the indexer whose
// per-worker size breaks ties; HTTP mode ignores events.
func (p *SMG) KVEvent(replica string, ev gateway.CacheEvent) {
	if !p.Events {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.init()
	w := p.stored[replica]
	if w == nil {
		w = map[uint64]struct{}{}
		p.stored[replica] = w
	}
	n := len(w)
	switch ev.Kind {
	case gateway.BlocksStored:
		for _, b := range ev.Blocks {
			w[b] = struct{}{}
		}
	case gateway.BlocksRemoved:
		for _, b := range ev.Blocks {
			delete(w, b)
		}
	case gateway.AllCleared:
		clear(w)
	}
	p.blocks += len(w) - n
}

// Pick implements gateway.Policy.
func (p *SMG) Pick(req *gateway.Request, cands []gateway.Candidate) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.init()
	var pick int
	if p.Events && p.blocks > 0 {
		pick = p.pickEvents(req, cands)
	} else {
		// HTTP mode, or an indexer still empty (has_event_indexer false):
		// the approximate tree.
		pick = p.tree.Pick(req, cands)
		p.predicted = p.tree.Predicted()
	}
	p.processed[cands[pick].Name]++
	return pick
}

// pickEvents is select_worker with an event indexer: the imbalance check,
// then score_overlap, then the least loaded worker.
func (p *SMG) pickEvents(req *gateway.Request, cands []gateway.Candidate) int {
	t := &p.tree
	t.mu.Lock()
	defer t.mu.Unlock()
	t.init()
	a := t.pend.take()
	mn, mx := cands[0].InFlight, cands[0].InFlight
	for i := range cands {
		mn, mx = min(mn, cands[i].InFlight), max(mx, cands[i].InFlight)
	}
	if mx-mn > t.BalanceAbs && float32(mx) > float32(mn)*float32(t.BalanceRel) {
		// select_worker_min_load inserts the prompt in the token tree.
		pick := p.minLoad(cands)
		bt := max(a.BlockTokens, 1)
		tokens := a.Tokens
		if tokens <= 0 {
			tokens = len(req.Key) * bt
		}
		key := req.Key
		if len(a.BaseKey) > 0 {
			key = a.BaseKey
		}
		t.tree.insert(key, tokens, bt, t.tree.tenant(cands[pick].Name), a.Time.UnixNano())
		p.predicted = cands[pick].Matched
		return pick
	}
	best := -1
	for i := range cands {
		c := &cands[i]
		if c.Matched == 0 {
			continue
		}
		if best < 0 || p.overlapAtLeast(c, &cands[best]) {
			best = i
		}
	}
	if best < 0 {
		best = p.minLoad(cands)
	}
	p.predicted = cands[best].Matched
	return best
}

// overlapAtLeast reports whether a's key (overlap, −load, −tree size,
// worker index) is at least b's: max_by_key keeps the last maximum in the
// router's order.
func (p *SMG) overlapAtLeast(a, b *gateway.Candidate) bool {
	switch {
	case a.Matched != b.Matched:
		return a.Matched > b.Matched
	case a.InFlight != b.InFlight:
		return a.InFlight < b.InFlight
	}
	if sa, sb := len(p.stored[a.Name]), len(p.stored[b.Name]); sa != sb {
		return sa < sb
	}
	return p.rank(a.Name) > p.rank(b.Name)
}

package reference

import (
	"sync"
	"time"

	"github.com/examlops/gateway"
)

// SGLangMiss is what SGLang's cache-aware policy does on a low prefix
// match (a cache miss).
type SGLangMiss int

// The miss paths SGLang's router has had.
const (
	// MissMinLoadRandom sends a miss to a replica with the fewest requests
	// in flight, drawn at random among equals: sgl-project/sglang PR
	// #33138 (merged 2026-07-31, fixing issue #32983), current behaviour.
	MissMinLoadRandom SGLangMiss = iota
	// MissMinLoadFirst sends it to the first replica with the fewest
	// requests in flight: PR #14650 (merged 2025-12-08) until #33138.
	MissMinLoadFirst
	// MissSmallestTree sends it to the replica whose approximate tree
	// holds the fewest characters (Tree::get_smallest_tenant): the
	// original behaviour, until PR #14650.
	MissSmallestTree
)

// SGLang is the cache-aware policy of SGLang's router (sgl-router, now
// sgl-model-gateway), followed from sgl-project/sglang
// sgl-model-gateway/src/policies/cache_aware.rs at b93974f1 and tree.rs at
// 24ce7f6c, with the miss path of PR #33138:
//
//   - Load is the router's own count of requests in flight per worker
//     (Worker::load, here Candidate.InFlight). When the largest load
//     exceeds the smallest by more than BalanceAbs and by a factor of more
//     than BalanceRel, the request goes to the first worker with the
//     smallest load (min_by_key: ties go to the earliest registered,
//     see firstWith), and its text is still inserted in the tree.
//   - Otherwise the request's longest match in the approximate radix tree
//     (all workers' prompts, inserted as they are routed) decides: a match
//     of more than CacheThreshold of the prompt goes to a worker holding
//     the match (prefix_match: the first tenant in the node's map, an
//     arbitrary but fixed order); a lower match takes the Miss path.
//     Either way prefix_match stamps that worker's last access on the
//     matched path.
//   - Every EvictionInterval, each worker's tree is cut, least recently
//     used leaves first, to MaxTreeChars characters (evict_tenant_by_size).
//
// The tree here holds the blocks of the gateway's keys rather than
// characters; sizes are counted in tokens and compared with MaxTreeChars
// at 4 characters a token (GIE's averageCharactersPerToken), and match
// rates are matched tokens over prompt tokens. It needs Arrive (Tracker)
// for the prompt's length and the time; FirstToken and Done are not used
// (the gateway's in-flight count is the load).
//
// The zero value uses CacheAwareConfig::default() (sgl-model-gateway
// src/policies/mod.rs): CacheThreshold 0.5, BalanceAbs 32, BalanceRel 1.1,
// EvictionInterval 30 s, MaxTreeChars 10,000; the router's command line
// (src/main.rs) defaults instead to 0.3, 64, 1.5, 120 s and 2^26
// characters (NewSGLangCLI). Random draws come from Seed. Safe for
// concurrent use.
type SGLang struct {
	// CacheThreshold is the match ratio a prompt needs, exceeded, to
	// follow the tree; 0 means 0.5.
	CacheThreshold float64
	// BalanceAbs is the absolute load spread beyond which the load is
	// imbalanced; 0 means 32.
	BalanceAbs int
	// BalanceRel is the relative load spread beyond which the load is
	// imbalanced; 0 means 1.1.
	BalanceRel float64
	// EvictionInterval is the period of tree eviction; 0 means 30 s.
	EvictionInterval time.Duration
	// MaxTreeChars is each worker's tree size after eviction, in
	// characters; 0 means 10,000.
	MaxTreeChars int
	// Miss is what a low match does; the zero value is MissMinLoadRandom.
	Miss SGLangMiss
	// Seed seeds the random tie-breaks and the tree's tenant order.
	Seed uint64

	mu        sync.Mutex
	tree      *sgTree
	rng       seeded
	regRng    seeded
	reg       map[string]uint64 // registration order
	pend      pending
	nextEvict int64
	predicted int
	ties      ties
	// minLoad, when set (SMG), replaces both the imbalance path and the
	// miss path: the candidate it returns takes the request.
	minLoad func(cands []gateway.Candidate) int
}

// SGLang's command-line defaults (sgl-model-gateway src/main.rs).
const (
	sglangCLIThreshold    = 0.3
	sglangCLIBalanceAbs   = 64
	sglangCLIBalanceRel   = 1.5
	sglangCLIEviction     = 120 * time.Second
	sglangCLIMaxTreeChars = 1 << 26
	charsPerToken         = 4
)

// NewSGLang returns SGLang's policy with its library defaults, drawing
// from seed.
func NewSGLang(seed uint64) *SGLang { return &SGLang{Seed: seed} }

// NewSGLangCLI returns SGLang's policy with its command-line defaults
// (cache threshold 0.3, balance 64 and 1.5, eviction every 120 s to 2^26
// characters), drawing from seed.
func NewSGLangCLI(seed uint64) *SGLang {
	return &SGLang{CacheThreshold: sglangCLIThreshold, BalanceAbs: sglangCLIBalanceAbs, BalanceRel: sglangCLIBalanceRel,
		EvictionInterval: sglangCLIEviction, MaxTreeChars: sglangCLIMaxTreeChars, Seed: seed}
}

var (
	_ gateway.Policy = (*SGLang)(nil)
	_ Tracker        = (*SGLang)(nil)
	_ Predictor      = (*SGLang)(nil)
)

// Arrive implements Tracker; it also runs the eviction cycles due by then.
func (p *SGLang) Arrive(a Arrival) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.init()
	p.pend = pending{a: a, set: true}
	now := a.Time.UnixNano()
	if p.nextEvict == 0 {
		p.nextEvict = now + int64(p.interval())
	}
	if now >= p.nextEvict {
		// The eviction thread sleeps an interval, then evicts; cycles
		// with no insertion in between change nothing, so one suffices.
		p.tree.evict(int64(p.maxChars() / charsPerToken))
		for p.nextEvict <= now {
			p.nextEvict += int64(p.interval())
		}
	}
}

// FirstToken implements gateway.Observer; SGLang's router does not use it.
func (p *SGLang) FirstToken(uint64) {}

// Done implements gateway.Observer; the load is the gateway's in-flight count.
func (p *SGLang) Done(uint64, gateway.DoneInfo) {}

// Routed implements gateway.Observer; the request is the last Pick's.
func (p *SGLang) Routed(uint64, string) {}

// Predicted implements Predictor.
func (p *SGLang) Predicted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.predicted
}

func (p *SGLang) init() {
	if p.tree == nil {
		p.rng = newSeeded(p.Seed, 0x5917)
		p.tree = newSGTree(newSeeded(p.Seed, 0x7ee))
		p.reg = map[string]uint64{}
		p.regRng = newSeeded(p.Seed, 0x4e9)
	}
}

func (p *SGLang) interval() time.Duration {
	if p.EvictionInterval > 0 {
		return p.EvictionInterval
	}
	return 30 * time.Second
}

func (p *SGLang) maxChars() int {
	if p.MaxTreeChars > 0 {
		return p.MaxTreeChars
	}
	return 10000
}

// Pick implements gateway.Policy.
func (p *SGLang) Pick(req *gateway.Request, cands []gateway.Candidate) int {
	thr, abs, rel := p.CacheThreshold, p.BalanceAbs, p.BalanceRel
	if thr == 0 {
		thr = 0.5
	}
	if abs == 0 {
		abs = 32
	}
	if rel == 0 {
		rel = 1.1
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.init()
	a := p.pend.take()
	now := a.Time.UnixNano()
	bt := max(a.BlockTokens, 1)
	tokens := a.Tokens
	if tokens <= 0 {
		tokens = len(req.Key) * bt
	}
	// The router matches the prompt's text in one tree per worker model
	// (cache_aware.rs: trees keyed by the worker's model_id), blind to a
	// LoRA adapter the request names: the same prompt under two adapters
	// is one path. Match the unsalted key then.
	key := req.Key
	if len(a.BaseKey) > 0 {
		key = a.BaseKey
	}
	mn, mx := cands[0].InFlight, cands[0].InFlight
	for i := range cands {
		mn, mx = min(mn, cands[i].InFlight), max(mx, cands[i].InFlight)
	}
	var pick int
	m, node := p.tree.match(key)
	switch {
	case mx-mn > abs && float32(mx) > float32(mn)*float32(rel):
		if p.minLoad != nil {
			pick = p.minLoad(cands)
			break
		}
		pick = p.firstWith(cands, mn)
	default:
		matched := min(m*bt, tokens)
		if m == len(key) {
			matched = tokens
		}
		// prefix_match stamps the tenant it returns on the matched path
		// whatever the match rate, a miss's included.
		tn := p.tree.pickTenant(node)
		if p.minLoad != nil {
			tn = p.tree.cachedTenant(node) // SMG
		}
		if tn >= 0 {
			p.tree.touch(node, tn, now)
		}
		if float32(matched)/float32(tokens) > float32(thr) {
			if i := p.indexOf(cands, tn); i >= 0 {
				pick = i
				break
			}
		}
		if p.minLoad != nil {
			pick = p.minLoad(cands)
			break
		}
		pick = p.miss(cands, mn)
	}
	t := p.tree.tenant(cands[pick].Name)
	p.predicted = p.held(key, t)
	p.tree.insert(key, tokens, bt, t, now)
	return pick
}

// miss returns the candidate a low match goes to.
func (p *SGLang) miss(cands []gateway.Candidate, mn int) int {
	switch p.Miss {
	case MissSmallestTree:
		return p.tree.smallest(cands)
	case MissMinLoadFirst:
		return p.firstWith(cands, mn)
	}
	p.ties.reset()
	for i := range cands {
		if cands[i].InFlight == mn {
			p.ties.add(i)
		}
	}
	return p.ties.draw(p.rng)
}

// firstWith returns the first candidate, in the router's worker order,
// with load mn (min_by_key returns the first minimum). The router lists a
// model's workers in the order they registered, which service discovery
// makes arbitrary: here an order drawn from the seed, fixed for the run,
// so that ties favour the same worker throughout, as they do in SGLang,
// but not by the simulator's replica numbering.
func (p *SGLang) firstWith(cands []gateway.Candidate, mn int) int {
	best := -1
	for i := range cands {
		if cands[i].InFlight != mn {
			continue
		}
		r, ok := p.reg[cands[i].Name]
		if !ok {
			r = p.regRng.rng.Uint64()
			p.reg[cands[i].Name] = r
		}
		if best < 0 || r < p.reg[cands[best].Name] {
			best = i
		}
	}
	return best
}

// indexOf returns the candidate holding tenant slot t, or -1.
func (p *SGLang) indexOf(cands []gateway.Candidate, t int32) int {
	if t < 0 {
		return -1
	}
	for i := range cands {
		if s, ok := p.tree.slot[cands[i].Name]; ok && s == t {
			return i
		}
	}
	return -1
}

// held returns how many leading blocks of key the tree records for tenant
// t: what the router expects the chosen worker to hold.
func (p *SGLang) held(key gateway.Key, t int32) int {
	n := &p.tree.root
	for i, h := range key {
		c := p.tree.nodes[h]
		if c == nil || c.parent != n || c.holder(t) == nil {
			return i
		}
		n = c
	}
	return len(key)
}

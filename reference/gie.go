package reference

import (
	"sync"

	"github.com/examlops/gateway"
)

// GIE is the default scheduler of the Kubernetes Gateway API Inference
// Extension's endpoint picker (EPP), followed from
// kubernetes-sigs/gateway-api-inference-extension at 1748e829 (2026-06-16,
// the last commit before the EPP moved to llm-d/llm-d-inference-scheduler):
//
//   - pkg/epp/config/loader/defaults.go: one profile scoring with the
//     queue-scorer (weight 2), kv-cache-utilization-scorer (2) and
//     prefix-cache-scorer (3), then the max-score-picker.
//   - queue score (scorer/queuedepth/queue.go): (maxQ − q)/(maxQ − minQ)
//     over the candidates' waiting queues (vLLM num_requests_waiting,
//     here Load.QueueDepth), 1 for all when they are equal.
//   - kv score (scorer/kvcacheutilization): 1 − KV-cache usage
//     (Load.KVUtilization).
//   - prefix score (scorer/prefix): matched blocks / total blocks of the
//     prompt, from the approximate index of
//     requestcontrol/dataproducer/approximateprefix: the prompt is cut in
//     blocks and only its first maxPrefixBlocksToMatch (256) are hashed;
//     after each decision the chosen server is recorded as holding them
//     (PreRequest), in a per-server LRU. With autoTune (the default) and
//     a vLLM engine, the block size and the LRU's capacity are the
//     engine's (vllm:cache_config_info); 31,250 blocks of 16 tokens is
//     the fallback when the engine does not report them.
//   - max-score picker: shuffles, then takes the highest score, so ties
//     go at random.
//   - the metrics (queue, KV usage) are scraped every 50 ms, the
//     simulator's default refresh interval.
//
// Real vLLM blocks are 16 tokens, so the 256-block window covers the
// prompt's first 4,096 tokens (MaxPrefixTokens); the index's capacity is
// the engine's KV cache (Candidate.CacheBlocks) unless LRUTokens sets it.
// Its matches come from its own index, not the gateway's. It needs Arrive
// (Tracker) for the prompt's length; random draws come from Seed.
//
// The zero value uses those defaults. Safe for concurrent use.
type GIE struct {
	// QueueWeight weighs the queue score; 0 means 2.
	QueueWeight float64
	// KVWeight weighs the KV-cache score; 0 means 2.
	KVWeight float64
	// PrefixWeight weighs the prefix score; 0 means 3.
	PrefixWeight float64
	// MaxPrefixTokens is the prompt prefix hashed and matched, in tokens;
	// 0 means 4,096 (256 blocks of vLLM's 16 tokens).
	MaxPrefixTokens int
	// LRUTokens is each server's index capacity in tokens; 0 means the
	// engine's KV capacity (autoTune), 500,000 being the 31,250 blocks of
	// 16 tokens used without it.
	LRUTokens int
	// LoRAWeight, when positive, adds GIE's lora-affinity-scorer to the
	// profile with this weight (see gie_lora.go); 0, the default profile,
	// leaves it out.
	LoRAWeight float64
	// Seed seeds the random tie-breaks.
	Seed uint64

	mu        sync.Mutex
	idx       *gieIndex
	rng       seeded
	pend      pending
	predicted int
	ties      ties
}

// GIE defaults (pkg/epp/config/loader/defaults.go, approximateprefix/types.go).
const (
	gieQueueWeight     = 2
	gieKVWeight        = 2
	giePrefixWeight    = 3
	gieMaxPrefixTokens = 256 * 16
	gieFallbackLRU     = 31250 * 16
)

// NewGIE returns GIE's default scheduler, drawing ties from seed.
func NewGIE(seed uint64) *GIE { return &GIE{Seed: seed} }

var (
	_ gateway.Policy = (*GIE)(nil)
	_ Tracker        = (*GIE)(nil)
	_ Predictor      = (*GIE)(nil)
)

func (p *GIE) init() {
	if p.idx == nil {
		p.idx = newGIEIndex()
		p.rng = newSeeded(p.Seed, 0x61e)
	}
}

// Arrive implements Tracker.
func (p *GIE) Arrive(a Arrival) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.init()
	p.pend = pending{a: a, set: true}
}

// FirstToken implements gateway.Observer; the EPP does not use it.
func (p *GIE) FirstToken(uint64) {}

// Done implements gateway.Observer; the EPP does not use it.
func (p *GIE) Done(uint64, gateway.DoneInfo) {}

// Routed implements gateway.Observer; the request is the last Pick's.
func (p *GIE) Routed(uint64, string) {}

// Predicted implements Predictor: blocks of the hashed window matched.
func (p *GIE) Predicted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.predicted
}

// Pick implements gateway.Policy.
func (p *GIE) Pick(req *gateway.Request, cands []gateway.Candidate) int {
	wq, wkv, wp := def64(p.QueueWeight, gieQueueWeight), def64(p.KVWeight, gieKVWeight), def64(p.PrefixWeight, giePrefixWeight)
	window := p.MaxPrefixTokens
	if window <= 0 {
		window = gieMaxPrefixTokens
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.init()
	a := p.pend.take()
	bt := max(a.BlockTokens, 1)
	hashes := req.Key[:min(len(req.Key), max(1, (window+bt-1)/bt))]
	for i := range cands {
		p.idx.server(cands[i].Name, gieCapacity(p.LRUTokens, cands[i].CacheBlocks, bt))
	}
	p.idx.match(hashes)
	var lora func(i int) float64
	if p.LoRAWeight > 0 {
		lora = func(i int) float64 { return p.LoRAWeight * gieLoRAScore(req.Adapter, &cands[i].LoRA) }
	}
	best := maxScore(cands, func(i int) float64 {
		return prefixScore(p.idx.count[p.idx.slot[cands[i].Name]], len(hashes))
	}, lora, wq, wkv, wp, &p.ties, p.rng)
	s := p.idx.slot[cands[best].Name]
	p.predicted = p.idx.count[s]
	p.idx.add(hashes, s)
	return best
}

// maxScore scores candidates as GIE's default profile does, plus extra's
// weighted score when extra is not nil, and returns the best, drawing ties
// with r.
func maxScore(cands []gateway.Candidate, prefix, extra func(i int) float64, wq, wkv, wp float64, t *ties, r seeded) int {
	minQ, maxQ := cands[0].Load.QueueDepth, cands[0].Load.QueueDepth
	for i := range cands {
		minQ, maxQ = min(minQ, cands[i].Load.QueueDepth), max(maxQ, cands[i].Load.QueueDepth)
	}
	t.reset()
	best := 0.0
	for i := range cands {
		c := &cands[i]
		q := 1.0
		if maxQ != minQ {
			q = float64(maxQ-c.Load.QueueDepth) / float64(maxQ-minQ)
		}
		s := wq*q + wkv*(1-c.Load.KVUtilization) + wp*prefix(i)
		if extra != nil {
			s += extra(i)
		}
		switch {
		case t.n() == 0 || s > best:
			t.reset()
			t.add(i)
			best = s
		case s == best:
			t.add(i)
		}
	}
	return t.draw(r)
}

// gieCapacity is a server's index capacity in blocks of bt tokens:
// lruTokens when set, else the engine's cacheBlocks (autoTune), else the
// indexer's default of 31,250 blocks of 16 tokens (approximateprefix
// makeserver).
func gieCapacity(lruTokens, cacheBlocks, bt int) int {
	switch {
	case lruTokens > 0:
		return lruTokens / bt
	case cacheBlocks > 0:
		return cacheBlocks
	}
	return gieFallbackLRU / bt
}

// prefixScore is matched blocks over total, clipped to 0..1, and 0 for a
// prompt of no blocks (TotalBlocks 0 in GIE's prefix scorer, totalBlocks
// 0 in llm-d's precise one) rather than NaN.
func prefixScore(matched, total int) float64 {
	if total <= 0 {
		return 0
	}
	return min(1, float64(matched)/float64(total))
}

func def64(v, d float64) float64 {
	if v == 0 {
		return d
	}
	return v
}

// LLMDPrecise is llm-d's precise prefix-cache scheduling: GIE's default
// profile (queue 2, KV cache 2, prefix 3, max-score picker with random
// ties) with the prefix score taken from an exact index of the engines'
// KV events, as llm-d-inference-scheduler's precise-prefix-cache-scorer
// (pkg/epp/framework/plugins/scheduling/scorer/preciseprefixcache at
// 520af478, 2026-05-17) computes it: longest cached prefix in blocks over
// the prompt's blocks, clipped to 0..1, with no 256-block window. The
// simulator runs it on the gateway's exact index, so Candidate.Matched is
// that prefix. llm-d's sample configuration
// (deploy/config/epp-precise-prefix-cache-config.yaml) weighs prefix 2,
// KV 1, queue 1; the weights are fields.
//
// The zero value uses those defaults. Safe for concurrent use.
type LLMDPrecise struct {
	// QueueWeight weighs the queue score; 0 means 2.
	QueueWeight float64
	// KVWeight weighs the KV-cache score; 0 means 2.
	KVWeight float64
	// PrefixWeight weighs the prefix score; 0 means 3.
	PrefixWeight float64
	// Seed seeds the random tie-breaks.
	Seed uint64

	mu    sync.Mutex
	rng   seeded
	ready bool
	ties  ties
}

// NewLLMDPrecise returns llm-d's precise scheduler, drawing ties from seed.
func NewLLMDPrecise(seed uint64) *LLMDPrecise { return &LLMDPrecise{Seed: seed} }

var _ gateway.Policy = (*LLMDPrecise)(nil)

// Pick implements gateway.Policy.
func (p *LLMDPrecise) Pick(req *gateway.Request, cands []gateway.Candidate) int {
	wq, wkv, wp := def64(p.QueueWeight, gieQueueWeight), def64(p.KVWeight, gieKVWeight), def64(p.PrefixWeight, giePrefixWeight)
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.ready {
		p.rng = newSeeded(p.Seed, 0x11d)
		p.ready = true
	}
	best := maxScore(cands, func(i int) float64 { return prefixScore(cands[i].Matched, len(req.Key)) }, nil, wq, wkv, wp, &p.ties, p.rng)
	return best
}

package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/keys"
)

// LoRA adapters in the simulated engines, after vLLM's v1 scheduler
// (vllm/v1/core/sched/scheduler.py, at 00024d31): the adapters of the
// running requests hold the replica's Config.MaxLoras slots; a waiting
// request whose adapter is not among them while all slots are held is
// skipped, and put back at the head of the queue once the step is
// scheduled, so later requests of running adapters pass it (it waits
// until some adapter's last request finishes). A step that admits a
// request whose adapter is not in a slot loads it first, evicting the
// least recently used adapter no running request needs, which adds
// Config.AdapterLoad to the step: vLLM activates the step's adapters
// before running it (set_active_adapters), and with its default
// max_cpu_loras (= max_loras) an adapter evicted from the GPU is no longer
// in the CPU cache either, so it is read again from disk.
//
// Requests name adapters (Request.Adapter); their blocks are salted with
// it (keys.Salt), in the engine's cache and the router's key alike,
// and the gateway is told of it (gateway.Target.Adapter) and fed each
// replica's vllm:lora_requests_info (gateway.UpdateAdapters) at every
// load refresh.

// Defaults of the adapter model (Config.MaxLoras, Config.AdapterLoad).
const (
	// DefaultMaxLoras is vLLM's --max-loras default: one adapter slot.
	DefaultMaxLoras = 1
	// DefaultAdapterLoad is 30 ms: a rank-16 adapter on every linear
	// layer of Llama 3.1 8B holds 32 layers × 1.31M parameters in BF16,
	// 84 MB, read from an NVMe disk at about 3 GB/s (28 ms), then copied
	// to the GPU (2–3 ms over PCIe at 25–50 GB/s).
	DefaultAdapterLoad = 30 * time.Millisecond
)

// loraSim is one run's adapter bookkeeping: adapter names by id (0 is the
// base model), the model's parameters and the run's figures.
type loraSim struct {
	max     int
	load    float64 // seconds added to a step per adapter loaded
	ids     map[string]int32
	names   []string
	skipped []*seq      // scratch for plan
	base    gateway.Key // scratch: the unsalted key for trackers

	waits    int64 // requests that waited for a slot
	waitSum  float64
	requests int64 // requests naming an adapter
}

// loraReplica is one replica's adapter slots and counts.
type loraReplica struct {
	slots   []int32 // adapters loaded, most recently used first
	running []int32 // running requests per adapter id
	waiting []int32 // waiting requests per adapter id
	ever    []bool  // adapters ever loaded, by id
	active  int     // adapters with running requests
	loads   int64
}

func (l *loraSim) init(cfg *Config) {
	l.max = cfg.MaxLoras
	l.load = cfg.AdapterLoad.Seconds()
	l.ids = map[string]int32{}
	l.names = []string{""}
}

// id returns the adapter's id, allocating one for a new name.
func (l *loraSim) id(name string) int32 {
	if name == "" {
		return 0
	}
	if id, ok := l.ids[name]; ok {
		return id
	}
	id := int32(len(l.names))
	l.ids[name] = id
	l.names = append(l.names, name)
	return id
}

// arrive sets s's adapter and salts its blocks; it returns the unsalted
// prompt key (valid until the next arrival) for routers that key on the
// prompt alone, nil for the base model.
func (l *loraSim) arrive(s *seq, adapter string) gateway.Key {
	s.adapter, s.skipped = l.id(adapter), -1
	if adapter == "" {
		return nil
	}
	l.requests++
	l.base = append(l.base[:0], s.key...)
	keys.Salt(s.buf, adapter)
	return l.base
}

// count returns c[id], growing c as needed.
func count(c *[]int32, id int32) *int32 {
	for int(id) >= len(*c) {
		*c = append(*c, 0)
	}
	return &(*c)[id]
}

// queued counts a request put in the waiting queue.
func (r *loraReplica) queued(s *seq) {
	if s.adapter != 0 {
		*count(&r.waiting, s.adapter)++
	}
}

// fits reports whether s may be scheduled on r now: the base model, an
// adapter with running requests, or fewer running adapters than slots.
func (l *loraSim) fits(r *replica, s *seq) bool {
	return s.adapter == 0 || *count(&r.lora.running, s.adapter) > 0 || r.lora.active < l.max
}

// skip notes that s waits for a slot, from now if it had not yet.
func (l *loraSim) skip(s *seq, now int64) *seq {
	if s.skipped < 0 {
		s.skipped = now
	}
	return s
}

// admit counts s as running and loads its adapter if no slot holds it,
// returning the seconds the load adds to the step.
func (l *loraSim) admit(r *replica, s *seq, now int64) float64 {
	if s.adapter == 0 {
		return 0
	}
	lr := &r.lora
	*count(&lr.waiting, s.adapter)--
	if s.skipped >= 0 {
		l.waits++
		l.waitSum += float64(now-s.skipped) / 1e9
	}
	run := count(&lr.running, s.adapter)
	*run++
	if *run == 1 {
		lr.active++
	}
	if i := slices.Index(lr.slots, s.adapter); i >= 0 {
		copy(lr.slots[1:i+1], lr.slots[:i])
		lr.slots[0] = s.adapter
		return 0
	}
	// Load it: into a free slot, else over the least recently used
	// adapter without running requests (one exists: fits said a slot is
	// free among the running adapters).
	if len(lr.slots) >= l.max {
		for i := len(lr.slots) - 1; i >= 0; i-- {
			if a := lr.slots[i]; a == s.adapter || *count(&lr.running, a) == 0 {
				lr.slots = slices.Delete(lr.slots, i, i+1)
				break
			}
		}
	}
	lr.slots = slices.Insert(lr.slots, 0, s.adapter)
	lr.loads++
	for int(s.adapter) >= len(lr.ever) {
		lr.ever = append(lr.ever, false)
	}
	lr.ever[s.adapter] = true
	return l.load
}

// done counts s finished.
func (r *loraReplica) done(s *seq) {
	if s.adapter == 0 {
		return
	}
	if run := count(&r.running, s.adapter); *run > 0 {
		*run--
		if *run == 0 {
			r.active--
		}
	}
}

// requeue puts the skipped requests back at the head of the queue, in
// their order, and returns the emptied scratch slice.
func requeue(f *fifo, skipped []*seq) []*seq {
	for i := len(skipped) - 1; i >= 0; i-- {
		f.pushFront(skipped[i])
	}
	clear(skipped)
	return skipped[:0]
}

// pushFront puts s at the head of the queue.
func (f *fifo) pushFront(s *seq) {
	if f.size == len(f.buf) {
		f.push(s) // grows; then rotate s to the head
		f.pop2back()
		return
	}
	f.head = (f.head - 1 + len(f.buf)) % len(f.buf)
	f.buf[f.head] = s
	f.size++
}

// pop2back moves the last element to the head.
func (f *fifo) pop2back() {
	last := (f.head + f.size - 1) % len(f.buf)
	s := f.buf[last]
	f.buf[last] = nil
	f.size--
	f.head = (f.head - 1 + len(f.buf)) % len(f.buf)
	f.buf[f.head] = s
	f.size++
}

// report returns r's adapter state as a scrape of its
// vllm:lora_requests_info would, once any request named an adapter (ok
// false before).
func (l *loraSim) report(r *replica) (rep gateway.AdapterReport, ok bool) {
	if l.requests == 0 {
		return rep, false
	}
	rep.MaxLoras = l.max
	for id, n := range r.lora.running {
		if n > 0 {
			rep.Running = append(rep.Running, l.names[id])
		}
	}
	for id, n := range r.lora.waiting {
		if n > 0 {
			rep.Waiting = append(rep.Waiting, l.names[id])
		}
	}
	return rep, true
}

// LoRAResult is a policy's adapter figures, in Result.LoRA.
type LoRAResult struct {
	// Requests counts the requests that named an adapter.
	Requests int64 `json:"requests"`
	// Loads counts adapter loads into a slot, over all replicas.
	Loads int64 `json:"loads"`
	// SlotWaits counts the requests that waited for a slot (skipped at
	// least once while every slot was held by other adapters).
	SlotWaits int64 `json:"slot_waits"`
	// SlotWaitMean is their mean wait, in seconds, from the first skip
	// to admission.
	SlotWaitMean float64 `json:"slot_wait_mean_s"`
	// AdaptersPerReplica is the mean number of distinct adapters each
	// replica loaded at least once.
	AdaptersPerReplica float64 `json:"adapters_per_replica"`
	// Handling is Policy.Adapters: what the policy makes of adapters.
	Handling string `json:"handling,omitempty"`
}

// writeLoRATable writes the adapter figures of the results that have
// them, under a header naming the adapter model.
func (r *Report) writeLoRATable(b *strings.Builder) {
	any := false
	for _, x := range r.Results {
		any = any || x.LoRA != nil
	}
	if !any {
		return
	}
	fmt.Fprintf(b, "\nadapters: %d slot(s) per replica (max_loras), %s per adapter load\n", r.MaxLoras, sec(r.AdapterLoad))
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "policy\tloads\tper 100 req\twaited for a slot\twait mean\tadapters/replica\thandles adapters")
	for _, x := range r.Results {
		if l := x.LoRA; l != nil {
			fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.1f%%\t%s\t%.1f\t%s\n", x.Policy, l.Loads, 100*float64(l.Loads)/float64(max(l.Requests, 1)),
				100*float64(l.SlotWaits)/float64(max(l.Requests, 1)), sec(l.SlotWaitMean), l.AdaptersPerReplica, l.Handling)
		}
	}
	_ = tw.Flush()
}

// result returns the run's adapter figures, nil when no request named an
// adapter.
func (l *loraSim) result(reps []*replica) *LoRAResult {
	if l.requests == 0 {
		return nil
	}
	out := &LoRAResult{Requests: l.requests, SlotWaits: l.waits}
	if l.waits > 0 {
		out.SlotWaitMean = l.waitSum / float64(l.waits)
	}
	seen := 0
	for _, r := range reps {
		out.Loads += r.lora.loads
		for _, b := range r.lora.ever {
			if b {
				seen++
			}
		}
	}
	out.AdaptersPerReplica = float64(seen) / float64(len(reps))
	return out
}

// LoRAConfig configures LoRAWorkload. Zero fields take the defaults given.
type LoRAConfig struct {
	// Requests in all; default 10,000.
	Requests int
	// Rate of Poisson arrivals per second; default 24.
	Rate float64
	// Adapters is the number of LoRA adapters K, each request naming one
	// drawn by Zipf popularity; default 8.
	Adapters int
	// Zipf is the exponent of adapter popularity (rank k drawn with
	// probability ∝ 1/k^Zipf), above 1; default 1.1.
	Zipf float64
	// BaseShare is the fraction of requests, 0..1, for the base model
	// instead; default 0.
	BaseShare float64
	// Prompts is the number of system prompts, shared by every adapter
	// (the same text under two adapters is two caches); default 16.
	Prompts int
	// SystemTokens per system prompt; default 1,024.
	SystemTokens int
	// QuestionTokens per request, distinct for every request; default 256.
	QuestionTokens int
	// OutputTokens per request; default 128.
	OutputTokens int
	// BlockTokens per KV block; default 16, vLLM's.
	BlockTokens int
}

// AdapterName is the name of adapter k (0-based) of LoRAWorkload.
func AdapterName(k int) string { return "lora-" + strconv.Itoa(k) }

// LoRAWorkload returns requests for K LoRA adapters over one base model:
// each names adapter k with Zipf probability (or the base model, a share
// BaseShare of them), opens with one of Prompts shared system prompts
// drawn uniformly, and ends with a question of its own.
func LoRAWorkload(c LoRAConfig) (Workload, error) {
	c.Requests = orDefault(c.Requests, 10000)
	c.Rate = orDefault(c.Rate, 24)
	c.Adapters = orDefault(c.Adapters, 8)
	c.Zipf = orDefault(c.Zipf, 1.1)
	c.Prompts = orDefault(c.Prompts, 16)
	c.SystemTokens = orDefault(c.SystemTokens, 1024)
	c.QuestionTokens = orDefault(c.QuestionTokens, 256)
	c.OutputTokens = orDefault(c.OutputTokens, 128)
	c.BlockTokens = orDefault(c.BlockTokens, 16)
	if err := checkGen("lora", c.Requests, c.Rate, "Adapters", c.Adapters, "Prompts", c.Prompts, "SystemTokens", c.SystemTokens,
		"QuestionTokens", c.QuestionTokens, "OutputTokens", c.OutputTokens, "BlockTokens", c.BlockTokens); err != nil {
		return nil, err
	}
	switch {
	case c.Adapters > MaxAdapters:
		return nil, fmt.Errorf("%w: lora: Adapters %d, at most %d", ErrInvalidConfig, c.Adapters, MaxAdapters)
	case !(c.Zipf > 1) || c.Zipf > 100:
		return nil, fmt.Errorf("%w: lora: Zipf %v must be above 1 (and at most 100)", ErrInvalidConfig, c.Zipf)
	case !(c.BaseShare >= 0 && c.BaseShare <= 1):
		return nil, fmt.Errorf("%w: lora: BaseShare %v must be within 0..1", ErrInvalidConfig, c.BaseShare)
	case c.SystemTokens+c.QuestionTokens < 1:
		return nil, fmt.Errorf("%w: lora: SystemTokens + QuestionTokens must be at least 1", ErrInvalidConfig)
	}
	return &loraWorkload{c}, nil
}

// MaxAdapters is the most adapters LoRAWorkload draws from.
const MaxAdapters = 1 << 16

type loraWorkload struct{ c LoRAConfig }

func (w *loraWorkload) Name() string {
	c := w.c
	base := ""
	if c.BaseShare > 0 {
		base = fmt.Sprintf(" (%.0f%% base model)", 100*c.BaseShare)
	}
	return fmt.Sprintf("lora: %d requests, Poisson %g/s, %d adapters (Zipf %g)%s, %d shared %d-token system prompts + %d-token question, %d-token output",
		c.Requests, c.Rate, c.Adapters, c.Zipf, base, c.Prompts, c.SystemTokens, c.QuestionTokens, c.OutputTokens)
}
func (w *loraWorkload) BlockTokens() int { return w.c.BlockTokens }

func (w *loraWorkload) Open(seed uint64) (Stream, error) {
	c := w.c
	rng := newRand(seed, 7)
	var zipf *rand.Zipf
	if c.Adapters > 1 {
		zipf = rand.NewZipf(rng, c.Zipf, 1, uint64(c.Adapters-1))
	}
	names := make([]string, c.Adapters)
	for k := range names {
		names[k] = AdapterName(k)
	}
	var b blockBuilder
	return newGenStream("lora", c.Requests, c.Rate, rng, func(r *Request, q uint64) {
		k := uint64(0)
		if zipf != nil {
			k = zipf.Uint64()
		}
		r.Adapter = names[k]
		if c.BaseShare > 0 && rng.Float64() < c.BaseShare {
			r.Adapter = ""
		}
		b.reset(c.BlockTokens, r.Blocks)
		b.add(content(spaceSystem, 5000+uint64(rng.IntN(c.Prompts))), c.SystemTokens)
		b.add(content(spaceQuestion, q), c.QuestionTokens)
		r.Blocks, r.OutBlocks = b.finish(), r.OutBlocks[:0]
		r.InputTokens, r.OutputTokens = c.SystemTokens+c.QuestionTokens, c.OutputTokens
		r.UserBlock = c.SystemTokens / c.BlockTokens
	}), nil
}

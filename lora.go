package gateway

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// LoRA adapters. An engine such as vLLM serves many fine-tuned adapters
// over one base model, but runs at most MaxLoras of them in a batch (its
// adapter slots): a request whose adapter is not in a slot waits until one
// frees (vLLM's v1 scheduler skips it while MaxLoras other adapters are
// scheduled: vllm/v1/core/sched/scheduler.py), then pays for loading it.
// And the engine's KV blocks are keyed by adapter: the same prompt under
// two adapters is two caches.
//
// So a request for an adapter is routed with RouteWith, Target.Adapter
// naming it, its Key salted with keys.Salt (or, on the exact index, keyed
// from the adapter's root as the engines' events are), and each replica's
// adapter state is fed with UpdateAdapters from its engine's
// vllm:lora_requests_info. Policies see the request's adapter
// (Request.Adapter) and each replica's state for it (Candidate.LoRA);
// CacheAware prices it.

// Limits of an AdapterReport; a larger report is a broken one.
const (
	// MaxAdapterSlots is the largest AdapterReport.MaxLoras accepted.
	MaxAdapterSlots = 1 << 16
	// MaxReportedAdapters is the most names each of Running and Waiting
	// may hold.
	MaxReportedAdapters = 4096
	// MaxAdapterName is the longest adapter name accepted, in bytes.
	MaxAdapterName = 1024
)

// AdapterReport is a replica's LoRA adapter state as its engine reports
// it: vLLM's vllm:lora_requests_info gauge, whose labels list the adapters
// of running and waiting requests and the number of adapter slots. The
// zero value reports nothing (an engine without adapters, or one not
// scraped yet).
type AdapterReport struct {
	// Running lists the adapters with requests in the running batch, each
	// holding a slot.
	Running []string
	// Waiting lists the adapters with requests waiting to be scheduled;
	// those not also running wait for a slot.
	Waiting []string
	// MaxLoras is the number of adapter slots (vLLM's --max-loras); 0 when
	// not reported.
	MaxLoras int
}

// active returns how many distinct adapters hold or wait for a slot: those
// running or waiting.
func (a *AdapterReport) active() int {
	n := len(a.Running)
	for _, w := range a.Waiting {
		if !slices.Contains(a.Running, w) {
			n++
		}
	}
	return n
}

// validate checks a report's limits.
func (a *AdapterReport) validate(name string) error {
	if a.MaxLoras < 0 || a.MaxLoras > MaxAdapterSlots {
		return fmt.Errorf("%w: replica %q: MaxLoras %d is outside 0..%d", ErrInvalid, name, a.MaxLoras, MaxAdapterSlots)
	}
	for _, l := range []struct {
		field string
		names []string
	}{{"Running", a.Running}, {"Waiting", a.Waiting}} {
		if len(l.names) > MaxReportedAdapters {
			return fmt.Errorf("%w: replica %q: %s lists %d adapters, at most %d", ErrInvalid, name, l.field, len(l.names), MaxReportedAdapters)
		}
		for _, n := range l.names {
			if n == "" || len(n) > MaxAdapterName {
				return fmt.Errorf("%w: replica %q: %s adapter name %.40q: want 1..%d bytes", ErrInvalid, name, l.field, n, MaxAdapterName)
			}
		}
	}
	return nil
}

// normalized returns a copy with both lists sorted and free of duplicates.
func (a *AdapterReport) normalized() *AdapterReport {
	out := &AdapterReport{MaxLoras: a.MaxLoras}
	out.Running = slices.Compact(slices.Sorted(slices.Values(a.Running)))
	out.Waiting = slices.Compact(slices.Sorted(slices.Values(a.Waiting)))
	return out
}

func sortedHas(list []string, s string) bool {
	_, ok := slices.BinarySearch(list, s)
	return ok
}

// LoRAState is a replica's adapter state as it concerns the request being
// routed (Candidate.LoRA): the engine's last report merged with what this
// gateway routed there since. It is the zero value for a request of the
// base model.
type LoRAState struct {
	// Running and Waiting say whether the engine's last report lists the
	// request's adapter as running there, and as waiting there.
	Running, Waiting bool
	// Routed counts the requests for the adapter that this gateway routed
	// there and that are not done: fresher than the report, but blind to
	// other gateways' traffic.
	Routed int
	// Loaded says the adapter is probably in one of the replica's slots:
	// reported running, routed there and not done, or among the last
	// MaxLoras adapters (one if unknown, 64 at most) routed there or
	// reported running, which an engine's least-recently-used slots still
	// hold.
	Loaded bool
	// Active counts the distinct adapters holding or waiting for a slot
	// there: those the report lists as running or waiting, and those with
	// requests this gateway routed there that are not done.
	Active int
	// MaxLoras is the replica's number of adapter slots; 0 when its
	// engine has not reported it.
	MaxLoras int
	// Empty counts the replica's slots that no adapter has used, as far
	// as the gateway knows: MaxLoras less the adapters holding, waiting
	// for or last using a slot there (the most of Active and the
	// adapters last routed there or reported running), and 0 when that
	// is negative or MaxLoras unknown. Taking an empty slot evicts no
	// adapter.
	Empty int
	// Report is the engine's last report, its lists sorted; nil before
	// the first. It is shared: read it, never modify it.
	Report *AdapterReport
}

// inBatch reports whether the adapter is in the replica's running batch,
// as far as the gateway knows: reported running, or routed there and not
// reported waiting (requests sent since the report).
func (s *LoRAState) inBatch() bool { return s.Running || (s.Routed > 0 && !s.Waiting) }

// freeSlot reports whether another adapter could be scheduled there at
// once: the slot count is unknown, or fewer adapters than slots hold or
// wait for one.
func (s *LoRAState) freeSlot() bool { return s.MaxLoras == 0 || s.Active < s.MaxLoras }

// UpdateAdapters records the LoRA adapter state a replica's engine
// reports, replacing the last report. A report over the limits above (a
// negative or huge MaxLoras, an empty or huge name, too many names) is an
// error wrapping ErrInvalid and changes nothing. The report is
// copied; a report equal to the last is not copied again, so repeating it
// does not allocate.
func (g *Gateway) UpdateAdapters(name string, a AdapterReport) error {
	if err := a.validate(name); err != nil {
		return err
	}
	rs, err := g.lookup(name)
	if err != nil {
		return err
	}
	if cur := rs.lora.rep.Load(); cur != nil && cur.MaxLoras == a.MaxLoras &&
		slices.Equal(cur.Running, a.Running) && slices.Equal(cur.Waiting, a.Waiting) {
		// The same report again, as engines repeat it at every scrape:
		// keep the installed copy rather than make another.
		rs.lora.report(cur)
		return nil
	}
	rs.lora.report(a.normalized())
	return nil
}

// loraState is a replica's adapter bookkeeping: the engine's last report,
// the requests this gateway routed there per adapter and not done, and the
// adapters most recently routed there or reported running. The report is
// an atomic pointer; the rest is guarded by mu, which routes for adapters
// and their Done take briefly.
type loraState struct {
	rep atomic.Pointer[AdapterReport]

	mu     sync.Mutex
	routed map[string]int
	recent []string // most recent first, at most max(MaxLoras, 1) and 64
	// union is |report's running ∪ waiting ∪ adapters with routed > 0|,
	// kept current by every change.
	union int
}

// report installs a normalised report.
func (l *loraState) report(a *AdapterReport) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rep.Store(a)
	for _, n := range a.Running {
		l.touch(n, a.MaxLoras)
	}
	// A report with fewer slots than the last, and nothing running to
	// touch, leaves no more adapters last used than it has slots.
	l.trim(a.MaxLoras)
	l.recount()
}

// recount recomputes union; mu held.
func (l *loraState) recount() {
	a := l.rep.Load()
	n := 0
	if a != nil {
		n = a.active()
	}
	for name, c := range l.routed {
		if c > 0 && (a == nil || (!sortedHas(a.Running, name) && !sortedHas(a.Waiting, name))) {
			n++
		}
	}
	l.union = n
}

// touch moves name to the front of recent, which keeps max(slots, 1)
// names (trim); mu held.
func (l *loraState) touch(name string, slots int) {
	if i := slices.Index(l.recent, name); i >= 0 {
		copy(l.recent[1:i+1], l.recent[:i])
		l.recent[0] = name
	} else {
		l.recent = slices.Insert(l.recent, 0, name)
	}
	l.trim(slots)
}

// trim cuts recent to the max(slots, 1) most recent names, 64 at most
// (a report's MaxLoras may reach MaxAdapterSlots); mu held.
func (l *loraState) trim(slots int) {
	if keep := min(max(slots, 1), 64); len(l.recent) > keep {
		clear(l.recent[keep:])
		l.recent = l.recent[:keep]
	}
}

// state returns the replica's state for adapter.
func (l *loraState) state(adapter string) LoRAState {
	a := l.rep.Load()
	var s LoRAState
	if a != nil {
		s.Report = a
		s.MaxLoras = a.MaxLoras
		s.Running = sortedHas(a.Running, adapter)
		s.Waiting = sortedHas(a.Waiting, adapter)
	}
	l.mu.Lock()
	s.Routed = l.routed[adapter]
	s.Active = l.union
	s.Empty = max(s.MaxLoras-max(l.union, len(l.recent)), 0)
	s.Loaded = s.Running || s.Routed > 0 || slices.Contains(l.recent, adapter)
	l.mu.Unlock()
	return s
}

// route counts a request for adapter routed here.
func (l *loraState) route(adapter string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.routed == nil {
		l.routed = map[string]int{}
	}
	l.routed[adapter]++
	slots := 0
	if a := l.rep.Load(); a != nil {
		slots = a.MaxLoras
	}
	l.touch(adapter, slots)
	if l.routed[adapter] == 1 {
		l.recount()
	}
}

// done counts a request for adapter done.
func (l *loraState) done(adapter string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch c := l.routed[adapter]; {
	case c > 1:
		l.routed[adapter] = c - 1
	case c == 1:
		delete(l.routed, adapter)
		l.recount()
	}
}

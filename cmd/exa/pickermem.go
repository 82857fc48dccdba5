package main

import (
	"context"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// memoryGovernor holds the picker process's memory to its streams' budget
// (--max-buffered-bytes), which bounds what the streams hold but not what
// the Go runtime keeps around it. Two things made the process's RSS
// outgrow the budget (issue 29, D4): the collector lets the heap grow to
// twice what is live before it runs (GOGC=100), so a full budget of bodies
// is followed by as much again of garbage, the chunks copied into them;
// and memory freed when the streams end stays with the process until a
// collection and the scavenger return it, which an idle picker does not
// bring about. So, at every tick:
//
//   - the soft memory limit (debug.SetMemoryLimit) is set to what is live
//     outside the budget, plus the budget, plus headroom: half of what is
//     live outside the budget (the indexes, the fleet; GOGC=100 would give
//     it all of it), a sixteenth of the budget and 16 MiB (32 MiB at the
//     default budget, besides the half). The collector runs before the
//     heap passes that, and never with less than the headroom above what
//     is live, so a small budget beside a large heap does not make it run
//     at every few megabytes. The limit binds only when the streams hold
//     most of the budget; below, GOGC's goal (twice what is live) is the
//     lower. Not when GOMEMLIMIT is set: the operator's limit holds.
//   - when the budget in use has fallen by releaseStep or more since the
//     highest it was, debug.FreeOSMemory collects and returns the free
//     memory to the system, at most once every minGap.
type memoryGovernor struct {
	budget   int64
	reserved func() int64 // the budget in use (picker Stats.ReservedBytes)
	live     func() int64 // heap live after the last collection, and goroutine stacks
	setLimit func(int64)  // nil: leave the limit alone
	release  func()
	now      func() time.Time

	high int64     // the highest reserved since the last release
	last time.Time // the last release
}

// The governor's constants: its tick, the least drop that releases memory
// and the least time between two releases.
const (
	governorTick = time.Second
	minGap       = 5 * time.Second
)

// newMemoryGovernor returns the governor of a picker whose streams hold at
// most budget bytes, reserved reporting what they hold.
func newMemoryGovernor(budget int64, reserved func() int64) *memoryGovernor {
	g := &memoryGovernor{budget: budget, reserved: reserved, live: liveMemory, release: debug.FreeOSMemory, now: time.Now}
	if os.Getenv("GOMEMLIMIT") == "" {
		g.setLimit = func(n int64) { debug.SetMemoryLimit(n) }
	}
	return g
}

// headroom is what the collector may let the heap grow past what is live,
// outside bytes of it outside the budget.
func (g *memoryGovernor) headroom(outside int64) int64 { return outside/2 + g.budget/16 + 16<<20 }

// releaseStep is the drop in reserved bytes that releases memory.
func (g *memoryGovernor) releaseStep() int64 { return max(g.budget/8, 32<<20) }

// tick sets the memory limit and releases memory after a drop.
func (g *memoryGovernor) tick() {
	r := g.reserved()
	g.high = max(g.high, r)
	if now := g.now(); g.high-r >= g.releaseStep() && now.Sub(g.last) >= minGap {
		g.release()
		g.high, g.last = r, now
	}
	if g.setLimit != nil {
		outside := max(0, g.live()-r)
		g.setLimit(outside + g.budget + g.headroom(outside))
	}
}

// run ticks at every tick until ctx ends.
func (g *memoryGovernor) run(ctx context.Context, tick <-chan time.Time) {
	everyTick(ctx, tick, g.tick)
}

// liveMemory is the heap live after the last collection and the goroutine
// stacks in use, from runtime/metrics.
func liveMemory() int64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/memory/classes/heap/stacks:bytes"}}
	metrics.Read(s)
	var n int64
	for _, v := range s {
		if v.Value.Kind() == metrics.KindUint64 {
			n += int64(v.Value.Uint64())
		}
	}
	return n
}

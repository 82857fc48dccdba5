package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The memory governor sets the limit to what is live outside the budget,
// plus the budget and its headroom, and releases memory once the budget
// in use has fallen by a step, at most once every minGap.
func TestMemoryGovernor(t *testing.T) {
	const mib = 1 << 20
	var reserved, live int64
	var limit int64
	releases := 0
	now := time.Unix(1000, 0)
	g := &memoryGovernor{budget: 256 * mib, reserved: func() int64 { return reserved }, live: func() int64 { return live },
		setLimit: func(n int64) { limit = n }, release: func() { releases++ }, now: func() time.Time { return now }}
	// What is live outside the budget, the budget, and headroom: half of
	// the first, a sixteenth of the budget and 16 MiB.
	limitFor := func(outside int64) int64 { return outside + 256*mib + outside/2 + 256*mib/16 + 16*mib }
	for _, step := range []struct {
		name           string
		reserved, live int64
		advance        time.Duration
		limit          int64
		releases       int
	}{
		{"idle", 0, 20 * mib, 0, limitFor(20 * mib), 0},
		{"budget full", 256 * mib, 300 * mib, time.Second, limitFor(44 * mib), 0},
		{"a small drop", 256*mib - 31*mib, 270 * mib, time.Second, limitFor(45 * mib), 0},
		{"a drop of a step", 224 * mib, 260 * mib, time.Second, limitFor(36 * mib), 1},
		{"another drop soon after", 0, 20 * mib, time.Second, limitFor(20 * mib), 1},
		{"the gap passed", 0, 20 * mib, minGap, limitFor(20 * mib), 2},
		{"nothing more to release", 0, 20 * mib, minGap, limitFor(20 * mib), 2},
		{"live below reserved", 100 * mib, 50 * mib, time.Second, limitFor(0), 2},
		{"a large heap outside", 100 * mib, 700 * mib, time.Second, 600*mib + 256*mib + 300*mib + 32*mib, 2},
	} {
		reserved, live = step.reserved, step.live
		now = now.Add(step.advance)
		g.tick()
		assert.Equal(t, step.limit, limit, step.name)
		assert.Equal(t, step.releases, releases, step.name)
	}

	// With GOMEMLIMIT set, the limit is left alone; memory is released.
	t.Setenv("GOMEMLIMIT", "1GiB")
	g = newMemoryGovernor(256*mib, func() int64 { return reserved })
	assert.Nil(t, g.setLimit)
	reserved = 200 * mib
	g.release = func() { releases++ }
	g.tick()
	reserved = 0
	g.tick()
	assert.Equal(t, 3, releases)
}

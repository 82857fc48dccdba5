package httpgw

import (
	"runtime/debug"
	"sync"
	"time"
)

// Long assembled answers leave their memory to the collector when they
// end; with nothing else allocating, no collection comes to take it back
// (Go forces one only every two minutes), and the process keeps its peak
// RSS. So once answers holding returnAfter bytes or more in all have
// ended, the gateway collects and returns its free memory to the OS
// (debug.FreeOSMemory), at most once every returnEvery: a flood of long
// answers leaves its memory behind for at most returnEvery after its end.
// Answers under returnMin do not count: the allocator reuses their
// memory.
const (
	returnAfter = 64 << 20
	returnEvery = 10 * time.Second
	returnMin   = 1 << 20
)

// memReturner returns free memory to the OS after long answers ended.
// Safe for concurrent use.
type memReturner struct {
	afterFunc func(time.Duration, func()) func() bool // Server.afterFunc
	now       func() time.Time
	free      func() // debug.FreeOSMemory, replaced by tests

	mu      sync.Mutex
	sum     int64     // bytes of the answers ended since the last return
	last    time.Time // the last return
	pending bool      // a return is scheduled
}

func newMemReturner(afterFunc func(time.Duration, func()) func() bool, now func() time.Time) *memReturner {
	return &memReturner{afterFunc: afterFunc, now: now, free: debug.FreeOSMemory}
}

// ended notes that an answer holding n bytes ended; past returnAfter it
// schedules a return, returnEvery after the last one at the earliest.
func (m *memReturner) ended(n int64) {
	if n < returnMin {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sum += n
	if m.sum < returnAfter || m.pending {
		return
	}
	m.pending = true
	m.afterFunc(max(0, m.last.Add(returnEvery).Sub(m.now())), m.run)
}

func (m *memReturner) run() {
	m.mu.Lock()
	m.sum, m.pending, m.last = 0, false, m.now()
	m.mu.Unlock()
	m.free()
}

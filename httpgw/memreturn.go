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

// ended notes that an answer holding n bytes ended (counted from
// returnMin).
func (m *memReturner) ended(n int64) {
	if n < returnMin {
		return
	}
	m.add(n)
}

// heldCost is what a request held by flow control costs the process
// besides its body: its connection's buffers, the decoded prompt and
// keys, and two goroutine stacks (TestFlowRSS measured 38.3–38.6 KB a
// held request with 4 KiB bodies).
const heldCost = 36 << 10

// unheld notes that a request held by flow control, with a body of n
// bytes, was answered from the queue (its deadline, a full queue, its
// client gone): after a flood of them, as after long answers, the memory
// they held goes back to the OS.
func (m *memReturner) unheld(n int64) { m.add(heldCost + n) }

// add counts n bytes ended; past returnAfter it schedules a return,
// returnEvery after the last one at the earliest.
func (m *memReturner) add(n int64) {
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

package flow

import (
	"fmt"
	"sync"
)

// Budget bounds what several queues hold together, as a front's queues
// (one per model) share its memory: set the same *Budget in each one's
// Config. A request that would take the budget past a limit is refused
// with a *FullError of Scope "global"; no request is displaced from
// another queue for it. Safe for concurrent use.
type Budget struct {
	lim   Limits
	mu    sync.Mutex
	bytes int64
	n     int
}

// NewBudget returns a budget of l's limits; a zero field takes its
// default (DefaultMaxBytes, DefaultMaxRequests).
func NewBudget(l Limits) (*Budget, error) {
	if l.MaxBytes < 0 || l.MaxRequests < 0 {
		return nil, fmt.Errorf("%w: budget %+v is negative", ErrInvalid, l)
	}
	if l.MaxBytes == 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxRequests == 0 {
		l.MaxRequests = DefaultMaxRequests
	}
	return &Budget{lim: l}, nil
}

// Held returns the requests and bytes held against the budget.
func (b *Budget) Held() (requests int, bytes int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n, b.bytes
}

// take counts a request of size bytes for priority prio, were a held
// request of vb bytes (vn 1, else 0) let go first, or returns the
// *FullError of the limit it would break. A nil Budget takes anything.
func (b *Budget) take(bytes, vb int64, vn, prio int) error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.n-vn+1 > b.lim.MaxRequests:
		return &FullError{Scope: "global", Resource: "requests", Priority: prio, Held: int64(b.n), Max: int64(b.lim.MaxRequests)}
	case b.bytes-vb+bytes > b.lim.MaxBytes:
		return &FullError{Scope: "global", Resource: "bytes", Priority: prio, Held: b.bytes, Max: b.lim.MaxBytes}
	}
	b.n++
	b.bytes += bytes
	return nil
}

// give lets go of a request of size bytes. A nil Budget does nothing.
func (b *Budget) give(bytes int64) {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.n--
	b.bytes -= bytes
	b.mu.Unlock()
}

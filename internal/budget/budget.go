// Package budget is a byte budget shared by every holder of one resource
// (the memory of the answers the HTTP gateway assembles, of the bodies the
// picker buffers): each holder reserves what it holds before it holds it,
// and the sum stays within the budget's limit.
package budget

import (
	"errors"
	"fmt"
	"io"
	"sync/atomic"
)

// Budget is a number of bytes that holders reserve and release. The zero
// value has a limit of 0 and refuses every reservation; use New. Safe for
// concurrent use.
type Budget struct {
	limit int64
	used  atomic.Int64
}

// New returns a Budget of limit bytes.
func New(limit int64) *Budget { return &Budget{limit: limit} }

// Limit returns the budget's limit in bytes.
func (b *Budget) Limit() int64 { return b.limit }

// Used returns the bytes reserved now.
func (b *Budget) Used() int64 { return b.used.Load() }

// Reserve takes n more bytes (n ≥ 0) and reports whether it could: false,
// taking nothing, when the bytes reserved would exceed the limit.
func (b *Budget) Reserve(n int64) bool {
	for {
		u := b.used.Load()
		if u+n > b.limit || u+n < u {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// Release returns n bytes that Reserve took.
func (b *Budget) Release(n int64) { b.used.Add(-n) }

// Hold is one holder's share of a Budget, grown as the holder grows and
// released at once when it is done. The zero value holds nothing; set B
// before Grow. Not safe for concurrent use (one holder, one goroutine).
type Hold struct {
	B    *Budget
	held int64
}

// Grow makes the share at least n bytes, reserving the difference from
// the budget, and reports whether it could (the share is unchanged when
// not). A share never shrinks but at Release.
func (h *Hold) Grow(n int64) bool {
	d := n - h.held
	if d <= 0 {
		return true
	}
	if !h.B.Reserve(d) {
		return false
	}
	h.held = n
	return true
}

// Need is Grow with an error: when the budget cannot give the share n
// bytes, it wraps ErrSpent and names the bytes missing, the budget's
// limit and what is in use.
func (h *Hold) Need(n int64) error {
	if h.Grow(n) {
		return nil
	}
	return fmt.Errorf("%w: %d bytes more needed, of %d, %d in use", ErrSpent, n-h.Held(), h.B.Limit(), h.B.Used())
}

// Held returns the bytes the share holds.
func (h *Hold) Held() int64 { return h.held }

// Release returns the whole share to the budget; a share of nothing (its
// B possibly nil) is left alone.
func (h *Hold) Release() {
	if h.held == 0 {
		return
	}
	h.B.Release(h.held)
	h.held = 0
}

// ErrSpent is the error of ReadAll when the budget cannot hold what the
// read needs; ErrTooLong when the input passes the read's limit.
var (
	ErrSpent   = errors.New("the budget is spent")
	ErrTooLong = errors.New("input too long")
)

// ReadAll reads r to its end, at most limit bytes, into a buffer whose
// capacity times charge (at least 1) h reserves before it is allocated.
// Past the budget the error wraps ErrSpent and names the bytes needed;
// past limit it wraps ErrTooLong. On error the buffer is dropped, but
// what h holds is left for the caller to release.
func (h *Hold) ReadAll(r io.Reader, limit, charge int64) ([]byte, error) {
	return h.ReadAllSize(r, 0, limit, charge)
}

// ReadAllSize is ReadAll for a reader that says it holds size bytes (an
// HTTP body's Content-Length): when 0 < size ≤ limit its first buffer
// holds size+1 bytes, so that a reader that keeps its word is read in one
// allocation, charged before it is made; a size outside that range is
// ignored.
func (h *Hold) ReadAllSize(r io.Reader, size, limit, charge int64) ([]byte, error) {
	charge = max(charge, 1)
	var b []byte
	for {
		if len(b) == cap(b) {
			n := min(max(2*int64(cap(b)), 512), limit+1)
			if cap(b) == 0 && size > 0 && size <= limit {
				n = size + 1
			}
			if err := h.Need(charge * n); err != nil {
				return nil, err
			}
			nb := make([]byte, len(b), n)
			copy(nb, b)
			b = nb
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if int64(len(b)) > limit {
			return nil, fmt.Errorf("%w: over %d bytes", ErrTooLong, limit)
		}
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

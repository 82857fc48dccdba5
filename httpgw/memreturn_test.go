package httpgw

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// Memory is returned to the OS once long answers holding returnAfter in
// all have ended, at most once every returnEvery; short answers do not
// count.
func TestMemReturner(t *testing.T) {
	now := time.Unix(1000, 0)
	var scheduled []time.Duration
	var fire []func()
	m := newMemReturner(func(d time.Duration, f func()) func() bool {
		scheduled, fire = append(scheduled, d), append(fire, f)
		return func() bool { return true }
	}, func() time.Time { return now })
	frees := 0
	m.free = func() { frees++ }

	for range 1000 {
		m.ended(returnMin - 1) // short answers: never
	}
	assert.Empty(t, scheduled)
	m.ended(returnAfter / 2)
	assert.Empty(t, scheduled)
	m.ended(returnAfter / 2)
	assert.Equal(t, []time.Duration{0}, scheduled, "past returnAfter: at once, the first time")
	m.ended(returnAfter)
	assert.Len(t, scheduled, 1, "one return pending at a time")
	fire[0]()
	assert.Equal(t, 1, frees)

	now = now.Add(3 * time.Second)
	m.ended(returnAfter)
	assert.Equal(t, []time.Duration{0, returnEvery - 3*time.Second}, scheduled, "returnEvery after the last")
	now = now.Add(returnEvery)
	fire[1]()
	assert.Equal(t, 2, frees)
}

// A flood of requests answered from flow control's queue counts too: each
// its heldCost and body, however small.
func TestMemReturnerUnheld(t *testing.T) {
	now := time.Unix(1000, 0)
	var scheduled []time.Duration
	m := newMemReturner(func(d time.Duration, f func()) func() bool {
		scheduled = append(scheduled, d)
		return func() bool { return true }
	}, func() time.Time { return now })
	n := returnAfter/(heldCost+4<<10) + 1 // 4 KiB bodies
	for range n - 1 {
		m.unheld(4 << 10)
	}
	assert.Empty(t, scheduled)
	m.unheld(4 << 10)
	assert.Equal(t, []time.Duration{0}, scheduled, "past returnAfter in held requests: at once")
}

package budget

import (
	"math"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReserve(t *testing.T) {
	b := New(100)
	for _, tc := range []struct {
		n    int64
		ok   bool
		used int64
	}{
		{60, true, 60},
		{41, false, 60}, // past the limit: nothing taken
		{40, true, 100}, // exactly the limit
		{0, true, 100},
		{1, false, 100},
		{math.MaxInt64, false, 100}, // no overflow
	} {
		assert.Equal(t, tc.ok, b.Reserve(tc.n), "Reserve(%d)", tc.n)
		assert.Equal(t, tc.used, b.Used(), "after Reserve(%d)", tc.n)
	}
	b.Release(100)
	assert.Zero(t, b.Used())
	assert.False(t, (&Budget{}).Reserve(1), "the zero Budget refuses")
}

func TestHold(t *testing.T) {
	b := New(100)
	h := Hold{B: b}
	require.True(t, h.Grow(30))
	require.True(t, h.Grow(10), "a share never shrinks")
	assert.Equal(t, int64(30), h.Held())
	require.True(t, h.Grow(70))
	assert.Equal(t, int64(70), b.Used())
	other := Hold{B: b}
	assert.False(t, other.Grow(31), "past the limit with the first share")
	assert.Zero(t, other.Held())
	assert.Equal(t, int64(70), b.Used())
	h.Release()
	assert.Zero(t, b.Used())
	assert.Zero(t, h.Held())
	assert.True(t, other.Grow(100))
	other.Release()
	assert.Zero(t, b.Used())
	var none Hold
	none.Release() // no budget, nothing held: nothing to do
}

// Concurrent holders never take the budget past its limit, and every byte
// comes back.
func TestConcurrentHolders(t *testing.T) {
	const limit = 1000
	b := New(limit)
	var wg sync.WaitGroup
	var mu sync.Mutex
	peak := int64(0)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				h := Hold{B: b}
				for n := int64(g + 1); n <= 300; n += int64(i%7 + 1) {
					if !h.Grow(n) {
						break
					}
					if u := b.Used(); u > limit {
						mu.Lock()
						peak = max(peak, u)
						mu.Unlock()
					}
				}
				h.Release()
			}
		}()
	}
	wg.Wait()
	assert.Zero(t, peak, "the budget was exceeded")
	assert.Zero(t, b.Used())
}

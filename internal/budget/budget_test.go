package budget

import (
	"bytes"
	"errors"
	"io"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
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

// ReadAll reserves each buffer, times its charge, before allocating it:
// a read the budget cannot hold fails naming the bytes, one past its
// limit fails too, and what was reserved stays with the Hold.
func TestHoldReadAll(t *testing.T) {
	data := strings.Repeat("x", 3000)
	b := New(1 << 20)
	h := Hold{B: b}
	got, err := h.ReadAll(strings.NewReader(data), 3000, 2)
	require.NoError(t, err)
	assert.Equal(t, data, string(got))
	assert.GreaterOrEqual(t, h.Held(), int64(2*3000), "the buffer's capacity, charged twice")
	assert.Equal(t, h.Held(), b.Used())
	h.Release()

	_, err = h.ReadAll(strings.NewReader(data), 2999, 1)
	require.ErrorIs(t, err, ErrTooLong)
	h.Release()

	small := New(1000)
	h = Hold{B: small}
	_, err = h.ReadAll(strings.NewReader(data), 3000, 1)
	require.ErrorIs(t, err, ErrSpent)
	assert.Contains(t, err.Error(), "of 1000")
	assert.LessOrEqual(t, small.Used(), int64(1000), "never past the budget")
	assert.Equal(t, small.Used(), h.Held())
	h.Release()
	assert.Zero(t, small.Used())

	_, err = h.ReadAll(iotest.ErrReader(errors.New("boom")), 100, 1)
	require.EqualError(t, err, "boom")
	h.Release()
}

func TestHoldReadAllSize(t *testing.T) {
	data := strings.Repeat("x", 3000)
	for _, tc := range []struct {
		name       string
		size       int64
		limit      int64
		wantHeld   int64 // 0: only at least the data, charged
		wantErrIs  error
		oneByteAtA bool
	}{
		{name: "the size given: one buffer", size: 3000, limit: 4000, wantHeld: 2 * 3001},
		{name: "read a byte at a time", size: 3000, limit: 4000, wantHeld: 2 * 3001, oneByteAtA: true},
		{name: "a size too small grows as ReadAll", size: 10, limit: 4000},
		{name: "a size too large", size: 3500, limit: 4000, wantHeld: 2 * 3501},
		{name: "a size past the limit is ignored", size: 5000, limit: 3000},
		{name: "a size that lies past the limit", size: 100, limit: 2999, wantErrIs: ErrTooLong},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := New(1 << 20)
			h := Hold{B: b}
			var r io.Reader = strings.NewReader(data)
			if tc.oneByteAtA {
				r = iotest.OneByteReader(r)
			}
			got, err := h.ReadAllSize(r, tc.size, tc.limit, 2)
			assert.Equal(t, h.Held(), b.Used())
			if tc.wantErrIs != nil {
				require.ErrorIs(t, err, tc.wantErrIs)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, data, string(got))
			assert.GreaterOrEqual(t, h.Held(), 2*int64(cap(got)), "the buffer's capacity, charged twice")
			if tc.wantHeld != 0 {
				assert.Equal(t, tc.wantHeld, h.Held())
			}
		})
	}

	t.Run("refused before the buffer is made", func(t *testing.T) {
		b := New(5000)
		h := Hold{B: b}
		_, err := h.ReadAllSize(strings.NewReader(data), 3000, 3000, 2)
		require.ErrorIs(t, err, ErrSpent)
		assert.Zero(t, b.Used(), "nothing taken")
	})
}

// TestPropReadAllSize: whatever size a reader claims, ReadAllSize reads
// what ReadAll reads, within the budget, and holds at least the charged
// capacity of what it returns.
func TestPropReadAllSize(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		data := rapid.SliceOfN(rapid.Byte(), 0, 5000).Draw(t, "data")
		size := rapid.Int64Range(-10, 6000).Draw(t, "size")
		limit := rapid.Int64Range(0, 6000).Draw(t, "limit")
		charge := rapid.Int64Range(0, 3).Draw(t, "charge")
		budget := rapid.Int64Range(0, 40000).Draw(t, "budget")
		b := New(budget)
		h := Hold{B: b}
		got, err := h.ReadAllSize(bytes.NewReader(data), size, limit, charge)
		if b.Used() > budget || b.Used() != h.Held() {
			t.Fatalf("used %d of %d, held %d", b.Used(), budget, h.Held())
		}
		switch {
		case errors.Is(err, ErrSpent):
		case int64(len(data)) > limit:
			if !errors.Is(err, ErrTooLong) {
				t.Fatalf("%d bytes past the limit %d: err %v", len(data), limit, err)
			}
		case err != nil:
			t.Fatalf("unexpected error %v", err)
		default:
			if !bytes.Equal(got, data) {
				t.Fatalf("read %q, want %q", got, data)
			}
			if h.Held() < max(charge, 1)*int64(cap(got)) {
				t.Fatalf("held %d, capacity %d charged %d", h.Held(), cap(got), charge)
			}
		}
		h.Release()
		if b.Used() != 0 {
			t.Fatalf("%d left after Release", b.Used())
		}
	})
}

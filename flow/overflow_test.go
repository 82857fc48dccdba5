package flow

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPushHugeBytesRefused: a request whose Bytes is so large that the
// bytes held plus it overflow int64 is refused at the bound it breaks
// (the queue's, or its Budget's when the bytes are held by another
// queue), not held past it.
func TestPushHugeBytesRefused(t *testing.T) {
	t.Run("total", func(t *testing.T) {
		q := mustNew[int](t, Config{})
		_, err := q.Push(Request[int]{Value: 1, Bytes: 1}, t0, nil)
		require.NoError(t, err)
		_, err = q.Push(Request[int]{Value: 2, Bytes: math.MaxInt64}, t0, nil)
		var fe *FullError
		require.ErrorAs(t, err, &fe, "a request of MaxInt64 bytes was held")
		assert.Equal(t, FullError{Scope: "total", Resource: "bytes", Held: 1, Max: DefaultMaxBytes, Bytes: math.MaxInt64}, *fe)
		assert.Equal(t, Stats{Requests: 1, Bytes: 1, Bands: []BandStats{{Requests: 1, Flows: 1, Bytes: 1}}}, q.Stats())
	})
	t.Run("global", func(t *testing.T) {
		b, err := NewBudget(Limits{MaxBytes: 100})
		require.NoError(t, err)
		qa := mustNew[int](t, Config{Budget: b})
		qb := mustNew[int](t, Config{Budget: b, Total: Limits{MaxBytes: math.MaxInt64}})
		_, err = qa.Push(Request[int]{Value: 1, Bytes: 1}, t0, nil)
		require.NoError(t, err)
		_, err = qb.Push(Request[int]{Value: 2, Bytes: math.MaxInt64}, t0, nil)
		var fe *FullError
		require.ErrorAs(t, err, &fe, "a request of MaxInt64 bytes was held")
		assert.Equal(t, FullError{Scope: "global", Resource: "bytes", Held: 1, Max: 100, Bytes: math.MaxInt64}, *fe)
		assert.Equal(t, 0, qb.Len())
		n, bytes := b.Held()
		assert.Equal(t, []any{1, int64(1)}, []any{n, bytes})
	})
}

// A request refused for its bytes is named with its size: one larger
// than the whole bound was refused as "0 held of 60", a queue full of
// nothing.
func TestFullErrorNamesTheRequestSize(t *testing.T) {
	b, err := NewBudget(Limits{MaxBytes: 100})
	require.NoError(t, err)
	q := mustNew[int](t, Config{Band: Limits{MaxBytes: 60}, Budget: b})
	_, err = q.Push(Request[int]{Value: 1, Bytes: 150}, t0, nil)
	require.ErrorIs(t, err, ErrFull)
	assert.EqualError(t, err, "flow: queue full: band bytes (priority 0): 0 held of 60, the request 150")
	q = mustNew[int](t, Config{Budget: b, Total: Limits{MaxBytes: 1000}})
	_, err = q.Push(Request[int]{Value: 1, Bytes: 150}, t0, nil)
	assert.EqualError(t, err, "flow: queue full: global bytes (priority 0): 0 held of 100, the request 150")
	q = mustNew[int](t, Config{Total: Limits{MaxRequests: 1}})
	_, err = q.Push(Request[int]{Value: 1, Bytes: 5}, t0, nil)
	require.NoError(t, err)
	_, err = q.Push(Request[int]{Value: 2, Bytes: 5}, t0, nil)
	assert.EqualError(t, err, "flow: queue full: total requests (priority 0): 1 held of 1", "a count names no size")
}

package flow

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// slots is a bind function over n slots: a request has room while a slot
// is free, and binding takes one.
type slots struct {
	mu    sync.Mutex
	free  int
	order []int
}

func (s *slots) bind(v int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.free == 0 {
		return false
	}
	s.free--
	s.order = append(s.order, v)
	return true
}

func (s *slots) release() {
	s.mu.Lock()
	s.free++
	s.mu.Unlock()
}

func startController(t *testing.T, c Config, s *slots) (*Controller[int], context.CancelFunc) {
	t.Helper()
	ctl, err := NewController[int](c, s.bind, nil, time.Millisecond)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { ctl.Run(ctx); close(stopped) }()
	t.Cleanup(func() { cancel(); <-stopped })
	return ctl, cancel
}

// waitHeld waits until the controller holds n requests.
func waitHeld(t *testing.T, ctl *Controller[int], n int) {
	t.Helper()
	require.Eventually(t, func() bool { return ctl.Stats().Requests == n }, 10*time.Second, time.Millisecond)
}

func TestControllerNewRejects(t *testing.T) {
	_, err := NewController[int](Config{}, nil, nil, 0)
	require.ErrorIs(t, err, ErrInvalid)
	_, err = NewController[int](Config{}, func(int) bool { return true }, nil, -time.Second)
	require.ErrorIs(t, err, ErrInvalid)
	_, err = NewController[int](Config{TTL: -1}, func(int) bool { return true }, nil, 0)
	require.ErrorIs(t, err, ErrInvalid)
}

// Requests past capacity wait, and go in priority order as slots free:
// the interactive one first, then the batch ones in arrival order. Run
// starts only once all three are held and the first slot is free: a
// slot freed while a running scan has asked the interactive head (no
// room) but not yet the batch one would let the batch one go first, the
// work-conserving rule at work, not an order broken (1 to 5 of 300 -race
// runs did so when Run ran throughout).
func TestControllerHoldsAndDispatchesInOrder(t *testing.T) {
	s := &slots{free: 1}
	ctl, err := NewController[int](Config{}, s.bind, nil, time.Millisecond)
	require.NoError(t, err)
	require.NoError(t, ctl.Hold(context.Background(), Request[int]{Value: 0}), "room: at once")

	results := make(chan [2]int, 3)
	hold := func(v, prio int) {
		go func() {
			err := ctl.Hold(context.Background(), Request[int]{Value: v, Priority: prio})
			code := 0
			if err != nil {
				code = 1
			}
			results <- [2]int{v, code}
		}()
	}
	hold(1, 0)
	waitHeld(t, ctl, 1)
	hold(2, 0)
	waitHeld(t, ctl, 2)
	hold(3, 1)
	waitHeld(t, ctl, 3)
	s.release()
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { ctl.Run(ctx); close(stopped) }()
	t.Cleanup(func() { cancel(); <-stopped })
	for i := 0; i < 3; i++ {
		if i > 0 {
			s.release()
			ctl.Kick()
		}
		r := <-results
		assert.Equal(t, 0, r[1])
	}
	assert.Equal(t, []int{0, 3, 1, 2}, s.order)
}

func TestControllerAnswersEveryHeldRequest(t *testing.T) {
	s := &slots{}
	ctl, cancel := startController(t, Config{Total: Limits{MaxRequests: 2}}, s)

	// Sheddable: never held.
	assert.ErrorIs(t, ctl.Hold(context.Background(), Request[int]{Value: 1, Priority: -1}), ErrSheddable)

	// A client that goes away leaves the queue at once.
	ctx, stop := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() { gone <- ctl.Hold(ctx, Request[int]{Value: 2}) }()
	waitHeld(t, ctl, 1)
	stop()
	assert.ErrorIs(t, <-gone, context.Canceled)
	assert.Equal(t, 0, ctl.Stats().Requests)

	// Deadline: answered ErrExpired.
	assert.ErrorIs(t, ctl.Hold(context.Background(), Request[int]{Value: 3, Deadline: time.Now().Add(5 * time.Millisecond)}), ErrExpired)

	// Displaced by a quiet flow, refused when full.
	errs := make(chan error, 2)
	for v := 4; v <= 5; v++ {
		go func() { errs <- ctl.Hold(context.Background(), Request[int]{Value: v, Flow: "noisy"}) }()
		waitHeld(t, ctl, v-3)
	}
	var fe *FullError
	require.ErrorAs(t, ctl.Hold(context.Background(), Request[int]{Value: 6, Flow: "noisy"}), &fe)
	quiet := make(chan error, 1)
	go func() { quiet <- ctl.Hold(context.Background(), Request[int]{Value: 7, Flow: "quiet"}) }()
	assert.ErrorIs(t, <-errs, ErrDisplaced)

	// Stopping answers the rest.
	cancel()
	assert.ErrorIs(t, <-errs, ErrClosed)
	assert.ErrorIs(t, <-quiet, ErrClosed)
	assert.ErrorIs(t, ctl.Hold(context.Background(), Request[int]{Value: 8}), ErrClosed)
}

// A request whose client has gone before it is held is not pushed: it
// displaces no one from a full queue (it displaced the flood's newest,
// then left).
func TestControllerGoneBeforeHeldDisplacesNoOne(t *testing.T) {
	ctl, _ := startController(t, Config{Total: Limits{MaxRequests: 2}}, &slots{})
	errs := make(chan error, 2)
	for v := 1; v <= 2; v++ {
		go func() { errs <- ctl.Hold(context.Background(), Request[int]{Value: v, Flow: "noisy"}) }()
		waitHeld(t, ctl, v)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, ctl.Hold(ctx, Request[int]{Value: 3, Flow: "quiet"}), context.Canceled)
	assert.Equal(t, 2, ctl.Stats().Requests, "the flood's requests are all still held")
	assert.Empty(t, errs)
}

// Many clients at once, with slots freed as requests end: every request
// is answered, bound ones never more than the slots.
func TestControllerConcurrent(t *testing.T) {
	s := &slots{free: 3}
	ctl, _ := startController(t, Config{}, s)
	var bound, refused atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := ctl.Hold(context.Background(), Request[int]{Value: i, Flow: string(rune('a' + i%5)), Priority: i % 2})
			if err != nil {
				refused.Add(1)
				assert.True(t, errors.Is(err, ErrFull) || errors.Is(err, ErrDisplaced), "%v", err)
				return
			}
			bound.Add(1)
			s.release()
			ctl.Kick()
		}()
	}
	wg.Wait()
	assert.Equal(t, int64(200), bound.Load()+refused.Load())
	assert.Equal(t, int64(200), bound.Load(), "the queue's default bounds hold 200")
	assert.Equal(t, 3, s.free)
}

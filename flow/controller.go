package flow

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Answers Hold gives a request that was held and did not go.
var (
	// ErrExpired: its deadline passed while it was held.
	ErrExpired = errors.New("flow: held past its deadline")
	// ErrDisplaced: a request of another flow or a higher band took its
	// place in a full queue.
	ErrDisplaced = errors.New("flow: displaced from a full queue")
	// ErrClosed: the controller stopped while it was held.
	ErrClosed = errors.New("flow: controller stopped")
)

// DefaultRetry is how often a Controller tries its held requests again
// when nothing kicks it: the fronts' load signals change between requests
// ending (a scrape, a health check).
const DefaultRetry = 10 * time.Millisecond

// Controller holds a front's requests in a Queue until each can go, and
// binds each at dispatch (late binding): bind is called with a request
// when it may go, by Hold at once when nothing is held, else by the
// controller's dispatch loop in queue order; it returns whether the
// request had room, and if so has bound it (routed it, in the fronts).
// bind must be safe for concurrent use, must not block, and must not call
// the controller.
//
// A Controller is safe for concurrent use. Its dispatch loop runs in Run.
type Controller[T any] struct {
	q     *Queue[*waiter[T]]
	bind  func(T) bool
	now   func() time.Time
	retry time.Duration
	kick  chan struct{}
	done  chan struct{} // closed when Run returns
}

type waiter[T any] struct {
	v      T
	answer chan error // buffered: one answer, never blocks the loop
}

// NewController returns a controller over a queue configured by c; now is
// its clock (nil: time.Now), retry how often it tries held requests again
// unkicked (0: DefaultRetry).
func NewController[T any](c Config, bind func(T) bool, now func() time.Time, retry time.Duration) (*Controller[T], error) {
	if bind == nil {
		return nil, fmt.Errorf("%w: bind is nil", ErrInvalid)
	}
	if retry < 0 {
		return nil, fmt.Errorf("%w: retry %v is negative", ErrInvalid, retry)
	}
	q, err := New[*waiter[T]](c)
	if err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	if retry == 0 {
		retry = DefaultRetry
	}
	return &Controller[T]{q: q, bind: bind, now: now, retry: retry, kick: make(chan struct{}, 1), done: make(chan struct{})}, nil
}

// Hold returns nil once r's value is bound: at once if nothing is held and
// bind takes it, else when its turn comes. Otherwise it returns why not:
// ErrSheddable (a negative priority that could not go at once), a
// *FullError, ErrDisplaced, ErrExpired, ErrClosed, or ctx's error when the
// caller goes away first (the request then leaves the queue at once). A
// request bound as ctx ends is still reported bound (nil): the caller owns
// what bind made.
func (c *Controller[T]) Hold(ctx context.Context, r Request[T]) error {
	if c.q.Len() == 0 && c.bind(r.Value) {
		return nil
	}
	select {
	case <-c.done:
		return ErrClosed
	default:
	}
	if err := ctx.Err(); err != nil {
		return err // gone before it was held: it must displace no one
	}
	w := &waiter[T]{v: r.Value, answer: make(chan error, 1)}
	h, err := c.q.Push(Request[*waiter[T]]{Value: w, Flow: r.Flow, Priority: r.Priority, Bytes: r.Bytes, Deadline: r.Deadline}, c.now(),
		func(d *waiter[T]) { d.answer <- ErrDisplaced })
	if err != nil {
		return err
	}
	c.Kick()
	select {
	case err := <-w.answer:
		return err
	case <-ctx.Done():
		if c.q.Remove(h) {
			return ctx.Err()
		}
		return <-w.answer // taken meanwhile: its answer is on its way
	case <-c.done: // pushed as Run stopped
		if c.q.Remove(h) {
			return ErrClosed
		}
		return <-w.answer
	}
}

// Kick tells the controller that held requests may have room now (a
// request ended, a replica came up). It does not block.
func (c *Controller[T]) Kick() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Stats returns what the controller holds.
func (c *Controller[T]) Stats() Stats { return c.q.Stats() }

// Run dispatches held requests until ctx ends, then answers every request
// still held with ErrClosed. Call it once.
func (c *Controller[T]) Run(ctx context.Context) {
	defer close(c.done)
	try := func(w *waiter[T]) bool { return c.bind(w.v) }
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		for {
			w, ok := c.q.Next(try)
			if !ok {
				break
			}
			w.answer <- nil
		}
		now := c.now()
		c.q.Expire(now, func(w *waiter[T]) { w.answer <- ErrExpired })
		wait := time.Duration(-1)
		if dl, ok := c.q.NextDeadline(); ok {
			wait = min(c.retry, max(dl.Sub(now), 0))
		}
		if wait >= 0 {
			timer.Reset(wait)
		}
		select {
		case <-ctx.Done():
			c.q.Expire(time.Unix(1<<62, 0), func(w *waiter[T]) { w.answer <- ErrClosed })
			return
		case <-c.kick:
		case <-timer.C:
		}
		timer.Stop() // Go 1.23 timers: no stale tick after Stop or Reset
	}
}

package gateway

import (
	"fmt"
	"time"
)

// Option configures a Gateway in New. A nil Option is an error.
type Option func(*settings) error

// indexMode says how the gateway keeps its cache index current. The zero
// value is indexApproximate.
type indexMode int

const (
	// indexApproximate: routing a request records its blocks as cached on
	// the chosen replica, the way the engine will cache them once it serves
	// it. Needs no engine cooperation. The default.
	indexApproximate indexMode = iota
	// indexExact: the index changes only through ApplyEvent, fed by the
	// engines' KV-cache events (blocks stored, blocks removed, all
	// cleared); WithExactIndex.
	indexExact
)

// defaultLatencyTTL is how long a latency sample counts against the SLO
// (a replica excluded for breaching the SLO gets no
// traffic and so no new samples; once its last sample is this old it is
// eligible again); tests set another with withLatencyTTL.
const defaultLatencyTTL = 30 * time.Second

// settings are what the options of New set.
type settings struct {
	policy Policy
	mode   Mode
	slo    time.Duration
	ttl    time.Duration
	index  indexMode
	clock  func() time.Time
	secret *uint64 // fixes the index's placement secret; tests only
}

// withSecret fixes the secret the index places blocks under, which New
// otherwise draws at random (see index.go). Unexported: only tests need a
// fixed placement, and no routing decision depends on it.
func withSecret(s uint64) Option {
	return func(c *settings) error {
		c.secret = &s
		return nil
	}
}

// WithMode selects a built-in policy. The default is ModeRoundRobin.
func WithMode(m Mode) Option {
	return func(c *settings) error {
		if m < 0 || m >= numModes {
			return fmt.Errorf("%w: mode %d, want one of %s", ErrInvalid, int(m), modeList())
		}
		c.mode = m
		return nil
	}
}

// WithPolicy routes with p instead of a built-in mode. It overrides
// WithMode.
func WithPolicy(p Policy) Option {
	return func(c *settings) error {
		if p == nil {
			return fmt.Errorf("%w: nil policy", ErrInvalid)
		}
		c.policy = p
		return nil
	}
}

// WithSLOLatency excludes replicas whose smoothed latency exceeds d, unless
// every healthy replica does. Zero, the default, disables the SLO.
func WithSLOLatency(d time.Duration) Option {
	return func(c *settings) error {
		if d < 0 {
			return fmt.Errorf("%w: SLO latency %v is negative", ErrInvalid, d)
		}
		c.slo = d
		return nil
	}
}

// withLatencyTTL sets how long a latency sample counts against the SLO.
// The default is 30 seconds: a replica excluded for breaching the SLO gets
// no traffic and so no new samples; once its last sample is this old it is
// eligible again and its next requests measure it afresh. Zero means
// forever.
func withLatencyTTL(d time.Duration) Option {
	return func(c *settings) error {
		if d < 0 {
			return fmt.Errorf("%w: latency TTL %v is negative", ErrInvalid, d)
		}
		c.ttl = d
		return nil
	}
}

// WithExactIndex keeps the cache index exact: it changes only through
// ApplyEvent, fed by the engines' KV-cache events (blocks stored, blocks
// removed, all cleared), and routing records nothing. The default is the
// approximate index: routing a request records its blocks as cached on the
// chosen replica, the way the engine will cache them once it serves it,
// with no engine cooperation.
func WithExactIndex() Option { return withIndex(indexExact) }

// withIndex selects how the cache index is kept current (tests).
func withIndex(m indexMode) Option {
	return func(c *settings) error {
		if m != indexApproximate && m != indexExact {
			return fmt.Errorf("%w: index mode %d", ErrInvalid, int(m))
		}
		c.index = m
		return nil
	}
}

// WithClock sets the clock the gateway reads to age latency samples. The
// default is time.Now; simulations and tests inject their own.
func WithClock(now func() time.Time) Option {
	return func(c *settings) error {
		if now == nil {
			return fmt.Errorf("%w: nil clock", ErrInvalid)
		}
		c.clock = now
		return nil
	}
}

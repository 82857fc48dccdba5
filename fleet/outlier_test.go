package fleet

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// testClock is a clock the test moves.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestHealthStateOutlier: the passive count survives passing probes; the
// back-off grows with each ejection up to its cap; a timeout ejects at
// once; a probe failure streak ejects without back-off.
func TestHealthStateOutlier(t *testing.T) {
	clk := &testClock{now: time.Unix(1e9, 0)}
	h := &Health{ejectAfter: 3, readmitAfter: 1, clock: clk.Now, backoff: 10 * time.Second, maxBackoff: 25 * time.Second}
	assert.Equal(t, healthNoChange, h.Failure(false))
	assert.Equal(t, healthNoChange, h.Success(true))
	assert.Equal(t, healthNoChange, h.Failure(false))
	assert.Equal(t, healthNoChange, h.Success(true))
	assert.Equal(t, healthEjected, h.Failure(false), "the third 500 ejects, probes between")
	for i, wait := range []time.Duration{10 * time.Second, 20 * time.Second, 25 * time.Second, 25 * time.Second} {
		if i > 0 {
			assert.Equal(t, healthEjected, h.Timeout(), "ejection %d", i+1)
		}
		clk.Add(wait - time.Millisecond)
		assert.Equal(t, healthNoChange, h.Success(true), "ejection %d: within %v", i+1, wait)
		clk.Add(time.Millisecond)
		assert.Equal(t, healthReadmitted, h.Success(true), "ejection %d: after %v", i+1, wait)
	}
	// Served answers lower the multiplier again.
	for range 10 {
		h.Success(false)
	}
	assert.Equal(t, healthEjected, h.Timeout())
	clk.Add(10 * time.Second)
	assert.Equal(t, healthReadmitted, h.Success(true))
	// Probe failures: no back-off.
	for range 2 {
		assert.Equal(t, healthNoChange, h.probeFailure(Cause{Source: SourceProbe, Reason: ReasonStatus, Detail: "status 503"}))
	}
	assert.Equal(t, healthEjected, h.probeFailure(Cause{Source: SourceProbe, Reason: ReasonStatus, Detail: "status 503"}))
	assert.Equal(t, healthReadmitted, h.Success(true))
}

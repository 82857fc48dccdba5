package httpgw

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/httpgw/enginetest"
)

// withHealthClock makes every engine's outlier back-off read clk.
func withHealthClock(f *fixture, clk *testClock) {
	for _, ep := range f.srv.Snapshot().Endpoints {
		ep.Health.SetClock(clk.Now)
	}
}

// TestOutlierEjection: an engine whose /health passes but whose answers
// are 500s is ejected after EjectAfter of them, although a successful
// probe comes between every two requests, and stays out for the back-off
// (EjectionTime, then twice it), as Envoy's outlier detection does.
func TestOutlierEjection(t *testing.T) {
	f := newFixture(t, 2, gateway.ModeRoundRobin, enginetest.Options{})
	clk := &testClock{now: time.Unix(1e9, 0)}
	withHealthClock(f, clk)
	bad := f.engines[0]
	bad.FailNext(1 << 30)
	ctx := context.Background()
	post := func(n int) {
		for range n {
			resp := f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "hi"))
			b := readAll(t, resp)
			require.Equal(t, http.StatusOK, resp.StatusCode, "the retry on the good engine answers: %s", b)
			f.srv.ProbeAll(ctx) // /health passes on both
		}
	}
	post(20)
	assert.Equal(t, int64(fleet.DefaultEjectAfter), bad.Requests(), "ejected after EjectAfter 500s, probes passing between them")
	assert.False(t, f.stats().Engines[indexOf(f, 0)].Healthy)

	// Within the back-off, passing probes do not readmit it.
	clk.Add(fleet.DefaultEjectionTime - time.Second)
	post(5)
	assert.Equal(t, int64(fleet.DefaultEjectAfter), bad.Requests())

	// After it, ReadmitAfter passing probes do; its answers fail again
	// and it is ejected for twice the back-off.
	clk.Add(2 * time.Second)
	for range fleet.DefaultReadmitAfter {
		f.srv.ProbeAll(ctx)
	}
	assert.True(t, f.stats().Engines[indexOf(f, 0)].Healthy)
	post(10)
	assert.Equal(t, int64(2*fleet.DefaultEjectAfter), bad.Requests())
	clk.Add(fleet.DefaultEjectionTime + time.Second)
	post(5)
	assert.Equal(t, int64(2*fleet.DefaultEjectAfter), bad.Requests(), "the second back-off is twice as long")
	clk.Add(fleet.DefaultEjectionTime)
	bad.FailNext(0)
	for range fleet.DefaultReadmitAfter {
		f.srv.ProbeAll(ctx)
	}
	post(4)
	assert.Equal(t, int64(2*fleet.DefaultEjectAfter+2), bad.Requests(), "readmitted, it serves again")
	assert.Equal(t, 2.0, f.counter("exa_gateway_ejections_total", nil))
}

// TestPrefillTimeoutEjects: a prefill engine that hangs is ejected from
// the prefill pool by its first timeout: the next request is not split
// (prefill_unavailable) and does not wait on it again.
func TestPrefillTimeoutEjects(t *testing.T) {
	f := newPDFixture(t, 1, 1, nil)
	p := f.prefill[0]
	p.hold, p.entered = make(chan struct{}), make(chan struct{}, 1)
	t.Cleanup(func() { close(p.hold) })
	var calls atomic.Int32
	real := f.srv.afterFunc
	f.srv.afterFunc = func(d time.Duration, fire func()) func() bool {
		if calls.Add(1) == 1 { // the prefill's timer fires once the engine holds it
			go func() { <-p.entered; fire() }()
			return func() bool { return true }
		}
		return real(d, fire)
	}
	for _, want := range []string{"prefill_failed", "prefill_unavailable"} {
		resp := f.post("/v1/chat/completions", pdBody(false, "hello"))
		b := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		assert.Regexp(t, "^"+want+"; ", resp.Header.Get(HeaderDisagg))
	}
	assert.Len(t, p.requests(), 1, "the hanging prefill engine was asked once")
	assert.Len(t, f.decode[0].requests(), 2)
}

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

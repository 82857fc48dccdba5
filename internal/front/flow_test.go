package front

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/flow"
)

func TestFlowControlOffIsNil(t *testing.T) {
	f, err := NewFlowControl(flow.Options{}, nil, nil)
	require.NoError(t, err)
	assert.Nil(t, f)
	f.Kick("m") // a nil FlowControl is off: these do nothing
	f.FirstToken("m", gateway.Admission{PendingPrefill: 1})
	f.Close()
	f.SetObjectives(map[string]int{"a": 1})
	_, err = NewFlowControl(flow.Options{Enabled: true, Queue: flow.Config{TTL: -1}}, nil, nil)
	assert.ErrorIs(t, err, flow.ErrInvalid)
}

// A usage limit out of (0, 1] is refused, naming its priority and value;
// Admission scales the rule by the limit of the request's priority, and
// leaves it whole for a priority without one.
func TestFlowControlUsageLimits(t *testing.T) {
	for _, bad := range []float64{0, -0.5, 1.5} {
		_, err := NewFlowControl(flow.Options{Enabled: true, UsageLimits: map[int]float64{3: bad}}, nil, nil)
		require.ErrorIs(t, err, flow.ErrInvalid)
		assert.Contains(t, err.Error(), fmt.Sprintf("UsageLimits[3] %v", bad))
	}
	f, err := NewFlowControl(flow.Options{Enabled: true, Objectives: map[string]int{"chat": 1}, UsageLimits: map[int]float64{0: 0.5}}, nil, nil)
	require.NoError(t, err)
	defer f.Close()
	a := gateway.Admission{QueueDepth: 1, Outstanding: 128, PendingPrefill: 32, KVUtilization: 0.8}
	h := http.Header{}
	assert.Equal(t, gateway.Admission{QueueDepth: 1, Outstanding: 64, PendingPrefill: 16, KVUtilization: 0.4}, f.Admission(a, h), "priority 0: halved, queue depth kept at 1")
	h.Set(flow.HeaderObjective, "chat")
	assert.Equal(t, a, f.Admission(a, h), "priority 1: no limit")
}

// Priorities come from the objective header through the objectives,
// which SetObjectives replaces; a long fairness id is cut to its prefix.
func TestFlowControlObjectives(t *testing.T) {
	reg := prometheus.NewRegistry()
	f, err := NewFlowControl(flow.Options{Enabled: true, Objectives: map[string]int{"chat": 2}}, nil, reg)
	require.NoError(t, err)
	defer f.Close()
	h := http.Header{}
	h.Set(flow.HeaderObjective, "chat")
	assert.Equal(t, 2, f.Priority(h))
	f.SetObjectives(map[string]int{"chat": 5, "batch": -1})
	assert.Equal(t, 5, f.Priority(h))
	h.Set(flow.HeaderObjective, "unknown")
	assert.Equal(t, 0, f.Priority(h))
	h.Set(flow.HeaderObjective, "batch")
	err = f.Hold(context.Background(), "m", h, 10, func() bool { return false })
	assert.ErrorIs(t, err, flow.ErrSheddable)
	status, typ, code, _ := FlowAnswer("m", err)
	assert.Equal(t, []any{http.StatusTooManyRequests, TypeRateLimit, CodeShed}, []any{status, typ, code})
	h.Set(flow.HeaderFairnessID, string(make([]byte, 1000)))
	h.Set(flow.HeaderObjective, "chat")
	require.NoError(t, f.Hold(context.Background(), "m", h, 10, func() bool { return true }))
	n, err := reg.Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, m := range n {
		names[m.GetName()] = true
	}
	for _, want := range []string{"exa_gateway_flow_requests_total", "exa_gateway_flow_queue_duration_seconds", "exa_gateway_flow_queue_requests", "exa_gateway_flow_queue_bytes"} {
		assert.True(t, names[want], want)
	}
}

// TestFlowHeldMemory measures what a held request costs flow control
// (EXA_MEASURE=1): 10,000 requests held over 100 flows, each by its own
// goroutine as a front's handler holds it. The heap counts the queue's
// item, the waiter, its channel and the bind closure; the goroutines'
// stacks (the handler's own, which exists held or not) are reported
// apart.
func TestFlowHeldMemory(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("set EXA_MEASURE=1 to measure")
	}
	const n = 10_000
	f, err := NewFlowControl(flow.Options{Enabled: true, Queue: flow.Config{Total: flow.Limits{MaxRequests: n}}}, nil, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		h := http.Header{}
		h.Set(flow.HeaderFairnessID, fmt.Sprint("tenant-", i%100))
		go func() {
			defer wg.Done()
			_ = f.Hold(ctx, "m", h, 2048, func() bool { return false })
		}()
	}
	require.Eventually(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.ctls["m"] != nil && f.ctls["m"].ctl.Stats().Requests == n
	}, time.Minute, time.Millisecond)
	runtime.GC()
	runtime.ReadMemStats(&after)
	t.Logf("%d held: heap +%.0f bytes a request (+%d in all), goroutine stacks +%.0f bytes a request",
		n, float64(after.HeapAlloc-before.HeapAlloc)/n, after.HeapAlloc-before.HeapAlloc, float64(after.StackInuse-before.StackInuse)/n)
	cancel()
	wg.Wait()
	f.Close()
}

// One budget across models, and no model crowded out of it: with a
// tenant's flood on one model holding the whole budget, another model's
// requests are held, each displacing the flood's newest (answered 429
// displaced), not refused; the flood's own next request is refused.
func TestFlowControlAcrossModels(t *testing.T) {
	const budget, quiet = 64, 16
	reg := prometheus.NewRegistry()
	f, err := NewFlowControl(flow.Options{Enabled: true, Queue: flow.Config{Total: flow.Limits{MaxRequests: budget}}}, nil, reg)
	require.NoError(t, err)
	defer f.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held := func(model string) int { return heldIn(f, model) }
	hold := func(model, tenant string, out chan<- error) {
		h := http.Header{}
		h.Set(flow.HeaderFairnessID, tenant)
		go func() { out <- f.Hold(ctx, model, h, 1024, func() bool { return false }) }()
	}
	noisy := make(chan error, budget+1)
	for range budget {
		hold("batch", "noisy", noisy)
	}
	require.Eventually(t, func() bool { return held("batch") == budget }, 10*time.Second, time.Millisecond)
	hold("batch", "noisy", noisy)
	assert.ErrorIs(t, <-noisy, flow.ErrFull, "the flood's next is refused")

	chat := make(chan error, quiet)
	for i := range quiet {
		hold("chat", "quiet", chat)
		require.ErrorIs(t, <-noisy, flow.ErrDisplaced, "chat request %d", i)
	}
	require.Eventually(t, func() bool { return held("chat") == quiet }, 10*time.Second, time.Millisecond)
	assert.Equal(t, budget-quiet, held("batch"))
	select {
	case err := <-chat:
		t.Fatalf("a chat request was answered while held: %v", err)
	default:
	}
	status, _, _, _ := FlowAnswer("batch", flow.ErrDisplaced)
	assert.Equal(t, http.StatusTooManyRequests, status)
	cancel()
	for range quiet {
		assert.ErrorIs(t, <-chat, context.Canceled)
	}
	for range budget - quiet {
		assert.ErrorIs(t, <-noisy, context.Canceled)
	}
}

// TestFlowControlRetain: a reload that removes a model stops its queue:
// what it holds is answered flow.ErrClosed at once, its goroutine ends,
// and a later request of that name starts a new queue; a model kept keeps
// its queue and what it holds.
func TestFlowControlRetain(t *testing.T) {
	f, err := NewFlowControl(flow.Options{Enabled: true, Queue: flow.Config{TTL: time.Hour}}, nil, nil)
	require.NoError(t, err)
	defer f.Close()
	ctx := context.Background()
	hold := func(model string) <-chan error {
		out := make(chan error, 1)
		go func() { out <- f.Hold(ctx, model, http.Header{}, 1024, func() bool { return false }) }()
		return out
	}
	held := func(model string) int { return heldIn(f, model) }
	gone, kept := hold("gone"), hold("kept")
	require.Eventually(t, func() bool { return held("gone") == 1 && held("kept") == 1 }, 10*time.Second, time.Millisecond)
	f.mu.Lock()
	stopped := f.ctls["gone"].done
	f.mu.Unlock()
	f.Retain(nil, &fleet.State{Models: map[string]*fleet.Model{"kept": {Name: "kept"}}})
	require.ErrorIs(t, <-gone, flow.ErrClosed)
	<-stopped // its Run ended
	assert.Equal(t, 1, held("kept"), "the kept model's queue holds its request")
	select {
	case err := <-kept:
		t.Fatalf("the kept model's request was answered: %v", err)
	default:
	}
	again := hold("gone")
	require.Eventually(t, func() bool { return held("gone") == 1 }, 10*time.Second, time.Millisecond)
	f.Close()
	require.ErrorIs(t, <-again, flow.ErrClosed)
	require.ErrorIs(t, <-kept, flow.ErrClosed)
	var off *FlowControl
	off.Retain(nil, &fleet.State{}) // off: nothing
}

// heldIn is how many requests model's queue holds, 0 without a queue.
func heldIn(f *FlowControl, model string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if mf := f.ctls[model]; mf != nil {
		return mf.ctl.Stats().Requests
	}
	return 0
}

// TestFlowGaugesPerModel: a band a model's queue still holds after the
// objectives that made it were replaced is reported for that model
// alone, at every scrape; another model reports the configured
// priorities only (the series do not depend on the order the models are
// read in).
func TestFlowGaugesPerModel(t *testing.T) {
	reg := prometheus.NewRegistry()
	f, err := NewFlowControl(flow.Options{Enabled: true, Objectives: map[string]int{"hi": 7}, Queue: flow.Config{TTL: time.Hour}}, nil, reg)
	require.NoError(t, err)
	defer f.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := make(chan error, 2)
	hold := func(model, objective string) {
		h := http.Header{}
		h.Set(flow.HeaderObjective, objective)
		go func() { out <- f.Hold(ctx, model, h, 1, func() bool { return false }) }()
	}
	hold("a", "hi")
	hold("b", "")
	require.Eventually(t, func() bool { return heldIn(f, "a") == 1 && heldIn(f, "b") == 1 }, 10*time.Second, time.Millisecond)
	f.SetObjectives(nil) // band 7 is now held by "a" only, and configured nowhere
	want := map[string]float64{"a/0": 0, "a/7": 1, "b/0": 1}
	for range 64 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		got := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() != "exa_gateway_flow_queue_requests" {
				continue
			}
			for _, m := range mf.GetMetric() {
				l := map[string]string{}
				for _, lp := range m.GetLabel() {
					l[lp.GetName()] = lp.GetValue()
				}
				got[l["model"]+"/"+l["priority"]] = m.GetGauge().GetValue()
			}
		}
		require.Equal(t, want, got)
	}
	cancel()
	<-out
	<-out
}

// TestFlowSeriesFollowObjectives: the requests and queue-time series of a
// priority no objective has any more are dropped when the objectives
// change, so objectives that change over time (InferenceObjectives, which
// a cluster user writes) do not grow the series without bound: at most
// the configured priorities and 0 remain.
func TestFlowSeriesFollowObjectives(t *testing.T) {
	reg := prometheus.NewRegistry()
	f, err := NewFlowControl(flow.Options{Enabled: true}, nil, reg)
	require.NoError(t, err)
	defer f.Close()
	h := http.Header{}
	h.Set(flow.HeaderObjective, "o")
	for p := 1; p <= 50; p++ {
		f.SetObjectives(map[string]int{"o": p})
		require.NoError(t, f.Hold(context.Background(), "m", h, 1, func() bool { return true }))
		require.NoError(t, f.Hold(context.Background(), "m", http.Header{}, 1, func() bool { return true }))
	}
	mfs, err := reg.Gather()
	require.NoError(t, err)
	prios := map[string]map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() != "exa_gateway_flow_requests_total" && mf.GetName() != "exa_gateway_flow_queue_duration_seconds" {
			continue
		}
		prios[mf.GetName()] = map[string]bool{}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "priority" {
					prios[mf.GetName()][lp.GetValue()] = true
				}
			}
		}
	}
	want := map[string]bool{"0": true, "50": true}
	assert.Equal(t, map[string]map[string]bool{"exa_gateway_flow_requests_total": want, "exa_gateway_flow_queue_duration_seconds": want}, prios)
}

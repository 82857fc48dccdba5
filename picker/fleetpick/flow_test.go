package fleetpick

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/flow"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/internal/fronttest"
)

// TestPickerFlowHolds: with flow control on, a request past capacity
// holds its ext_proc stream instead of getting 429, the interactive
// objective's before the batch one, each picked when the slot frees; one
// held past its deadline gets 503.
func TestPickerFlowHolds(t *testing.T) {
	f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{popts: Options{ShedAbove: 1,
		Flow: flow.Options{Enabled: true, Objectives: map[string]int{"interactive": 1}, Retry: time.Millisecond}}})
	e := f.engines[0]
	gate := e.Gate()
	queued := func(n int) {
		require.Eventually(t, func() bool {
			return fronttest.Gauge(t, f.reg, "exa_gateway_flow_queue_requests", map[string]string{"model": testModel}) == float64(n)
		}, 10*time.Second, time.Millisecond)
	}
	statuses := make(chan int, 3)
	send := func(prompt, objective string) {
		go func() {
			resp := f.post("/v1/chat/completions", chatBody(testModel, true, "s", prompt), "x-gateway-inference-objective", objective)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses <- resp.StatusCode
		}()
	}
	send("first", "")
	<-e.Gated()
	send("batch", "")
	queued(1)
	send("chat", "interactive")
	queued(2)
	for _, want := range []string{"chat", "batch"} {
		next := e.Gate()
		gate()
		gate = next
		<-e.Gated()
		_, b := e.LastRequest()
		assert.Contains(t, string(b), `"content":"`+want+`"`)
	}
	gate()
	for range 3 {
		assert.Equal(t, http.StatusOK, <-statuses)
	}
	f.settle()
	assert.Equal(t, 3.0, f.counter("exa_gateway_flow_requests_total", map[string]string{"model": testModel, "outcome": "dispatched"}))
}

func TestPickerFlowDeadline(t *testing.T) {
	f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{popts: Options{ShedAbove: 1,
		Flow: flow.Options{Enabled: true, Queue: flow.Config{TTL: 20 * time.Millisecond}, Retry: time.Millisecond}}})
	e := f.engines[0]
	release, first := busyEngine(t, f)
	resp := f.post("/v1/chat/completions", chatBody(testModel, false, "s", "late"))
	b := readAll(t, resp)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", b)
	assert.Contains(t, string(b), "queue_timeout")
	release()
	<-first
	assert.Equal(t, int64(1), e.Requests())
}

// TestPickerFlowFirstTokenFreesPendingPrefill: with room counted in
// pending prefill, a held request goes at the first token of the request
// ahead of it, not at its end: the first token kicks the queue.
func TestPickerFlowFirstTokenFreesPendingPrefill(t *testing.T) {
	f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{popts: Options{
		Admission: gateway.Admission{PendingPrefill: 1},
		Flow:      flow.Options{Enabled: true, Retry: time.Hour, Queue: flow.Config{TTL: time.Hour}}}})
	fronttest.FirstTokenFreesPendingPrefill(t, f.engines[0], f.reg, testModel, func(prompt string) int {
		resp := f.post("/v1/chat/completions", chatBody(testModel, true, "s", prompt))
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	})
}

// TestPickerFlowUsageLimit: a band under a usage limit leaves headroom
// for the bands above it (fronttest.UsageLimitHeadroom).
func TestPickerFlowUsageLimit(t *testing.T) {
	f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{popts: Options{
		Admission: gateway.Admission{Outstanding: 2},
		Flow:      flow.Options{Enabled: true, Objectives: map[string]int{"interactive": 1}, UsageLimits: map[int]float64{0: 0.5}, Retry: time.Millisecond}}})
	fronttest.UsageLimitHeadroom(t, f.engines[0], f.reg, testModel, func(prompt, objective string) int {
		resp := f.post("/v1/chat/completions", chatBody(testModel, true, "s", prompt), "x-gateway-inference-objective", objective)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	})
}

// TestPickerFlowClientGoneCounted: a request whose client goes away while
// it is held leaves the queue and is counted as the HTTP gateway counts
// it, code 499 with reason client_canceled (front.OutcomeLabels), not a
// bare 499 that no other front records.
func TestPickerFlowClientGoneCounted(t *testing.T) {
	f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{popts: Options{ShedAbove: 1,
		Flow: flow.Options{Enabled: true, Queue: flow.Config{TTL: time.Hour}, Retry: time.Millisecond}}})
	e := f.engines[0]
	release, first := busyEngine(t, f)
	queued := func(n int) {
		require.Eventually(t, func() bool {
			return fronttest.Gauge(t, f.reg, "exa_gateway_flow_queue_requests", map[string]string{"model": testModel}) == float64(n)
		}, 10*time.Second, time.Millisecond)
	}
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.http.URL+"/v1/chat/completions", strings.NewReader(chatBody(testModel, false, "s", "gone")))
	require.NoError(t, err)
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	queued(1)
	cancel()
	<-gone
	queued(0)
	// The picker counts it once its Pick returns, after the client saw
	// the stream end.
	require.Eventually(t, func() bool {
		return fronttest.Counter(t, f.reg, "exa_gateway_requests_total", map[string]string{"code": "499"}) == 1
	}, 10*time.Second, time.Millisecond)
	assert.Equal(t, 1.0, fronttest.Counter(t, f.reg, "exa_gateway_requests_total", map[string]string{"code": "499", "reason": front.CodeClientCanceled}))
	assert.Equal(t, 1.0, fronttest.Counter(t, f.reg, "exa_gateway_flow_requests_total", map[string]string{"model": testModel, "outcome": "client_gone"}))
	release()
	<-first
	assert.Equal(t, int64(1), e.Requests(), "the held request reached no engine")
}

// TestPickerFlowRequestTimeoutCounted: a request held in the queue past
// the picker's RequestTimeout is answered 408, and counted as a 408 and
// as expired in the queue, not as a client gone (499, client_gone).
func TestPickerFlowRequestTimeoutCounted(t *testing.T) {
	f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{reqTimeout: 200 * time.Millisecond,
		popts: Options{ShedAbove: 1, Flow: flow.Options{Enabled: true, Queue: flow.Config{TTL: time.Hour}, Retry: time.Millisecond}}})
	e := f.engines[0]
	release, first := busyEngine(t, f)
	resp := f.post("/v1/chat/completions", chatBody(testModel, false, "s", "held"))
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusRequestTimeout, resp.StatusCode, "%s", b)
	require.Eventually(t, func() bool {
		return fronttest.Counter(t, f.reg, "exa_gateway_flow_requests_total", map[string]string{"model": testModel, "outcome": "expired"}) == 1
	}, 10*time.Second, time.Millisecond)
	require.Eventually(t, func() bool {
		return fronttest.Counter(t, f.reg, "exa_gateway_requests_total", map[string]string{"code": "408"}) == 1
	}, 10*time.Second, time.Millisecond)
	assert.Zero(t, fronttest.Counter(t, f.reg, "exa_gateway_flow_requests_total", map[string]string{"model": testModel, "outcome": "client_gone"}))
	assert.Zero(t, fronttest.Counter(t, f.reg, "exa_gateway_requests_total", map[string]string{"code": "499"}))
	release()
	<-first
	assert.Equal(t, int64(1), e.Requests(), "the held request reached no engine")
}

// busyEngine gates f's first engine and sends it a streamed request, which
// the engine holds until release: the replica is then full (ShedAbove 1),
// so later requests are held in the queue. first is closed once that
// request has ended. release may be called more than once, and is called
// when the test ends, before the fixture's own cleanup.
func busyEngine(t *testing.T, f *pickFixture) (release func(), first <-chan struct{}) {
	t.Helper()
	e := f.engines[0]
	var once sync.Once
	gate := e.Gate()
	release = func() { once.Do(gate) }
	t.Cleanup(release)
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp := f.post("/v1/chat/completions", chatBody(testModel, true, "s", "first"))
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}()
	<-e.Gated()
	return release, done
}

// TestPickerFlowPinnedReplicaNotEligible: with flow control on, a
// Responses API continuation whose replica is down is answered 503 at
// once, naming the response, as without flow control, rather than held
// until its deadline (it used to get queue_timeout after its TTL).
func TestPickerFlowPinnedReplicaNotEligible(t *testing.T) {
	f := newPickFixture(t, 2, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{popts: Options{ShedAbove: 1,
		Flow: flow.Options{Enabled: true, Queue: flow.Config{TTL: 20 * time.Millisecond}, Retry: time.Millisecond}}})
	status, home, id, out := f.respond("remember this", "", false)
	require.Equal(t, http.StatusOK, status, "%s", out)
	ep := f.srv.Snapshot().Endpoints[f.engines[home].URL()]
	f.srv.Observe(ep, ep.Health.Failure(true))
	status, _, _, out = f.respond("while it is down", id, false)
	assert.Equal(t, http.StatusServiceUnavailable, status, "%s", out)
	assert.Contains(t, string(out), id, "answered at once, naming the response")
	assert.NotContains(t, string(out), "queue_timeout")
	f.settle()
	assert.Zero(t, f.counter("exa_gateway_flow_requests_total", map[string]string{"model": testModel, "outcome": "expired"}))
	assert.Zero(t, f.engines[1-home].PathRequests("/v1/responses"), "no other engine holds the response")
}

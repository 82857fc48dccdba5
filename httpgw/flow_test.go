package httpgw

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/flow"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/internal/fronttest"
)

func flowOn(q flow.Config) func(*Options) {
	return func(o *Options) {
		o.Admission = gateway.Admission{Outstanding: 1}
		o.Flow = flow.Options{Enabled: true, Queue: q, Objectives: map[string]int{"interactive": 1, "batch": 0, "scavenger": -1}, Retry: time.Millisecond}
	}
}

// waitQueued waits until the gateway's queue for the test model holds n.
func (f *fixture) waitQueued(n int) {
	f.t.Helper()
	require.Eventually(f.t, func() bool {
		return fronttest.Gauge(f.t, f.reg, "exa_gateway_flow_queue_requests", map[string]string{"model": testModel}) == float64(n)
	}, 10*time.Second, time.Millisecond)
}

// lastPrompt is the last user message the engine received.
func lastPrompt(e *enginetest.Engine) string {
	_, b := e.LastRequest()
	s := string(b)
	i := strings.LastIndex(s, `"content":"`)
	if i < 0 {
		return ""
	}
	s = s[i+len(`"content":"`):]
	return s[:strings.IndexByte(s, '"')]
}

// TestFlowHoldsAndBindsLate: with one slot (Outstanding 1), requests past
// it wait instead of getting 429, and go one at a time as the slot frees,
// the interactive objective's first, then the batch ones in arrival order;
// each is routed when it goes.
func TestFlowHoldsAndBindsLate(t *testing.T) {
	f := newFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, flowOn(flow.Config{}))
	e := f.engines[0]
	gate := e.Gate()
	type answer struct {
		who    string
		status int
	}
	answers := make(chan answer, 4)
	send := func(who, objective string) {
		go func() {
			resp := f.post("/v1/chat/completions", fronttest.ChatBody(testModel, true, "sys", who), "x-gateway-inference-objective", objective, "x-gateway-inference-fairness-id", "tenant-"+who)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			answers <- answer{who, resp.StatusCode}
		}()
	}
	send("first", "batch")
	<-e.Gated()
	send("b1", "batch")
	f.waitQueued(1)
	send("b2", "batch")
	f.waitQueued(2)
	send("i1", "interactive")
	f.waitQueued(3)
	assert.Equal(t, int64(1), e.Requests(), "held requests reach no engine")

	for _, want := range []string{"i1", "b1", "b2"} {
		next := e.Gate()
		gate()
		gate = next
		<-e.Gated()
		assert.Equal(t, want, lastPrompt(e))
	}
	gate()
	for range 4 {
		a := <-answers
		assert.Equal(t, http.StatusOK, a.status, a.who)
	}
	f.settle()
	assert.Equal(t, 4.0, f.counter("exa_gateway_flow_requests_total", map[string]string{"model": testModel, "outcome": "dispatched"}))
	assert.Zero(t, f.counter("exa_gateway_requests_total", map[string]string{"code": "429"}))
}

// TestFlowAnswers: a request held past its deadline gets 503; a sheddable
// objective's gets 429 at once; a full queue 429; a client that goes away
// leaves the queue.
func TestFlowAnswers(t *testing.T) {
	f := newFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, flowOn(flow.Config{TTL: 30 * time.Millisecond, Total: flow.Limits{MaxRequests: 1}}))
	e := f.engines[0]
	release := e.Gate()
	go func() {
		resp := f.post("/v1/chat/completions", fronttest.ChatBody(testModel, true, "sys", "first"))
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}()
	<-e.Gated()

	resp := f.post("/v1/chat/completions", fronttest.ChatBody(testModel, false, "sys", "late"))
	b := readAll(t, resp)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", b)
	assert.Contains(t, string(b), "queue_timeout")

	resp = f.post("/v1/chat/completions", fronttest.ChatBody(testModel, false, "sys", "shed"), "x-gateway-inference-objective", "scavenger")
	b = readAll(t, resp)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s", b)
	assert.NotEmpty(t, resp.Header.Get("Retry-After"))

	// A client that goes away while held: it leaves the queue at once.
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.http.URL+"/v1/chat/completions", strings.NewReader(fronttest.ChatBody(testModel, false, "sys", "gone")))
	require.NoError(t, err)
	gone := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		gone <- err
	}()
	f.waitQueued(1)
	// The queue holds one: another is refused (429, queue full).
	resp = f.post("/v1/chat/completions", fronttest.ChatBody(testModel, false, "sys", "full"), "x-gateway-inference-fairness-id", "tenant-gone")
	b = readAll(t, resp)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s", b)
	cancel()
	<-gone
	f.waitQueued(0)
	release()
	f.settle()
	for outcome, n := range map[string]float64{"expired": 1, "shed_sheddable": 1, "client_gone": 1, "rejected_full": 1} {
		assert.Equal(t, n, f.counter("exa_gateway_flow_requests_total", map[string]string{"model": testModel, "outcome": outcome}), outcome)
	}
	assert.Equal(t, int64(1), e.Requests(), "no held request reached the engine")
}

// TestFlowScaleFromZero: with no healthy replica, requests wait (up to
// their deadline) and are served when one comes up.
func TestFlowScaleFromZero(t *testing.T) {
	f := newFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, flowOn(flow.Config{TTL: time.Minute}))
	e := f.engines[0]
	e.SetHealthy(false)
	for range fleet.DefaultEjectAfter {
		f.srv.ProbeAll(t.Context())
	}
	done := make(chan int, 1)
	go func() {
		resp := f.post("/v1/chat/completions", fronttest.ChatBody(testModel, false, "sys", "cold"))
		readAll(t, resp)
		done <- resp.StatusCode
	}()
	f.waitQueued(1)
	e.SetHealthy(true)
	for range fleet.DefaultReadmitAfter {
		f.srv.ProbeAll(t.Context())
	}
	assert.Equal(t, http.StatusOK, <-done)
}

// TestFlowFirstTokenFreesPendingPrefill: with room counted in pending
// prefill, a held request goes at the first token of the request ahead of
// it, not at its end: the first token kicks the queue.
func TestFlowFirstTokenFreesPendingPrefill(t *testing.T) {
	f := newFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, func(o *Options) {
		o.Admission = gateway.Admission{PendingPrefill: 1}
		o.Flow = flow.Options{Enabled: true, Retry: time.Hour, Queue: flow.Config{TTL: time.Hour}}
	})
	fronttest.FirstTokenFreesPendingPrefill(t, f.engines[0], f.reg, testModel, func(prompt string) int {
		resp := f.post("/v1/chat/completions", fronttest.ChatBody(testModel, true, "sys", prompt))
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	})
}

// TestFlowUsageLimit: a band under a usage limit leaves headroom for the
// bands above it (fronttest.UsageLimitHeadroom).
func TestFlowUsageLimit(t *testing.T) {
	f := newFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, func(o *Options) {
		o.Admission = gateway.Admission{Outstanding: 2}
		o.Flow = flow.Options{Enabled: true, Objectives: map[string]int{"interactive": 1}, UsageLimits: map[int]float64{0: 0.5}, Retry: time.Millisecond}
	})
	fronttest.UsageLimitHeadroom(t, f.engines[0], f.reg, testModel, func(prompt, objective string) int {
		resp := f.post("/v1/chat/completions", fronttest.ChatBody(testModel, true, "sys", prompt), "x-gateway-inference-objective", objective)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	})
}

// TestFlowPinnedReplicaNotEligible: with flow control on, a Responses API
// continuation whose replica has been ejected is answered 503 at once, as
// without flow control, rather than held until its deadline (it used to
// get queue_timeout after its TTL).
func TestFlowPinnedReplicaNotEligible(t *testing.T) {
	f := newFixture(t, 2, gateway.ModeCacheAware, enginetest.Options{}, flowOn(flow.Config{TTL: 50 * time.Millisecond}))
	resp := f.post("/v1/responses", `{"model":"`+testModel+`","input":"hello","instructions":"You are terse."}`)
	out := readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", out)
	replica := resp.Header.Get(HeaderReplica)
	prev := front.ResponseID(out)
	require.NotEmpty(t, prev)
	other := 0
	for i, e := range f.engines {
		if e.Name() == replica {
			e.SetHealthy(false)
		} else {
			other = i
		}
	}
	for range fleet.DefaultEjectAfter {
		f.srv.ProbeAll(t.Context())
	}
	resp = f.post("/v1/responses", `{"model":"`+testModel+`","input":"and now?","previous_response_id":"`+prev+`"}`)
	out = readAll(t, resp)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", out)
	assert.Contains(t, string(out), "no_healthy_replica", "answered at once, not held to its deadline")
	assert.Contains(t, string(out), replica, "names the replica that stored it")
	f.settle()
	assert.Zero(t, f.counter("exa_gateway_flow_requests_total", map[string]string{"model": testModel, "outcome": "expired"}))
	assert.Zero(t, f.engines[other].Requests(), "no other engine holds the response")
}

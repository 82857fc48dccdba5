package fronttest

import (
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway/httpgw/enginetest"
)

// FirstTokenFreesPendingPrefill is one scenario for both fronts: with
// room counted in pending prefill (gateway.Admission.PendingPrefill 1),
// flow control on, its periodic retry and its deadline an hour away, over
// the one engine e of model, a request B held behind request A goes at
// A's first token, which releases A's prefill, and not at A's end: only
// the front's kick at a first token can let it go. send sends a streamed
// chat request with the prompt given and returns its status once
// answered; reg is the front's registry.
func FirstTokenFreesPendingPrefill(t *testing.T, e *enginetest.Engine, reg prometheus.Gatherer, model string, send func(prompt string) int) {
	t.Helper()
	before := e.GateFirst() // A waits before its first token
	after := e.Gate()       // and after it, so that it does not end
	defer after()
	statuses := make(chan int, 2)
	go func() { statuses <- send("a") }()
	<-e.Gated() // A at the engine, its prefill pending
	go func() { statuses <- send("b") }()
	require.Eventually(t, func() bool {
		return Gauge(t, reg, "exa_gateway_flow_queue_requests", map[string]string{"model": model}) == 1
	}, 10*time.Second, time.Millisecond)
	assert.Equal(t, int64(1), e.Requests(), "B is held while A's prefill is pending")
	before()    // A's first token
	<-e.Gated() // A after its first chunk
	select {    // B at the engine, while A has not ended
	case <-e.Gated():
	case <-time.After(30 * time.Second): // a hang guard: without the kick B waits for its hour
		t.Fatal("B still held after A's first token")
	}
	assert.Equal(t, int64(2), e.Requests())
	after()
	for range 2 {
		assert.Equal(t, http.StatusOK, <-statuses)
	}
}

// UsageLimitHeadroom is one scenario for both fronts: with two slots
// (gateway.Admission.Outstanding 2), objective "interactive" at priority
// 1 and a usage limit of 0.5 for priority 0, over the one engine e of
// model, a batch request is held once one request is in flight, while an
// interactive one goes at once: the lower band leaves headroom for the
// higher. send sends a streamed chat request with the prompt and
// objective given and returns its status once answered; reg is the
// front's registry.
func UsageLimitHeadroom(t *testing.T, e *enginetest.Engine, reg prometheus.Gatherer, model string, send func(prompt, objective string) int) {
	t.Helper()
	release := e.Gate()
	defer release() // on a failure too: the fronts wait for their requests
	statuses := make(chan int, 3)
	go func() { statuses <- send("first", "") }()
	<-e.Gated()
	go func() { statuses <- send("batch", "") }()
	require.Eventually(t, func() bool { // the batch band's limit, ⌊2·0.5⌋ = 1, is reached
		return Gauge(t, reg, "exa_gateway_flow_queue_requests", map[string]string{"model": model}) == 1
	}, 10*time.Second, time.Millisecond)
	go func() { statuses <- send("chat", "interactive") }()
	<-e.Gated() // the interactive one is not held: its band has the second slot
	_, b := e.LastRequest()
	assert.Contains(t, string(b), `"content":"chat"`)
	assert.Equal(t, int64(2), e.Requests())
	release()
	for range 3 {
		assert.Equal(t, http.StatusOK, <-statuses)
	}
}

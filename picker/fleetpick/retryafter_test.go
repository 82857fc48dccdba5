package fleetpick

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/flow"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/internal/fronttest"
)

// TestPickerRetryAfter: every 429 the picker answers carries Retry-After,
// one scrape interval rounded up to a second, as the HTTP gateway's:
// shed by admission control, refused by a full flow-control queue, a
// sheddable objective's refusal, a pass-through request shed.
func TestPickerRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		name    string
		flow    flow.Options
		held    int    // requests held in the queue before the one refused
		path    string // of the refused request
		body    string
		headers []string
		code    string
	}{
		{name: "shed", path: "/v1/chat/completions", body: chatBody(testModel, false, "s", "shed"), code: "shed"},
		{name: "shed pass-through", path: "/v1/embeddings", body: `{"model":"` + testModel + `","input":"x"}`, code: "shed"},
		{name: "flow full", flow: flow.Options{Enabled: true, Queue: flow.Config{Total: flow.Limits{MaxRequests: 1}}, Retry: time.Millisecond},
			held: 1, path: "/v1/chat/completions", body: chatBody(testModel, false, "s", "full"), code: "shed"},
		{name: "flow sheddable", flow: flow.Options{Enabled: true, Objectives: map[string]int{"scavenger": -1}, Retry: time.Millisecond},
			path: "/v1/chat/completions", body: chatBody(testModel, false, "s", "scavenger"), headers: []string{"x-gateway-inference-objective", "scavenger"}, code: "shed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{popts: Options{ShedAbove: 1, Flow: tc.flow},
				fleet: func(o *fleet.Options) { o.ScrapeInterval = 2500 * time.Millisecond }})
			e := f.engines[0]
			gate := e.Gate()
			done := make(chan int, 1+tc.held)
			send := func(prompt string) {
				go func() {
					resp := f.post("/v1/chat/completions", chatBody(testModel, true, "s", prompt))
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					done <- resp.StatusCode
				}()
			}
			send("first")
			<-e.Gated()
			for range tc.held {
				send("held")
			}
			if tc.held > 0 {
				require.Eventually(t, func() bool {
					return fronttest.Gauge(t, f.reg, "exa_gateway_flow_queue_requests", map[string]string{"model": testModel}) == float64(tc.held)
				}, 10*time.Second, time.Millisecond)
			}
			resp := f.post(tc.path, tc.body, tc.headers...)
			b := readAll(t, resp)
			assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s", b)
			assert.Equal(t, tc.code, *decodeError(t, b).Code)
			assert.Equal(t, "3", resp.Header.Get("Retry-After"), "one scrape interval (2.5 s) rounded up")
			gate()
			for range 1 + tc.held {
				assert.Equal(t, http.StatusOK, <-done)
			}
			f.settle()
		})
	}
}

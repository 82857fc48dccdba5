package fleetpick

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/flow"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/internal/fronttest"
)

// TestPickerFlowNoReplicasWaits: with flow control on, a model configured
// with no replica at all (Kubernetes discovery of a pool with no ready
// pod) holds its ext_proc streams instead of answering 503 no_replicas,
// and picks the replica a later configuration gives it (scale from zero).
func TestPickerFlowNoReplicasWaits(t *testing.T) {
	f := newPickFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{popts: Options{ShedAbove: 1,
		Flow: flow.Options{Enabled: true, Retry: time.Millisecond}}})
	e := f.engines[0]
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {Mode: gateway.ModeCacheAware}}}))
	statuses := make(chan int, 2)
	for _, p := range []string{"cold one", "cold two"} {
		go func() {
			resp := f.post("/v1/chat/completions", chatBody(testModel, false, "s", p))
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses <- resp.StatusCode
		}()
	}
	require.Eventually(t, func() bool {
		return fronttest.Gauge(t, f.reg, "exa_gateway_flow_queue_requests", map[string]string{"model": testModel}) == 2
	}, 10*time.Second, time.Millisecond)
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {Mode: gateway.ModeCacheAware,
		Replicas: []config.Replica{{Name: "e0", Address: e.URL()}}}}}))
	assert.Equal(t, http.StatusOK, <-statuses)
	assert.Equal(t, http.StatusOK, <-statuses)
	assert.Equal(t, int64(2), e.Requests())
}

// TestPickerFlowNoReplicasPDGatewayMode: a request held for a
// disaggregated model whose decode pool has no replica yet is answered,
// once the pool has one, as any request to that model is: in P/D mode
// gateway, 500 naming the setting to change, not routed as in sidecar
// mode.
func TestPickerFlowNoReplicasPDGatewayMode(t *testing.T) {
	f := newPickFixture(t, 2, gateway.ModeCacheAware, enginetest.Options{}, pickSetup{popts: Options{ShedAbove: 1,
		Flow: flow.Options{Enabled: true, Retry: time.Millisecond}}})
	zero := 0
	model := func(decode ...config.Replica) config.Model {
		return config.Model{Disaggregate: true, PDMode: config.PDModeGateway, PDMinUncachedTokens: &zero,
			PrefillPool: "prefill", DecodePool: "decode", Pools: map[string][]config.Replica{
				"prefill": {{Name: "p0", Address: f.engines[1].URL()}},
				"decode":  decode,
			}}
	}
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: model()}}))
	type answer struct {
		status int
		body   []byte
	}
	answers := make(chan answer, 1)
	go func() {
		resp := f.post("/v1/chat/completions", chatBody(testModel, false, "s", "cold"))
		answers <- answer{resp.StatusCode, readAll(t, resp)}
	}()
	require.Eventually(t, func() bool {
		return fronttest.Gauge(t, f.reg, "exa_gateway_flow_queue_requests", map[string]string{"model": testModel}) == 1
	}, 10*time.Second, time.Millisecond)
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: model(config.Replica{Name: "d0", Address: f.engines[0].URL()})}}))
	a := <-answers
	assert.Equal(t, http.StatusInternalServerError, a.status, "%s", a.body)
	assert.Contains(t, string(a.body), "--pd-mode sidecar")
	assert.Zero(t, f.engines[0].Requests()+f.engines[1].Requests(), "no engine was sent the request")
	// A request after the scale-up gets the same answer.
	resp := f.post("/v1/chat/completions", chatBody(testModel, false, "s", "warm"))
	b := readAll(t, resp)
	assert.Equal(t, http.StatusInternalServerError, resp.StatusCode, "%s", b)
}

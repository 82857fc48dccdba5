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

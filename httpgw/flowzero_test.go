package httpgw

import (
	"net/http"
	"strings"
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

// TestFlowNoReplicasWaits: with flow control on, a model configured with
// no replica at all (Kubernetes discovery of a pool with no ready pod)
// holds its requests instead of answering 503 no_replicas, and serves
// them once a configuration gives it a replica (scale from zero); without
// flow control it still answers 503 at once.
func TestFlowNoReplicasWaits(t *testing.T) {
	f := newFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, flowOn(flow.Config{TTL: time.Minute}))
	e := f.engines[0]
	none := &config.File{Version: 1, Models: map[string]config.Model{testModel: {Mode: gateway.ModeCacheAware}}}
	require.NoError(t, f.srv.Apply(none))
	done := make(chan int, 2)
	for _, p := range []string{"cold one", "cold two"} {
		go func() {
			resp, err := http.Post(f.http.URL+"/v1/chat/completions", "application/json", strings.NewReader(fronttest.ChatBody(testModel, false, "sys", p)))
			if err != nil {
				done <- -1
				return
			}
			resp.Body.Close()
			done <- resp.StatusCode
		}()
	}
	f.waitQueued(2)
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {Mode: gateway.ModeCacheAware,
		Replicas: []config.Replica{{Name: "e0", Address: e.URL()}}}}}))
	assert.Equal(t, http.StatusOK, <-done)
	assert.Equal(t, http.StatusOK, <-done)
	assert.Equal(t, int64(2), e.Requests())

	off := newFixture(t, 0, gateway.ModeCacheAware, enginetest.Options{})
	require.NoError(t, off.srv.Apply(none))
	resp := off.post("/v1/chat/completions", fronttest.ChatBody(testModel, false, "sys", "cold"))
	readAll(t, resp)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
}

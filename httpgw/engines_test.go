package httpgw

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Engines exposing SGLang's (or TensorRT-LLM's) metric names, the
// model's engine type left to autodetection or named: their load shows
// in /stats with the type, and drives load-aware routing away from the
// busy one.
func TestEngineTypeLoadDrivesRouting(t *testing.T) {
	for _, tc := range []struct{ metrics, configured string }{
		{"sglang", config.EngineAuto}, {"sglang", config.EngineSGLang},
		{"trtllm", config.EngineAuto}, {"trtllm", config.EngineTRTLLM},
	} {
		t.Run(tc.metrics+"/"+tc.configured, func(t *testing.T) {
			f := newFixture(t, 2, gateway.ModeLoadAware, enginetest.Options{Metrics: tc.metrics})
			cfg := f.srv.Snapshot().File.Models[testModel]
			cfg.Engine = tc.configured
			require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: cfg}}))
			f.engines[0].SetLoad(7, 3, 0.5)
			f.engines[1].SetLoad(0, 1, 0.1)
			f.srv.ScrapeAll(context.Background())

			resp, err := http.Get(f.http.URL + "/stats")
			require.NoError(t, err)
			var st Stats
			require.NoError(t, json.Unmarshal(readAll(t, resp), &st))
			e0 := st.Engines[indexOf(f, 0)]
			assert.Equal(t, tc.metrics, e0.Engine)
			assert.Empty(t, e0.LoadWarning)
			require.NotNil(t, e0.Load)
			assert.Equal(t, fleet.EngineLoad{Waiting: 7, Running: 3, KVUtilization: 0.5}, *e0.Load)

			for range 3 {
				resp := f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "hi"))
				readAll(t, resp)
				assert.Equal(t, "e1", resp.Header.Get(HeaderReplica), "load-aware routing avoids the loaded engine")
			}
		})
	}
}

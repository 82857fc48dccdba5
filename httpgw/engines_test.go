package httpgw

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
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
			cfg := f.srv.state.Load().File.Models[testModel]
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
			assert.Equal(t, EngineLoad{Waiting: 7, Running: 3, KVUtilization: 0.5}, *e0.Load)

			for range 3 {
				resp := f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "hi"))
				readAll(t, resp)
				assert.Equal(t, "e1", resp.Header.Get(HeaderReplica), "load-aware routing avoids the loaded engine")
			}
		})
	}
}

// A model whose engines expose another type's names than the one
// configured (or no known names at all) reads as idle: /stats says so
// with a warning naming the series expected, and so does the log, once.
func TestEngineTypeMismatchWarns(t *testing.T) {
	f := newFixture(t, 1, gateway.ModeLoadAware, enginetest.Options{Metrics: "sglang"})
	cfg := f.srv.state.Load().File.Models[testModel]
	cfg.Engine = config.EngineVLLM
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: cfg}}))
	var logs logBuffer
	f.srv.log = logs.logger()
	f.engines[0].SetLoad(7, 3, 0.5)
	f.srv.ScrapeAll(context.Background())
	f.srv.ScrapeAll(context.Background())
	e0 := f.stats().Engines[0]
	assert.Equal(t, "", e0.Engine)
	assert.Contains(t, e0.LoadWarning, "no vllm load series")
	assert.Contains(t, e0.LoadWarning, "vllm:num_requests_waiting")
	require.NotNil(t, e0.Load)
	assert.Equal(t, EngineLoad{}, *e0.Load)
	assert.Equal(t, 1, logs.count("none of the expected load series"), logs.String())
	assert.Contains(t, logs.String(), "--engine vllm|sglang|trtllm")
}

// logBuffer collects a logger's text output; safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) count(s string) int { return strings.Count(l.String(), s) }

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

package fleet

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A model whose engines expose another type's names than the one
// configured (or no known names at all) reads as idle: /stats says so
// with a warning naming the series expected, and so does the log, once.
func TestEngineTypeMismatchWarns(t *testing.T) {
	engine := enginetest.New(enginetest.Options{Metrics: "sglang", Model: testModel, Name: "e0"})
	t.Cleanup(engine.Close)
	var logs logBuffer
	s, err := New(Options{Logger: logs.logger()})
	require.NoError(t, err)
	cfg := config.Model{Mode: gateway.ModeLoadAware, Engine: config.EngineVLLM, Replicas: []config.Replica{{Name: "e0", Address: engine.URL()}}}
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: cfg}}))
	engine.SetLoad(7, 3, 0.5)
	s.ScrapeAll(context.Background())
	s.ScrapeAll(context.Background())
	e0 := s.Stats().Engines[0]
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

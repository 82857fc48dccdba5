package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// At debug, one JSON line per request with its status and size; at info,
// the handler is not wrapped.
func TestLogRequests(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTeapot)
		_, _ = w.Write([]byte("short and stout"))
		require.NoError(t, http.NewResponseController(w).Flush())
	})
	var buf bytes.Buffer
	debug := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	rec := httptest.NewRecorder()
	logRequests(h, debug).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil))
	assert.Equal(t, http.StatusTeapot, rec.Code)
	assert.True(t, rec.Flushed)
	var line map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &line), "%s", buf.String())
	assert.Equal(t, "request", line["msg"])
	assert.Equal(t, "/v1/chat/completions", line["path"])
	assert.Equal(t, float64(http.StatusTeapot), line["status"])
	assert.Equal(t, float64(15), line["bytes"])

	info := slog.New(slog.NewJSONHandler(&buf, nil))
	buf.Reset()
	logRequests(h, info).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	assert.Empty(t, buf.String())
	assert.Nil(t, logStreams(info))
	assert.NotNil(t, logStreams(debug))
}

package httpgw

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// corsEngine answers as vLLM's server does with its default CORS
// middleware (allowed origins "*"): every answer to a request with an
// Origin carries Access-Control-Allow-Origin: *. A body asking for a
// stream gets a short SSE stream, another a JSON answer.
func corsEngine(t *testing.T) string {
	t.Helper()
	return newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		h := w.Header()
		if r.Header.Get("Origin") != "" {
			h.Set("Access-Control-Allow-Origin", "*")
			h.Set("Access-Control-Allow-Credentials", "true")
		}
		h.Set("Vary", "Accept-Encoding")
		if strings.Contains(string(b), `"stream":true`) {
			h.Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, `data: {"id":"x","object":"chat.completion.chunk","model":"m1","choices":[{"index":0,"delta":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`+"\n\n"+"data: [DONE]\n\n")
			return
		}
		h.Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","model":"m1","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"data":[]}`)
	})).URL
}

// With Options.CORSOrigins the gateway's CORS answer is the one the
// browser gets: an engine's own Access-Control-* headers (vLLM's
// middleware allows any origin by default) are not relayed, so an origin
// the gateway does not allow gets no Access-Control-Allow-Origin, and an
// allowed one gets the gateway's, with its exposed headers and Vary:
// Origin kept beside the engine's Vary. Relayed, assembled and
// pass-through answers alike.
func TestCORSOverridesEngineHeaders(t *testing.T) {
	for _, mode := range []UpstreamStreamMode{UpstreamStreamOn, UpstreamStreamOff} {
		f := rawFixture(t, Options{CORSOrigins: []string{"https://app.example"}, UpstreamStream: mode}, corsEngine(t))
		for _, path := range []string{"/v1/chat/completions", "/v1/embeddings"} {
			body := chatBody(testModel, false, "s", "hi")
			if path == "/v1/embeddings" {
				body = `{"model":"m1","input":"x"}`
			}
			resp := f.post(path, body, "Origin", "https://evil.example")
			b := readAll(t, resp)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", path, b)
			assert.Empty(t, resp.Header.Values("Access-Control-Allow-Origin"), "mode %d %s: an origin not allowed", mode, path)
			assert.Empty(t, resp.Header.Values("Access-Control-Allow-Credentials"), "mode %d %s", mode, path)

			resp = f.post(path, body, "Origin", "https://app.example")
			b = readAll(t, resp)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", path, b)
			assert.Equal(t, []string{"https://app.example"}, resp.Header.Values("Access-Control-Allow-Origin"), "mode %d %s", mode, path)
			assert.Contains(t, resp.Header.Get("Access-Control-Expose-Headers"), HeaderReplica, "mode %d %s", mode, path)
			vary := strings.Join(resp.Header.Values("Vary"), ", ")
			assert.Contains(t, vary, "Origin", "mode %d %s", mode, path)
			assert.Contains(t, vary, "Accept-Encoding", "mode %d %s", mode, path)
		}
	}
}

package fronttest

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/internal/front"
)

// PendingPrefill returns the pending prefill at each replica of g, by
// name.
func PendingPrefill(g *gateway.Gateway) map[string]int {
	out := map[string]int{}
	for _, r := range g.Replicas() {
		out[r.Name] = r.PendingPrefill
	}
	return out
}

// AssembledAnswer checks, for both fronts, the answer resp (its body b)
// that a front assembled from the stream of the one engine "e0" of
// enginetest, asked with three chunks: 200, application/json, the
// replica and the engine's own headers, the object of kind ("chat" or
// "completions") with the chunks' text and the final chunk's usage. It
// returns the answer's first choice.
func AssembledAnswer(t *testing.T, kind string, resp *http.Response, b []byte) (choice map[string]any) {
	t.Helper()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	assert.Equal(t, "e0", resp.Header.Get(front.HeaderReplica))
	assert.Equal(t, "e0", resp.Header.Get("X-Engine"), "the engine's own headers are kept")
	var got map[string]any
	require.NoError(t, json.Unmarshal(b, &got), "%s", b)
	choice = got["choices"].([]any)[0].(map[string]any)
	if kind == "chat" {
		assert.Equal(t, "chat.completion", got["object"])
		assert.Equal(t, map[string]any{"role": "assistant", "content": "tok0 tok1 tok2 "}, choice["message"])
	} else {
		assert.Equal(t, "text_completion", got["object"])
		assert.Equal(t, "tok0 tok1 tok2 ", choice["text"])
	}
	assert.Equal(t, 3.0, got["usage"].(map[string]any)["completion_tokens"], "usage from the final chunk")
	return choice
}

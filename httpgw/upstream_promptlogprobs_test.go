package httpgw

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUpstreamStreamSkipsPromptLogprobs: vLLM refuses "prompt_logprobs"
// with "stream": true (400 "`prompt_logprobs` are not available when
// `stream=True`."), so a non-streamed request asking for them is
// forwarded as it is, as one naming best_of or use_beam_search is, and
// the client gets the engine's answer, not a 400 the gateway's rewrite
// caused.
func TestUpstreamStreamSkipsPromptLogprobs(t *testing.T) {
	var got []string
	addr := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := readAllReq(r)
		got = append(got, body)
		if strings.Contains(body, `"stream":true`) && strings.Contains(body, `"prompt_logprobs"`) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":{"message":"`+"`prompt_logprobs` are not available when `stream=True`."+`","type":"BadRequestError","param":"prompt_logprobs","code":400}}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"prompt_logprobs":[null,{"1":{"logprob":-1.0}}]}`)
	})).URL
	f := rawFixture(t, Options{}, addr)
	for path, body := range map[string]string{
		"/v1/chat/completions": `{"model":"` + testModel + `","messages":[{"role":"user","content":"q"}],"prompt_logprobs":1}`,
		"/v1/completions":      `{"model":"` + testModel + `","prompt":"q","prompt_logprobs":1}`,
	} {
		resp := f.post(path, body)
		b := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", path, b)
		assert.Contains(t, string(b), `"prompt_logprobs"`)
		assert.Equal(t, body, got[len(got)-1], "%s: forwarded as sent", path)
	}
	assert.Zero(t, f.counter("exa_gateway_upstream_streamed_total", nil))
}

package httpgw

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/httpgw/enginetest"
)

// TestUpstreamStreamSkipsChoices (issue 30): a non-streamed request for
// several choices (n > 1) is forwarded as it is, not streamed from the
// engine, so the client gets the engine's own answer; n 1 (or another
// type, which the engine judges) is streamed as any request.
func TestUpstreamStreamSkipsChoices(t *testing.T) {
	f := newFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{})
	for _, tc := range []struct {
		path, body string
		streamed   bool
	}{
		{"/v1/chat/completions", `{"model":"m1","n":3,"messages":[{"role":"user","content":"hi"}]}`, false},
		{"/v1/completions", `{"model":"m1","prompt":"hi","n":2}`, false},
		{"/v1/chat/completions", `{"model":"m1","n":1,"messages":[{"role":"user","content":"hi"}]}`, true},
		{"/v1/completions", `{"model":"m1","prompt":"hi","n":null}`, true},
	} {
		resp := f.post(tc.path, tc.body)
		out := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", tc.body, out)
		_, sent := f.engines[0].LastRequest()
		if !tc.streamed {
			assert.Equal(t, tc.body, string(sent), "forwarded as it is")
		} else {
			assert.Contains(t, string(sent), `"stream":true`, tc.body)
		}
	}
}

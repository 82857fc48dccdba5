package httpgw

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/flow"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/stretchr/testify/require"
)

// TestRefusalsCounted: a request refused 401 (no API key) or 429 (over
// the rate) is counted in exa_gateway_requests_total with its code, on
// /v1/models as on the model endpoints (a 405 on /v1/models is).
func TestRefusalsCounted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	require.NoError(t, os.WriteFile(path, []byte("sk-client-0001\n"), 0o600))
	f := newFixtureOpts(t, 1, gateway.ModeCacheAware, enginetest.Options{}, Options{APIKeysFile: path,
		RateLimit: flow.RateLimit{Rate: flow.Rate{PerSecond: 0.001, Burst: 1}}})
	chat := `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`
	resp := f.post("/v1/chat/completions", chat)
	readAll(t, resp)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	for range 2 {
		resp = f.post("/v1/chat/completions", chat, "Authorization", "Bearer sk-client-0001")
		readAll(t, resp)
	}
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	resp, _ = f.do(http.MethodGet, "/v1/models", "")
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	f.settle()
	require.EqualValues(t, 1, f.counter("exa_gateway_requests_total", map[string]string{"endpoint": "chat", "code": "401"}))
	require.EqualValues(t, 1, f.counter("exa_gateway_requests_total", map[string]string{"endpoint": "chat", "code": "429"}))
	require.EqualValues(t, 1, f.counter("exa_gateway_requests_total", map[string]string{"endpoint": "models", "code": "401"}))
}

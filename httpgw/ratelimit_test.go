package httpgw

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/flow"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/stretchr/testify/require"
)

// TestRateLimit: with Options.RateLimit each client (here by X-Api-Key,
// else by address) gets its burst, then 429 rate_limited with
// Retry-After, before its body is read and before any engine; another
// client is not held back; the embeddings and stored-response endpoints
// count too; the refusals are on /metrics; time gives the burst back.
func TestRateLimit(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	f := newFixtureOpts(t, 1, gateway.ModeCacheAware, enginetest.Options{},
		Options{Clock: clock, RateLimit: flow.RateLimit{Rate: flow.Rate{PerSecond: 0.5, Burst: 2}, Key: "header:X-Api-Key"}})
	chat := `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`
	post := func(key string) *http.Response {
		resp := f.post("/v1/chat/completions", chat, "X-Api-Key", key)
		readAll(t, resp)
		return resp
	}
	for i := range 2 {
		require.Equal(t, http.StatusOK, post("a").StatusCode, "request %d of a's burst", i)
	}
	engine := f.engines[0].Requests()
	resp := f.post("/v1/chat/completions", chat, "X-Api-Key", "a")
	body := readAll(t, resp)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.Equal(t, "2", resp.Header.Get("Retry-After"), "one interval, 2 s")
	require.Contains(t, string(body), `"code":"rate_limited"`)
	require.Contains(t, string(body), "rate limit of 0.5 requests/s (burst 2)")
	require.Equal(t, engine, f.engines[0].Requests(), "no engine reached")
	require.Equal(t, http.StatusOK, post("b").StatusCode, "another client has its own burst")
	resp = f.post("/v1/embeddings", `{"model":"m1","input":"x"}`, "X-Api-Key", "a")
	readAll(t, resp)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "embeddings count too")
	resp, _ = f.do(http.MethodGet, "/v1/responses/resp_1", "")
	require.Equal(t, http.StatusNotFound, resp.StatusCode, "no key: by address, which has its burst")

	// The body of a limited request is not read.
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", failingReader{})
	req.Header.Set("X-Api-Key", "a")
	f.srv.ServeHTTP(rec, req)
	require.Equal(t, http.StatusTooManyRequests, rec.Code)

	f.settle()
	require.EqualValues(t, 3, f.counter("exa_gateway_rate_limited_total", nil))
	require.EqualValues(t, 3, f.series("exa_gateway_rate_limit_clients", nil)[0].GetGauge().GetValue(), "a, b and the address")

	mu.Lock()
	now = now.Add(2 * time.Second)
	mu.Unlock()
	require.Equal(t, http.StatusOK, post("a").StatusCode, "one interval later, one more")
	require.Equal(t, http.StatusTooManyRequests, post("a").StatusCode)
}

// failingReader fails the test's request if its body is read.
type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { panic(errors.New("the body was read")) }

func TestRateLimitInvalid(t *testing.T) {
	_, err := New(Options{RateLimit: flow.RateLimit{Rate: flow.Rate{PerSecond: 1}}})
	require.ErrorIs(t, err, ErrInvalidOptions)
	require.ErrorContains(t, err, "RateLimit: ")
	require.ErrorContains(t, err, "Rate.Burst 0")
	require.True(t, strings.Contains(err.Error(), "want at least 1"))
}

// TestAPIKeys: with Options.APIKeysFile the model endpoints and
// /v1/models answer 401 invalid_api_key, before the body is read and
// before any engine, to a request without a key in the file; a key in
// it is served, its header forwarded; /health and /stats stay open; a
// changed file is in force a second later.
func TestAPIKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	require.NoError(t, os.WriteFile(path, []byte("sk-client-0001\n"), 0o600))
	var mu sync.Mutex
	now := time.Unix(1_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	f := newFixtureOpts(t, 1, gateway.ModeCacheAware, enginetest.Options{}, Options{Clock: clock, APIKeysFile: path})
	chat := `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`
	status := func(path, body string, hdr ...string) int {
		var resp *http.Response
		if body == "" {
			req, err := http.NewRequest(http.MethodGet, f.http.URL+path, nil)
			require.NoError(t, err)
			if len(hdr) > 0 {
				req.Header.Set(hdr[0], hdr[1])
			}
			resp, err = http.DefaultClient.Do(req)
			require.NoError(t, err)
			readAll(t, resp)
		} else {
			resp = f.post(path, body, hdr...)
			readAll(t, resp)
		}
		return resp.StatusCode
	}
	for _, hdr := range [][]string{nil, {"Authorization", "Bearer sk-other-0001"}, {"Authorization", "sk-client-0001"}} {
		require.Equal(t, http.StatusUnauthorized, status("/v1/chat/completions", chat, hdr...), "%v", hdr)
		require.Equal(t, http.StatusUnauthorized, status("/v1/embeddings", `{"model":"m1","input":"x"}`, hdr...), "%v", hdr)
		require.Equal(t, http.StatusUnauthorized, status("/v1/models", "", hdr...), "%v", hdr)
	}
	require.Zero(t, f.engines[0].Requests(), "no engine reached")
	resp := f.post("/v1/completions", `{"model":"m1","prompt":"x"}`)
	body := readAll(t, resp)
	require.Equal(t, `Bearer realm="exa-gateway"`, resp.Header.Get("WWW-Authenticate"))
	require.Contains(t, string(body), `"code":"invalid_api_key"`)
	rec := httptest.NewRecorder()
	f.srv.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", failingReader{}))
	require.Equal(t, http.StatusUnauthorized, rec.Code, "the body of a refused request is not read")

	require.Equal(t, http.StatusOK, status("/v1/chat/completions", chat, "Authorization", "Bearer sk-client-0001"))
	require.Equal(t, http.StatusOK, status("/v1/models", "", "Authorization", "bearer sk-client-0001"))
	require.Equal(t, http.StatusOK, status("/health", ""))
	require.Equal(t, http.StatusOK, status("/stats", ""))
	f.settle()
	require.EqualValues(t, 11, f.counter("exa_gateway_unauthorized_total", nil))

	require.NoError(t, os.WriteFile(path, []byte("sk-client-0002\n"), 0o600))
	require.NoError(t, os.Chtimes(path, time.Now(), time.Now().Add(time.Hour)))
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	require.Equal(t, http.StatusUnauthorized, status("/v1/chat/completions", chat, "Authorization", "Bearer sk-client-0001"))
	require.Equal(t, http.StatusOK, status("/v1/chat/completions", chat, "Authorization", "Bearer sk-client-0002"))

	_, err := New(Options{APIKeysFile: filepath.Join(t.TempDir(), "missing")})
	require.ErrorIs(t, err, ErrInvalidOptions)
	require.ErrorContains(t, err, "APIKeysFile: API keys file: ")
}

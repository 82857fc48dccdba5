package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGatewayBadEngineFlags: a bad --engine-client, a negative engine
// timeout, a budget that is not positive or a body bound past 1 TiB is a
// usage error naming the flag, reported before anything listens.
func TestGatewayBadEngineFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--engine-client", "bogus"}, `invalid --engine-client "bogus": want pool or std`},
		{[]string{"--first-byte-timeout", "-1s"}, `invalid --first-byte-timeout "-1s": must not be negative`},
		{[]string{"--response-timeout", "-1s"}, `invalid --response-timeout "-1s": must not be negative`},
		{[]string{"--max-assembled-bytes", "0"}, `invalid --max-assembled-bytes "0": must be positive`},
		{[]string{"--max-connections", "0"}, `invalid --max-connections "0": must be at least 1`},
		{[]string{"--max-connections-per-client", "-1"}, `invalid --max-connections-per-client "-1": must not be negative`},
		{[]string{"--max-request-bytes", "-1"}, `invalid --max-request-bytes "-1": must be 0 (the default) or at least 4 × --max-body-bytes (33554432)`},
		{[]string{"--max-request-bytes", "1000", "--max-body-bytes", "251"}, `invalid --max-request-bytes "1000": must be 0 (the default) or at least 4 × --max-body-bytes (1004)`},
		{[]string{"--max-body-bytes", "1099511627777"}, `invalid --max-body-bytes "1099511627777": at most 1099511627776 (1 TiB)`},
		// 4 × --max-body-bytes would wrap past the int64 range.
		{[]string{"--max-body-bytes", "3000000000000000000", "--max-request-bytes", "5"}, `invalid --max-body-bytes "3000000000000000000": at most 1099511627776 (1 TiB)`},
	} {
		t.Run(tt.args[0], func(t *testing.T) {
			r := exa(t, newConfig(t), append([]string{"serve", "gateway", "--listen", "127.0.0.1:0"}, tt.args...)...)
			assert.Equal(t, 2, r.code, "stderr: %s", r.stderr)
			assert.Contains(t, r.stderr, tt.want)
			assert.True(t, strings.HasPrefix(r.stderr, "exa: "), r.stderr)
		})
	}
}

// The pprof handler serves the profile index and the named profiles.
func TestPprofHandler(t *testing.T) {
	srv := httptest.NewServer(pprofHandler())
	defer srv.Close()
	for _, tt := range []struct{ path, want string }{
		{"/debug/pprof/", "goroutine"},
		{"/debug/pprof/goroutine?debug=1", "goroutine profile"},
		{"/debug/pprof/cmdline", ""},
	} {
		resp, err := http.Get(srv.URL + tt.path)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, resp.StatusCode, tt.path)
		assert.Contains(t, string(b), tt.want, tt.path)
	}
}

// An address that cannot be listened on is a usage error naming the flag.
func TestGatewayBadPprofListen(t *testing.T) {
	r := exa(t, newConfig(t), "serve", "gateway", "--listen", "127.0.0.1:0", "--pprof-listen", "256.0.0.1:x")
	assert.Equal(t, 2, r.code, "stderr: %s", r.stderr)
	assert.Contains(t, r.stderr, `invalid --pprof-listen "256.0.0.1:x"`)
}

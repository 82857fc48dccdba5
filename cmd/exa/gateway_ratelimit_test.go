package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/picker/pickertest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestGatewayRateLimit: `exa serve gateway` and `exa serve picker` (behind
// pickertest's Envoy) with `--rate-limit 0.001 --rate-limit-burst 2
// --rate-limit-key header:X-Api-Key` serve a client's burst, then answer
// 429 rate_limited with Retry-After, while another key is served;
// /metrics counts the refusal.
func TestGatewayRateLimit(t *testing.T) {
	e := enginetest.New(enginetest.Options{Name: "e0", Model: "m"})
	t.Cleanup(e.Close)
	cfg := newConfig(t)
	ok(t, cfg, "serve", "routing", "set", "m", "--replica", "r0="+e.URL())
	args := []string{"--rate-limit", "0.001", "--rate-limit-burst", "2", "--rate-limit-key", "header:X-Api-Key"}
	for _, fr := range []string{"gateway", "picker"} {
		t.Run(fr, func(t *testing.T) {
			var base, metrics string
			if fr == "gateway" {
				base, _ = startGatewayWith(t, cfg, append([]string{"--listen", "127.0.0.1:0"}, args...)...)
				metrics = base
			} else {
				addr, line, _, _ := startPickerWith(t, cfg, append([]string{"--admin-listen", "127.0.0.1:0"}, args...)...)
				admin := regexp.MustCompile(`admin (http://\S+) `).FindStringSubmatch(line)
				require.NotNil(t, admin, "start-up line %q", line)
				metrics = admin[1]
				c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
				require.NoError(t, err)
				t.Cleanup(func() { c.Close() })
				srv := httptest.NewServer(&pickertest.Envoy{Client: pickertest.NewClient(c)})
				t.Cleanup(srv.Close)
				base = srv.URL
			}
			post := func(key string) (*http.Response, string) {
				req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
				require.NoError(t, err)
				req.Header.Set("X-Api-Key", key)
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				return resp, string(b)
			}
			for range 2 {
				resp, body := post("a")
				require.Equal(t, http.StatusOK, resp.StatusCode, body)
			}
			resp, body := post("a")
			require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
			assert.Equal(t, "1000", resp.Header.Get("Retry-After"))
			assert.Contains(t, body, `"code":"rate_limited"`)
			resp, _ = post("b")
			require.Equal(t, http.StatusOK, resp.StatusCode)
			m, err := http.Get(metrics + "/metrics")
			require.NoError(t, err)
			b, _ := io.ReadAll(m.Body)
			m.Body.Close()
			assert.Contains(t, string(b), "\nexa_gateway_rate_limited_total 1\n")
			assert.Contains(t, string(b), "\nexa_gateway_rate_limit_clients 2\n")
		})
	}
}

func TestGatewayBadRateLimitFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--rate-limit", "-1"}, `invalid --rate-limit "-1": want 0 (no limit) or a rate of at least 1e-6 requests/s`},
		{[]string{"--rate-limit", "NaN"}, `invalid --rate-limit "NaN"`},
		{[]string{"--rate-limit", "1", "--rate-limit-burst", "-2"}, `invalid --rate-limit-burst "-2": must not be negative`},
		{[]string{"--rate-limit", "1", "--rate-limit-key", "cookie"}, `invalid --rate-limit-key "cookie": want ip or header:NAME`},
		{[]string{"--rate-limit", "1", "--rate-limit-key", "header:a b"}, `invalid --rate-limit-key "header:a b"`},
		{[]string{"--rate-limit", "1", "--rate-limit-clients", "0"}, `invalid --rate-limit-clients "0": must be at least 1`},
		{[]string{"--rate-limit-burst", "5"}, `invalid --rate-limit-burst "5": needs --rate-limit, which is off`},
		{[]string{"--rate-limit-key", "header:X"}, `invalid --rate-limit-key "header:X": needs --rate-limit`},
	} {
		for _, fr := range [][]string{{"serve", "gateway", "--listen", "127.0.0.1:0"}, {"serve", "picker", "--listen", "127.0.0.1:0", "--admin-listen", ""}} {
			r := exa(t, newConfig(t), append(fr, tc.args...)...)
			assert.Equal(t, 2, r.code, "%v %v: stderr %s", fr[1], tc.args, r.stderr)
			assert.Contains(t, r.stderr, tc.want, "%v %v", fr[1], tc.args)
			assert.Equal(t, 1, strings.Count(r.stderr, "\n"), "one-line error: %q", r.stderr)
		}
	}
}

// TestGatewayAPIKeys: `exa serve gateway --api-keys-file F` serves a
// client with a key of F and answers 401 to one without; a bad file is a
// one-line usage error naming the flag.
func TestGatewayAPIKeys(t *testing.T) {
	e := enginetest.New(enginetest.Options{Name: "e0", Model: "m"})
	t.Cleanup(e.Close)
	cfg := newConfig(t)
	ok(t, cfg, "serve", "routing", "set", "m", "--replica", "r0="+e.URL())
	keys := filepath.Join(t.TempDir(), "keys")
	require.NoError(t, os.WriteFile(keys, []byte("# team a\nsk-team-a-0001\n"), 0o600))
	base, _ := startGatewayWith(t, cfg, "--listen", "127.0.0.1:0", "--api-keys-file", keys)
	for _, tc := range []struct {
		auth string
		want int
	}{{"", http.StatusUnauthorized}, {"Bearer sk-team-b-0001", http.StatusUnauthorized}, {"Bearer sk-team-a-0001", http.StatusOK}} {
		req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
		require.NoError(t, err)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		assert.Equal(t, tc.want, resp.StatusCode, "%q", tc.auth)
	}
	for _, tc := range []struct{ content, want string }{
		{"short\n", `invalid --api-keys-file "` + keys + `": API keys file ` + keys + `: line 1: a key of 5 bytes, want at least 8`},
		{"", "no key in it"},
	} {
		require.NoError(t, os.WriteFile(keys, []byte(tc.content), 0o600))
		r := exa(t, newConfig(t), "serve", "gateway", "--listen", "127.0.0.1:0", "--api-keys-file", keys)
		assert.Equal(t, 2, r.code, "stderr %s", r.stderr)
		assert.Contains(t, r.stderr, tc.want)
		assert.Equal(t, 1, strings.Count(r.stderr, "\n"), "one-line error: %q", r.stderr)
	}
	r := exa(t, newConfig(t), "serve", "gateway", "--listen", "127.0.0.1:0", "--api-keys-file", "")
	assert.Equal(t, 2, r.code)
	assert.Contains(t, r.stderr, `invalid --api-keys-file ""`)
}

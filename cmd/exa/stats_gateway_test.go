package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stats --gateway fails (exit 1, one line naming the gateway) when the
// gateway cannot be reached or answers /stats with an error, rather than
// showing other figures and exiting 0.
func TestStatsGatewayUnreachable(t *testing.T) {
	cfg := newConfig(t)
	ok(t, cfg, "serve", "routing", "set", "JPCP", "--mode", "cache_aware")

	// A port nothing listens on: bind one, then close it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := "http://" + l.Addr().String()
	require.NoError(t, l.Close())
	r := exa(t, cfg, "serve", "routing", "stats", "JPCP", "--gateway", dead)
	assert.Equal(t, 1, r.code, "stdout %q stderr %q", r.stdout, r.stderr)
	assert.Contains(t, r.stderr, "gateway "+dead)
	assert.Contains(t, r.stderr, "connection refused")
	assert.Equal(t, 1, strings.Count(r.stderr, "\n"), r.stderr)

	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":{"message":"boom"}}`, http.StatusInternalServerError)
	}))
	defer broken.Close()
	r = exa(t, cfg, "serve", "routing", "stats", "JPCP", "--gateway", broken.URL)
	assert.Equal(t, 1, r.code, "stderr %q", r.stderr)
	assert.Contains(t, r.stderr, "500")
}

// stats --gateway shows a model's latency objectives when the gateway's
// /stats has them, and no such line when it has none.
func TestStatsGatewayObjectives(t *testing.T) {
	cfg := newConfig(t)
	ok(t, cfg, "serve", "routing", "set", "JPCP", "--mode", "cache_aware")
	serve := func(body string) string {
		gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(body)) }))
		t.Cleanup(gw.Close)
		return gw.URL
	}
	with := serve(`{"models":{"JPCP":{"model":"JPCP","source":"gateway","requests":9,"decisions":{},"replicas":[],` +
		`"objectives":{"requests":8,"best_effort":2,"ttft_met":5,"ttft_missed":3,"tpot_met":4,"tpot_missed":1}}}}`)
	out := ok(t, cfg, "serve", "routing", "stats", "JPCP", "--gateway", with)
	assert.Regexp(t, `latency objectives:\s+8 requests, 2 with none predicted to meet theirs; ttft met 5, missed 3; tpot met 4, missed 1`, out)
	without := serve(`{"models":{"JPCP":{"model":"JPCP","source":"gateway","requests":9,"decisions":{},"replicas":[]}}}`)
	out = ok(t, cfg, "serve", "routing", "stats", "JPCP", "--gateway", without)
	assert.NotContains(t, out, "latency objectives")
}

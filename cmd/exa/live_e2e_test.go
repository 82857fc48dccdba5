package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/httpgw"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStatsLiveFromHTTPGateway runs the real HTTP gateway in-process on
// the configuration the CLI wrote, sends it traffic, and reads its /stats
// through "exa serve routing stats --gateway".
func TestStatsLiveFromHTTPGateway(t *testing.T) {
	cfg := newConfig(t)
	e0 := enginetest.New(enginetest.Options{Name: "e0"})
	defer e0.Close()
	e1 := enginetest.New(enginetest.Options{Name: "e1"})
	defer e1.Close()
	ok(t, cfg, "serve", "routing", "set", "JPCP", "--mode", "cache_aware", "--replica", "r0="+e0.URL(), "--replica", "r1="+e1.URL())

	reg := prometheus.NewRegistry()
	gw, err := httpgw.New(httpgw.Options{Registerer: reg, Gatherer: reg, Fleet: fleet.Options{ConfigPath: cfg}})
	require.NoError(t, err)
	srv := httptest.NewServer(gw)
	defer srv.Close()

	const n = 6
	body := `{"model": "JPCP", "messages": [{"role": "system", "content": "` + strings.Repeat("you are a careful assistant ", 40) + `"}, {"role": "user", "content": "hello"}]}`
	for range n {
		resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}

	out := ok(t, cfg, "serve", "routing", "stats", "JPCP", "--gateway", srv.URL)
	assert.Contains(t, out, "routing statistics (live, from gateway "+srv.URL+"):")
	assert.Contains(t, out, "policy:            cache_aware")
	assert.Contains(t, out, "requests:          6\n")
	assert.Regexp(t, `(?m)^\s*r0\s+\d+\s+\d+\.\d%\s+\d+\s+yes\s+\d+\s*$`, out)
	assert.Regexp(t, `(?m)^\s*r1\s+\d+\s+\d+\.\d%\s+\d+\s+yes\s+\d+\s*$`, out)

	var js statsOutput
	require.NoError(t, json.Unmarshal([]byte(ok(t, cfg, "serve", "routing", "stats", "JPCP", "--gateway", srv.URL, "--json")), &js))
	require.NotNil(t, js.Stats)
	assert.Equal(t, config.SourceGateway, js.Stats.Source)
	assert.Equal(t, uint64(n), js.Stats.Requests)
	var decided, routed uint64
	for _, v := range js.Stats.Decisions {
		decided += v
	}
	for _, r := range js.Stats.Replicas {
		routed += r.Routed
	}
	assert.Equal(t, uint64(n), decided)
	assert.Equal(t, uint64(n), routed)
	// Cache-aware routing sends the repeated prompt where it is cached.
	assert.GreaterOrEqual(t, js.Stats.Decisions["affinity"], uint64(n-1))

	// A model the gateway does not serve falls back, and says why.
	out = ok(t, cfg, "serve", "routing", "stats", "other", "--gateway", srv.URL)
	assert.Contains(t, out, `the gateway does not serve model "other"`)
	assert.Contains(t, out, "no routing statistics for other")
}

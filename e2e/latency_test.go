//go:build e2e

package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAddedLatency measures the latency the gateway adds: one engine (no
// simulated prefill or decode time) is called directly, through
// `exa serve gateway`, and through a bare httputil.ReverseProxy (the cost
// of the extra hop alone), taking turns request by request at a steady
// rate on loopback, and the latency distributions are compared. It reports
// the figures; it asserts only that every request succeeded (timings
// depend on the machine). EXA_E2E_LATENCY_N sets the samples per path
// (default 3000), EXA_E2E_LATENCY_RATE the total request rate per second
// (default 400).
func TestAddedLatency(t *testing.T) {
	requireBinaries(t)
	n := envInt(t, "EXA_E2E_LATENCY_N", 3000)
	rate := envInt(t, "EXA_E2E_LATENCY_RATE", 400)
	port := freePort(t)
	engine := startSim(t, port, []string{"--port", strconv.Itoa(port), "--model", simModel, "--force-dummy-tokenizer",
		"--max-num-seqs", "64", "--zmq-endpoint=", "--seed", "1", "--v", "0"})
	cfg := filepath.Join(t.TempDir(), "routing.json")
	exa(t, cfg, "serve", "routing", "set", simModel, "--mode", "cache_aware", "--replica", "e0="+engine.url())
	gw := startGateway(t, cfg)
	waitFor(t, 10*time.Second, "gateway to admit the engine", func() bool {
		h, _ := gw.engineHealthy(t, engine.url())
		return h
	})

	rpPort := freePort(t)
	exe, err := os.Executable()
	require.NoError(t, err)
	startProc(t, "reverse-proxy", []string{envReverseProxy + "=" + engine.url() + " 127.0.0.1:" + strconv.Itoa(rpPort)}, exe)
	rpURL := "http://127.0.0.1:" + strconv.Itoa(rpPort)
	waitFor(t, 10*time.Second, "reverse proxy", func() bool { return get(rpURL+"/health") == http.StatusOK })

	body := []byte(`{"model":"` + simModel + `","max_tokens":1,"messages":[{"role":"system","content":"You are a terse assistant."},{"role":"user","content":"Say one word."}]}`)
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8, DisableCompression: true}}
	call := func(base string) time.Duration {
		start := time.Now()
		resp, err := c.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		require.NoError(t, err)
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		return time.Since(start)
	}
	for range 200 { // warm connections, caches and the runtime
		call(engine.url())
		call(gw.url)
		call(rpURL)
	}
	direct := make([]time.Duration, 0, n)
	viaGW := make([]time.Duration, 0, n)
	viaRP := make([]time.Duration, 0, n)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := 0; i < 3*n; i++ {
		<-tick.C
		switch i % 3 {
		case 0:
			direct = append(direct, call(engine.url()))
		case 1:
			viaGW = append(viaGW, call(gw.url))
		default:
			viaRP = append(viaRP, call(rpURL))
		}
	}
	p := func(d []time.Duration, q float64) time.Duration { return percentile(d, q) }
	us := func(d time.Duration) string { return fmt.Sprintf("%7.1f µs", float64(d)/1e3) }
	t.Logf("steady %d req/s on loopback, %d requests per path, taking turns", rate, n)
	t.Logf("direct   p50 %s  p90 %s  p99 %s", us(p(direct, .5)), us(p(direct, .9)), us(p(direct, .99)))
	t.Logf("gateway  p50 %s  p90 %s  p99 %s", us(p(viaGW, .5)), us(p(viaGW, .9)), us(p(viaGW, .99)))
	t.Logf("stdlib reverse proxy  p50 %s  p90 %s  p99 %s  (adds p50 %s, p99 %s: the bare hop)", us(p(viaRP, .5)), us(p(viaRP, .9)), us(p(viaRP, .99)),
		us(p(viaRP, .5)-p(direct, .5)), us(p(viaRP, .99)-p(direct, .99)))
	t.Logf("added    p50 %s  p90 %s  p99 %s  (difference of the percentiles; target: p50 <= 200 µs, p99 <= 1000 µs)",
		us(p(viaGW, .5)-p(direct, .5)), us(p(viaGW, .9)-p(direct, .9)), us(p(viaGW, .99)-p(direct, .99)))
	// Each gateway request against the direct request just before it, so
	// that drift in the machine's load cancels out.
	diffs := make([]time.Duration, len(viaGW))
	for i := range viaGW {
		diffs[i] = viaGW[i] - direct[i]
	}
	t.Logf("paired   p50 %s  p90 %s  p99 %s  (percentiles of gateway minus preceding direct request)",
		us(p(diffs, .5)), us(p(diffs, .9)), us(p(diffs, .99)))
}

func envInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	require.NoError(t, err, "%s=%q", name, s)
	require.Positive(t, v, "%s", name)
	return v
}

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
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAddedLatency measures the latency the gateway adds: one engine (no
// simulated prefill or decode time) is called directly, through
// `exa serve gateway`, and through a bare httputil.ReverseProxy (the cost
// of the extra hop alone), taking turns request by request at a steady
// rate on loopback, and the latency distributions are compared. It does so
// at each of several rates in the same run, since an idle machine wakes
// more slowly than a busy one. It reports the figures; it asserts only
// that every request succeeded (timings depend on the machine).
//
// EXA_E2E_LATENCY_N sets the samples per path and rate (default 2000);
// EXA_E2E_LATENCY_RATES the total request rates per second, comma
// separated (default "400,1000,2000"; EXA_E2E_LATENCY_RATE, one rate, is
// still read when EXA_E2E_LATENCY_RATES is not set). The calls are
// sequential, so a rate above what one client achieves is logged with the
// rate achieved. EXA_E2E_LATENCY_BASELINE_EXA names another exa binary
// (e.g. a build of an earlier commit) to run as a fourth path, so that two
// versions of the gateway are compared in the same run;
// EXA_E2E_LATENCY_BASELINE_ARGS adds flags to it (space separated), e.g.
// to compare settings of one binary. EXA_E2E_GATEWAY_ENV ("NAME=value",
// e.g. GOMAXPROCS=1) is set for the stdlib proxy as well as the gateways.
// EXA_E2E_LATENCY_EXTRA_HOPS adds further hops to the rotation (see
// extraHops).
func TestAddedLatency(t *testing.T) {
	requireBinaries(t)
	n := envInt(t, "EXA_E2E_LATENCY_N", 2000)
	rates := latencyRates(t)
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
	// The stdlib proxy gets the gateway's runtime settings too
	// (EXA_E2E_GATEWAY_ENV, e.g. GOMAXPROCS=1), so that both hops are
	// compared like for like.
	startProc(t, "reverse-proxy", []string{envReverseProxy + "=" + engine.url() + " 127.0.0.1:" + strconv.Itoa(rpPort),
		os.Getenv("EXA_E2E_GATEWAY_ENV")}, exe)
	rpURL := "http://127.0.0.1:" + strconv.Itoa(rpPort)
	waitFor(t, 10*time.Second, "reverse proxy", func() bool { return get(rpURL+"/health") == http.StatusOK })

	paths := []latencyPath{{name: "direct", url: engine.url()}, {name: "gateway", url: gw.url}, {name: "stdlib proxy", url: rpURL}}
	if base := os.Getenv("EXA_E2E_LATENCY_BASELINE_EXA"); base != "" {
		bg := startGatewayBinary(t, base, cfg)
		waitFor(t, 10*time.Second, "baseline gateway to admit the engine", func() bool {
			h, _ := bg.engineHealthy(t, engine.url())
			return h
		})
		paths = append(paths, latencyPath{name: "baseline gw", url: bg.url})
	}
	nCompared := len(paths)
	paths = append(paths, extraHops(t, engine.port)...)

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
		for _, p := range paths {
			call(p.url)
		}
	}
	us := func(d time.Duration) string { return fmt.Sprintf("%7.1f µs", float64(d)/1e3) }
	row := func(d []time.Duration) string {
		return fmt.Sprintf("p50 %s  p90 %s  p99 %s", us(percentile(d, .5)), us(percentile(d, .9)), us(percentile(d, .99)))
	}
	diff := func(a, b []time.Duration) string {
		return fmt.Sprintf("p50 %s  p90 %s  p99 %s", us(percentile(a, .5)-percentile(b, .5)),
			us(percentile(a, .9)-percentile(b, .9)), us(percentile(a, .99)-percentile(b, .99)))
	}
	for _, rate := range rates {
		samples := make([][]time.Duration, len(paths))
		for i := range samples {
			samples[i] = make([]time.Duration, 0, n)
		}
		tick := time.NewTicker(time.Second / time.Duration(rate))
		start := time.Now()
		for i := 0; i < len(paths)*n; i++ {
			<-tick.C
			// Each round calls the engine directly first, then the other
			// paths, in reverse order every other round so that none of
			// them always comes right after the direct call.
			k := i % len(paths)
			if (i/len(paths))%2 == 1 && k > 0 {
				k = len(paths) - k
			}
			samples[k] = append(samples[k], call(paths[k].url))
		}
		elapsed := time.Since(start)
		tick.Stop()
		direct := samples[0]
		t.Logf("--- target %d req/s (achieved %.0f req/s) on loopback, %d requests per path, taking turns", rate,
			float64(len(paths)*n)/elapsed.Seconds(), n)
		for k, p := range paths {
			t.Logf("%-13s %s", p.name, row(samples[k]))
		}
		t.Logf("hop (stdlib proxy - direct)   %s  (the bare extra hop)", diff(samples[2], direct))
		t.Logf("added (gateway - direct)      %s  (target: p50 <= 200 µs, p99 <= 1000 µs)", diff(samples[1], direct))
		t.Logf("gateway - stdlib proxy        %s  (the gateway's cost beyond the bare hop)", diff(samples[1], samples[2]))
		if nCompared > 3 {
			t.Logf("added (baseline gw - direct)  %s", diff(samples[3], direct))
			t.Logf("gateway - baseline gw         %s", diff(samples[1], samples[3]))
		}
		for k := nCompared; k < len(paths); k++ {
			t.Logf("hop (%s - direct)  %s", paths[k].name, diff(samples[k], direct))
		}
		// Each gateway request against the direct request of its round, so
		// that drift in the machine's load cancels out.
		paired := make([]time.Duration, len(samples[1]))
		for i := range paired {
			paired[i] = samples[1][i] - direct[i]
		}
		t.Logf("paired (gateway - direct of its round)  %s", row(paired))
	}
}

// latencyPath is one way of reaching the engine.
type latencyPath struct {
	name, url string
}

// extraHops starts the extra hops named in EXA_E2E_LATENCY_EXTRA_HOPS:
// "name=command" entries separated by ";", whose command (split on spaces)
// has {listen} replaced by a free loopback port and {engine} by the
// engine's port, e.g. "socat=socat TCP-LISTEN:{listen},fork,reuseaddr
// TCP:127.0.0.1:{engine}", a relay without HTTP that shows what the extra
// process alone costs.
func extraHops(t *testing.T, enginePort int) []latencyPath {
	spec := os.Getenv("EXA_E2E_LATENCY_EXTRA_HOPS")
	var hops []latencyPath
	for _, entry := range strings.Split(spec, ";") {
		if strings.TrimSpace(entry) == "" {
			continue
		}
		name, cmd, ok := strings.Cut(entry, "=")
		require.True(t, ok, "EXA_E2E_LATENCY_EXTRA_HOPS entry %q: want name=command", entry)
		port := freePort(t)
		r := strings.NewReplacer("{listen}", strconv.Itoa(port), "{engine}", strconv.Itoa(enginePort))
		args := strings.Fields(r.Replace(cmd))
		require.NotEmpty(t, args, "EXA_E2E_LATENCY_EXTRA_HOPS entry %q", entry)
		startProc(t, "hop-"+strings.TrimSpace(name), nil, args[0], args[1:]...)
		url := "http://127.0.0.1:" + strconv.Itoa(port)
		waitFor(t, 10*time.Second, "hop "+name, func() bool { return get(url+"/health") == http.StatusOK })
		hops = append(hops, latencyPath{name: strings.TrimSpace(name), url: url})
	}
	return hops
}

// latencyRates reads EXA_E2E_LATENCY_RATES (or EXA_E2E_LATENCY_RATE).
func latencyRates(t *testing.T) []int {
	s := os.Getenv("EXA_E2E_LATENCY_RATES")
	if s == "" {
		if os.Getenv("EXA_E2E_LATENCY_RATE") != "" {
			return []int{envInt(t, "EXA_E2E_LATENCY_RATE", 0)}
		}
		s = "400,1000,2000"
	}
	var rates []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		require.NoError(t, err, "EXA_E2E_LATENCY_RATES=%q", s)
		require.Positive(t, v, "EXA_E2E_LATENCY_RATES=%q", s)
		rates = append(rates, v)
	}
	return rates
}

// startGatewayBinary starts `serve gateway` from another exa binary, with
// the flags startGateway uses and those in EXA_E2E_LATENCY_BASELINE_ARGS.
func startGatewayBinary(t *testing.T, bin, cfg string) *gatewayProc {
	port := freePort(t)
	args := append([]string{"serve", "gateway",
		"--listen", "127.0.0.1:" + strconv.Itoa(port), "--reload-interval", "100ms",
		"--probe-interval", "200ms", "--probe-timeout", "500ms", "--scrape-interval", "200ms"},
		strings.Fields(os.Getenv("EXA_E2E_LATENCY_BASELINE_ARGS"))...)
	p := startProc(t, "baseline-gateway", []string{"EXA_CONFIG=" + cfg, os.Getenv("EXA_E2E_GATEWAY_ENV")}, bin, args...)
	g := &gatewayProc{url: "http://127.0.0.1:" + strconv.Itoa(port), p: p}
	waitFor(t, 20*time.Second, "baseline gateway /healthz", func() bool { return get(g.url+"/healthz") == http.StatusOK })
	return g
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

//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/httpgw"
	"github.com/examlops/gateway/internal/testport"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

// Binaries, built by e2e/run.sh.
var (
	simBin = os.Getenv("EXA_E2E_SIM")
	exaBin = os.Getenv("EXA_E2E_EXA")
)

const simModel = "e2e-model"

func requireBinaries(t *testing.T) {
	t.Helper()
	for name, p := range map[string]string{"EXA_E2E_SIM": simBin, "EXA_E2E_EXA": exaBin} {
		if p == "" {
			t.Fatalf("%s is not set: run the end-to-end tests with e2e/run.sh", name)
		}
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s=%s: %v", name, p, err)
		}
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	return testport.Port(t) // outside the ephemeral ports: see package testport
}

// proc is a child process with its output in a log file.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func startProc(t *testing.T, name string, env []string, bin string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	lf, err := os.Create(logPath)
	require.NoError(t, err)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = procAttr()
	require.NoError(t, cmd.Start(), "start %s", name)
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); lf.Close(); close(p.done) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 3000 {
				b = b[len(b)-3000:]
			}
			t.Logf("--- tail of %s log ---\n%s", name, b)
		}
	})
	return p
}

// kill sends SIGKILL to the process (by its own pid) and waits for it.
func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// sim is one llm-d-inference-sim engine.
type sim struct {
	t    *testing.T
	port int
	args []string
	p    *proc
	n    int
}

func (s *sim) url() string { return "http://127.0.0.1:" + strconv.Itoa(s.port) }

// simArgs are the engine flags: dummy tokenizer (no network), KV cache on
// with 16-token blocks, prefill time per uncached prompt token.
func simArgs(port int, kvBlocks int, prefillPerToken time.Duration) []string {
	return []string{
		"--port", strconv.Itoa(port), "--model", simModel, "--force-dummy-tokenizer",
		"--enable-kvcache", "--kv-cache-size", strconv.Itoa(kvBlocks), "--block-size", "16",
		"--prefill-time-per-token", prefillPerToken.String(), "--inter-token-latency", "1ms",
		"--max-num-seqs", "32", "--max-model-len", "8192", "--zmq-endpoint=", "--seed", "1",
		"--v", "0",
	}
}

func startSim(t *testing.T, port int, args []string) *sim {
	s := &sim{t: t, port: port, args: args}
	s.start()
	return s
}

func (s *sim) start() {
	s.n++
	s.p = startProc(s.t, fmt.Sprintf("sim-%d-%d", s.port, s.n), []string{"POD_IP=127.0.0.1"}, simBin, s.args...)
	waitFor(s.t, 30*time.Second, "engine "+s.url()+" /health", func() bool { return get(s.url()+"/health") == http.StatusOK })
}

func (s *sim) kill() { s.p.kill() }

// adminClient reads health, /stats and /metrics: a process that hangs
// fails the test that asks instead of holding it to go test's timeout.
var adminClient = &http.Client{Timeout: 10 * time.Second}

func get(url string) int {
	resp, err := adminClient.Get(url)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// waitFor polls cond every 50 ms until it holds or the limit passes.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(limit); ; {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// engineCounters reads the engine's prefix-cache counters from its own
// /metrics: vllm:prefix_cache_hits and vllm:prefix_cache_queries (tokens).
func engineCounters(t *testing.T, base string) (hits, queries float64) {
	t.Helper()
	fams := metricFamilies(t, base)
	sum := func(name string) float64 {
		s := 0.0
		for _, m := range fams[name].GetMetric() {
			s += m.GetCounter().GetValue() + m.GetUntyped().GetValue() + m.GetGauge().GetValue()
		}
		return s
	}
	require.Contains(t, fams, "vllm:prefix_cache_hits", "engine %s exposes vllm:prefix_cache_hits", base)
	return sum("vllm:prefix_cache_hits"), sum("vllm:prefix_cache_queries")
}

// exa runs the exa binary to completion and returns its output.
func exa(t *testing.T, cfg string, args ...string) string {
	t.Helper()
	cmd := exec.Command(exaBin, args...)
	cmd.Env = append(os.Environ(), "EXA_CONFIG="+cfg)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "exa %v: %s", args, out)
	return string(out)
}

// gatewayProc is a running `exa serve gateway`.
type gatewayProc struct {
	url string
	p   *proc
}

// startGateway starts `exa serve gateway` on cfg, with extra flags after
// the test's own, and waits for its /healthz.
func startGateway(t *testing.T, cfg string, extra ...string) *gatewayProc {
	port := freePort(t)
	args := append([]string{"serve", "gateway",
		"--listen", "127.0.0.1:" + strconv.Itoa(port), "--reload-interval", "100ms",
		"--probe-interval", "200ms", "--probe-timeout", "500ms", "--scrape-interval", "200ms",
		// Scaled down as the intervals are: an engine ejected for its
		// failed answers (as one killed mid-run is) waits 2 s, not 30 s,
		// before its probes may readmit it.
		"--ejection-time", "2s"}, extra...)
	p := startProc(t, "gateway", []string{"EXA_CONFIG=" + cfg, os.Getenv("EXA_E2E_GATEWAY_ENV")}, exaBin, args...)
	g := &gatewayProc{url: "http://127.0.0.1:" + strconv.Itoa(port), p: p}
	waitFor(t, 20*time.Second, "gateway /healthz", func() bool { return get(g.url+"/healthz") == http.StatusOK })
	return g
}

func (g *gatewayProc) stats(t *testing.T) fleet.Stats {
	t.Helper()
	resp, err := adminClient.Get(g.url + "/stats")
	require.NoError(t, err)
	defer resp.Body.Close()
	var st fleet.Stats
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
	return st
}

// engineHealthy reports the gateway's view of one engine address.
func (g *gatewayProc) engineHealthy(t *testing.T, addr string) (healthy, known bool) {
	for _, e := range g.stats(t).Engines {
		if e.Address == addr {
			return e.Healthy, true
		}
	}
	return false, false
}

// metric returns the sum of a gateway metric's series whose labels
// include the given ones.
func (g *gatewayProc) metric(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	return sumSeries(metricFamilies(t, g.url)[name], labels, func(m *dto.Metric) float64 {
		return m.GetCounter().GetValue() + m.GetGauge().GetValue()
	})
}

// metricFamilies fetches and parses a server's /metrics (Prometheus text
// format).
func metricFamilies(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := adminClient.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return fams
}

// sumSeries sums value over fam's series whose labels include labels (all
// of them when labels is nil). A nil fam sums to 0.
func sumSeries(fam *dto.MetricFamily, labels map[string]string, value func(*dto.Metric) float64) float64 {
	total := 0.0
next:
	for _, m := range fam.GetMetric() {
		for k, v := range labels {
			ok := false
			for _, lp := range m.GetLabel() {
				ok = ok || (lp.GetName() == k && lp.GetValue() == v)
			}
			if !ok {
				continue next
			}
		}
		total += value(m)
	}
	return total
}

// result is one streamed request's outcome as the client saw it.
type result struct {
	status  int
	ttft    time.Duration // to the first SSE data line
	done    bool          // stream ended with data: [DONE]
	errText string        // an error event or error body
	replica string
	netErr  error
}

// clear reports whether the client got a response or a clear error.
func (r result) clear() bool {
	switch {
	case r.netErr != nil:
		return false
	case r.status == http.StatusOK:
		return r.done || r.errText != ""
	default:
		return r.errText != ""
	}
}

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}

// streamChat sends one streamed chat request and reads the whole answer.
func streamChat(ctx context.Context, url, system, user string, maxTokens int) result {
	return streamChatModel(ctx, url, simModel, system, user, maxTokens)
}

// streamChatModel is streamChat naming model (a LoRA adapter, say).
func streamChatModel(ctx context.Context, url, model, system, user string, maxTokens int) result {
	body, _ := json.Marshal(map[string]any{
		"model": model, "stream": true, "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": user}},
	})
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return result{netErr: err}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return result{netErr: err}
	}
	defer resp.Body.Close()
	r := result{status: resp.StatusCode, replica: resp.Header.Get(httpgw.HeaderReplica)}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		var eb struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(b, &eb) == nil && eb.Error.Message != "" {
			r.errText = eb.Error.Message
		}
		return r
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		if r.ttft == 0 {
			r.ttft = time.Since(start)
		}
		data := strings.TrimPrefix(line, "data: ")
		switch {
		case data == "[DONE]":
			r.done = true
		case strings.HasPrefix(data, `{"error"`):
			r.errText = data
		}
	}
	if err := sc.Err(); err != nil && !r.done && r.errText == "" {
		r.netErr = err
	}
	return r
}

// runWorkload sends the requests (answers of maxTokens tokens) with
// `workers` concurrent clients and returns the results in request order.
// progress, if not nil, is called after each completed request with the
// count so far.
func runWorkload(url string, reqs [][2]string, workers, maxTokens int, progress func(int)) []result {
	out := make([]result, len(reqs))
	next := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	completed := 0
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				out[i] = streamChat(ctx, url, reqs[i][0], reqs[i][1], maxTokens)
				cancel()
				mu.Lock()
				completed++
				c := completed
				mu.Unlock()
				if progress != nil {
					progress(c)
				}
			}
		}()
	}
	for i := range reqs {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}

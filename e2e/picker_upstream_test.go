//go:build e2e

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway/keys"
)

// TestPickerUpstreamStream is TestNonStreamedFirstToken for the picker:
// `exa serve picker`, the real binary, behind pickertest.Envoy (no Envoy
// binary exists on this project's machines; the stand-in plays Envoy's
// FULL_DUPLEX_STREAMED ext_proc sequence, see TestPicker). A "stream":
// false request's pending prefill is released at its first token, not at
// completion: the picker rewrites the request to stream from the engine
// (--upstream-stream, the default) and answers the client with the JSON
// assembled from the stream. One llm-d-inference-sim engine in echo mode,
// 500ms to the first token and 10ms per output token, answers a 300-token
// request in about 3.5s; the picker's pending prefill
// (exa_gateway_pending_prefill_blocks) is polled every 20ms, with the
// default and with --upstream-stream=false. The answer is compared with
// the engine's own non-streamed answer: content, usage, finish_reason.
func TestPickerUpstreamStream(t *testing.T) {
	requireBinaries(t)
	port := freePort(t)
	engine := startSim(t, port, []string{"--port", strconv.Itoa(port), "--model", simModel, "--force-dummy-tokenizer",
		"--mode", "echo", "--time-to-first-token", nsTTFT.String(), "--inter-token-latency", nsITL.String(),
		"--max-num-seqs", "8", "--max-model-len", "8192", "--zmq-endpoint=", "--seed", "1", "--v", "0"})
	cfg := filepath.Join(t.TempDir(), "routing.json")
	exa(t, cfg, "serve", "routing", "set", simModel, "--mode", "cache_aware", "--replica", "e0="+engine.url())
	body := func(i int) []byte {
		b, _ := json.Marshal(map[string]any{"model": simModel, "max_tokens": nsTokens, "stream": false,
			"messages": []map[string]string{{"role": "user", "content": "picker run " + strconv.Itoa(i) + ": " + nsPrompt()}}})
		return b
	}
	for i, upstream := range []bool{true, false} {
		t.Run("upstream-stream="+strconv.FormatBool(upstream), func(t *testing.T) {
			pp := startPickerProc(t, "picker", cfg, "--upstream-stream="+strconv.FormatBool(upstream))
			url := pp.envoy(t, false)
			waitFor(t, 10*time.Second, "picker to admit the engine", func() bool {
				h, _ := pp.engineHealthy(t, engine.url())
				return h
			})
			pending := func() float64 {
				return pp.metric(t, "exa_gateway_pending_prefill_blocks", map[string]string{"model": simModel})
			}
			require.Zero(t, pending())
			a, firstSeen, released, maxPending := nsPendingWhile(url, body(i), pending)
			require.NoError(t, a.err)
			require.Equal(t, http.StatusOK, a.status, "%s", a.body)
			assert.Equal(t, "application/json", a.ct)
			if released < 0 && pending() == 0 {
				released = a.at // released with the answer
			}
			t.Logf("picker --upstream-stream=%v: pending prefill %v blocks, first seen at %v, released at %v; answer complete at %v",
				upstream, maxPending, firstSeen.Round(time.Millisecond), released.Round(time.Millisecond), a.at.Round(time.Millisecond))
			require.Positive(t, maxPending, "the request's prefill was pending")
			streamed := pp.metric(t, "exa_picker_upstream_streamed_total", nil)
			if upstream {
				assert.Less(t, released, a.at-time.Second, "pending prefill released at the first token, well before completion")
				assert.GreaterOrEqual(t, released, nsTTFT-50*time.Millisecond, "not before the engine's first token")
				assert.Equal(t, 1.0, streamed)
			} else {
				assert.Greater(t, released, a.at-500*time.Millisecond, "without upstream streaming, the release comes only with the answer")
				assert.Zero(t, streamed)
			}

			// The picker's answer against the engine's own.
			nsSameAsEngine(t, "picker", engine.url(), body(i), a.body)
		})
	}
}

// TestPickerUpstreamLatency measures what --upstream-stream adds to a
// small non-streamed request through the picker: two `exa serve picker`
// processes of the same binary, one with the default and one with
// --upstream-stream=false, each behind its own pickertest.Envoy, over one
// llm-d-inference-sim engine with no simulated prefill or decode time,
// called in turns with a chat request of max_tokens 8 (streamed from the
// engine and assembled by the first, answered whole by the second). It
// reports the latency distributions and the paired difference; it
// asserts only that every request succeeded (timings depend on the
// machine). EXA_E2E_LATENCY_N sets the samples per path (default 500).
func TestPickerUpstreamLatency(t *testing.T) {
	requireBinaries(t)
	n := envInt(t, "EXA_E2E_LATENCY_N", 500)
	port := freePort(t)
	engine := startSim(t, port, []string{"--port", strconv.Itoa(port), "--model", simModel, "--force-dummy-tokenizer",
		"--max-num-seqs", "64", "--zmq-endpoint=", "--seed", "1", "--v", "0"})
	cfg := filepath.Join(t.TempDir(), "routing.json")
	exa(t, cfg, "serve", "routing", "set", simModel, "--mode", "cache_aware", "--replica", "e0="+engine.url())
	var urls []string
	var procs []*pickerProc
	for _, on := range []bool{true, false} {
		pp := startPickerProc(t, "picker-"+strconv.FormatBool(on), cfg, "--upstream-stream="+strconv.FormatBool(on))
		waitFor(t, 10*time.Second, "picker to admit the engine", func() bool {
			h, _ := pp.engineHealthy(t, engine.url())
			return h
		})
		urls = append(urls, pp.envoy(t, false))
		procs = append(procs, pp)
	}
	body := []byte(`{"model":"` + simModel + `","max_tokens":8,"messages":[{"role":"system","content":"You are a terse assistant."},{"role":"user","content":"Say a few words."}]}`)
	streamedBody, err := keys.StreamBody(body) // what the first picker sends the engine
	require.NoError(t, err)
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8, DisableCompression: true}}
	call := func(base string, body []byte) time.Duration {
		start := time.Now()
		resp, err := c.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		return time.Since(start)
	}
	// The paths: the two pickers, and the engine called directly with the
	// client's body and with the body the first picker sends it (so that
	// the engine's own cost of streaming shows apart).
	paths := []struct {
		url  string
		body []byte
	}{{urls[0], body}, {urls[1], body}, {engine.url(), body}, {engine.url(), streamedBody}}
	for range 100 { // warm connections, caches and the runtime
		for _, p := range paths {
			call(p.url, p.body)
		}
	}
	samples := make([][]time.Duration, len(paths))
	for i := range len(paths) * n {
		k := i % len(paths)
		if (i/len(paths))%2 == 1 {
			k = len(paths) - 1 - k // reverse the order every other round
		}
		samples[k] = append(samples[k], call(paths[k].url, paths[k].body))
	}
	us := func(d time.Duration) string { return fmt.Sprintf("%7.1f µs", float64(d)/1e3) }
	row := func(d []time.Duration) string {
		return fmt.Sprintf("p50 %s  p90 %s  p99 %s", us(percentile(d, .5)), us(percentile(d, .9)), us(percentile(d, .99)))
	}
	paired := make([]time.Duration, n)
	for i := range paired {
		paired[i] = samples[0][i] - samples[1][i]
	}
	t.Logf("%d requests per path, sequential, through pickertest.Envoy, chat max_tokens 8, stream false", n)
	t.Logf("--upstream-stream=true   %s", row(samples[0]))
	t.Logf("--upstream-stream=false  %s", row(samples[1]))
	direct := make([]time.Duration, n)
	for i := range direct {
		direct[i] = samples[3][i] - samples[2][i]
	}
	t.Logf("paired (true - false of its round)  %s", row(paired))
	t.Logf("engine direct, stream false   %s", row(samples[2]))
	t.Logf("engine direct, stream true    %s", row(samples[3]))
	t.Logf("paired engine (stream true - false of its round)  %s", row(direct))
	assert.Equal(t, float64(100+n), procs[0].metric(t, "exa_picker_upstream_streamed_total", nil), "every request of the first picker streamed from the engine")
}

//go:build e2e

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Engine timing of TestNonStreamedFirstToken: the first token comes after
// nsTTFT, the answer (nsTokens tokens) about nsTokens x nsITL later.
const (
	nsTTFT   = 500 * time.Millisecond
	nsITL    = 10 * time.Millisecond
	nsTokens = 300
)

// TestNonStreamedFirstToken shows that for a "stream": false request the
// gateway releases the request's pending prefill at its first token, not
// at completion: the gateway streams it from the engine (--upstream-stream,
// the default) and answers the client with the non-streamed JSON. One
// llm-d-inference-sim engine in echo mode (the answer is the prompt, so
// that the gateway's answer can be compared with the engine's own) with a
// time to first token of 500ms and 10ms per output token answers a
// 300-token request in about 3.5s. The gateway's pending prefill
// (exa_gateway_pending_prefill_blocks) is polled every 20ms while the
// request runs, through a gateway with the default and one with
// --upstream-stream=false. The gateway's answer is compared with the
// engine's own non-streamed answer to the same request: content, usage and
// finish_reason equal; the remaining differences of shape are logged.
func TestNonStreamedFirstToken(t *testing.T) {
	requireBinaries(t)
	port := freePort(t)
	engine := startSim(t, port, []string{"--port", strconv.Itoa(port), "--model", simModel, "--force-dummy-tokenizer",
		"--mode", "echo", "--time-to-first-token", nsTTFT.String(), "--inter-token-latency", nsITL.String(),
		"--max-num-seqs", "8", "--max-model-len", "8192", "--zmq-endpoint=", "--seed", "1", "--v", "0"})
	cfg := filepath.Join(t.TempDir(), "routing.json")
	exa(t, cfg, "serve", "routing", "set", simModel, "--mode", "cache_aware", "--replica", "e0="+engine.url())

	prompt := nsPrompt()
	body := func(i int) []byte {
		// Each request its own prompt, so that its prefix is uncached.
		b, _ := json.Marshal(map[string]any{"model": simModel, "max_tokens": nsTokens, "stream": false,
			"messages": []map[string]string{{"role": "user", "content": fmt.Sprintf("run %d: %s", i, prompt)}}})
		return b
	}

	for i, upstream := range []bool{true, false} {
		t.Run("upstream-stream="+strconv.FormatBool(upstream), func(t *testing.T) {
			gw := startGatewayArgs(t, cfg, "--upstream-stream="+strconv.FormatBool(upstream))
			waitFor(t, 10*time.Second, "gateway to admit the engine", func() bool {
				h, _ := gw.engineHealthy(t, engine.url())
				return h
			})
			pending := func() float64 {
				return gw.metric(t, "exa_gateway_pending_prefill_blocks", map[string]string{"model": simModel})
			}
			require.Zero(t, pending())
			a, firstSeen, released, maxPending := nsPendingWhile(gw.url, body(i), pending)
			require.NoError(t, a.err)
			require.Equal(t, http.StatusOK, a.status, "%s", a.body)
			if released < 0 && pending() == 0 {
				released = a.at // released with the answer
			}
			t.Logf("upstream-stream=%v: pending prefill %v blocks, first seen at %v, released at %v; answer complete at %v",
				upstream, maxPending, firstSeen.Round(time.Millisecond), released.Round(time.Millisecond), a.at.Round(time.Millisecond))
			require.Positive(t, maxPending, "the request's prefill was pending")
			if upstream {
				assert.Less(t, released, a.at-time.Second, "pending prefill released at the first token, well before completion")
				assert.GreaterOrEqual(t, released, nsTTFT-50*time.Millisecond, "not before the engine's first token")
			} else {
				// The release and the answer race (the answer is written
				// before the bookkeeping): both come at completion.
				assert.Greater(t, released, a.at-500*time.Millisecond, "without upstream streaming, the release comes only with the answer")
			}

			// The gateway's answer against the engine's own.
			nsSameAsEngine(t, "gateway", engine.url(), body(i), a.body)
		})
	}
}

// nsPrompt is a prompt of nsTokens words.
func nsPrompt() string {
	words := make([]string, nsTokens)
	for i := range words {
		words[i] = fmt.Sprintf("word%d", i)
	}
	return strings.Join(words, " ")
}

// nsAnswer is a non-streamed answer as a client reads it: complete at at
// after the request was sent.
type nsAnswer struct {
	status int
	ct     string // Content-Type
	body   []byte
	err    error
	at     time.Duration
}

// nsPendingWhile posts the chat request body to the front at url and
// polls pending (the front's pending prefill) every 20ms until the answer
// comes. It returns the answer, when pending prefill was first seen and
// when it was released (-1: not seen, not released before the answer),
// and its peak.
func nsPendingWhile(url string, body []byte, pending func() float64) (a nsAnswer, firstSeen, released time.Duration, maxPending float64) {
	done := make(chan nsAnswer, 1)
	start := time.Now()
	go func() {
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			done <- nsAnswer{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- nsAnswer{status: resp.StatusCode, ct: resp.Header.Get("Content-Type"), body: b, err: err, at: time.Since(start)}
	}()
	return pollPending(start, done, pending)
}

// pollPending polls pending (a front's pending prefill) every 20ms until
// done delivers the answer of a request sent at start. It returns the
// answer, when pending prefill was first seen and when it was released,
// as times since start (-1: not seen, not released before the answer),
// and its peak.
func pollPending[T any](start time.Time, done <-chan T, pending func() float64) (a T, firstSeen, released time.Duration, maxPending float64) {
	firstSeen, released = -1, -1
	for {
		select {
		case a = <-done:
			return a, firstSeen, released, maxPending
		default:
		}
		p, at := pending(), time.Since(start)
		if p > 0 && firstSeen < 0 {
			firstSeen = at
		}
		maxPending = max(maxPending, p)
		if p == 0 && maxPending > 0 && released < 0 {
			released = at
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// nsSameAsEngine compares the answer got of the front named front to the
// chat request body with the engine's own non-streamed answer to it:
// content, usage, model, finish_reason and role equal; the remaining
// differences of shape are logged.
func nsSameAsEngine(t *testing.T, front, engineURL string, body, got []byte) {
	t.Helper()
	resp, err := http.Post(engineURL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	direct, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", direct)
	var viaFront, viaEngine map[string]any
	require.NoError(t, json.Unmarshal(got, &viaFront), "%s", got)
	require.NoError(t, json.Unmarshal(direct, &viaEngine), "%s", direct)
	assert.Equal(t, "chat.completion", viaFront["object"])
	assert.Equal(t, viaEngine["usage"], viaFront["usage"], "usage")
	assert.Equal(t, viaEngine["model"], viaFront["model"])
	fc, ec := viaFront["choices"].([]any)[0].(map[string]any), viaEngine["choices"].([]any)[0].(map[string]any)
	assert.Equal(t, ec["finish_reason"], fc["finish_reason"], "finish_reason")
	fm, em := fc["message"].(map[string]any), ec["message"].(map[string]any)
	assert.Equal(t, em["content"], fm["content"], "content")
	assert.Equal(t, em["role"], fm["role"], "role")
	assert.NotEmpty(t, fm["content"])
	t.Logf("keys: top %s %v engine %v; choice %s %v engine %v; message %s %v engine %v",
		front, sortedKeys(viaFront), sortedKeys(viaEngine), front, sortedKeys(fc), sortedKeys(ec), front, sortedKeys(fm), sortedKeys(em))
}

// sortedKeys returns m's keys, sorted.
func sortedKeys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// startGatewayArgs is startGateway with extra flags.
func startGatewayArgs(t *testing.T, cfg string, extra ...string) *gatewayProc {
	port := freePort(t)
	args := append([]string{"serve", "gateway",
		"--listen", "127.0.0.1:" + strconv.Itoa(port), "--reload-interval", "100ms",
		"--probe-interval", "200ms", "--probe-timeout", "500ms", "--scrape-interval", "200ms"}, extra...)
	p := startProc(t, "gateway", []string{"EXA_CONFIG=" + cfg}, exaBin, args...)
	g := &gatewayProc{url: "http://127.0.0.1:" + strconv.Itoa(port), p: p}
	waitFor(t, 20*time.Second, "gateway /healthz", func() bool { return get(g.url+"/healthz") == http.StatusOK })
	return g
}

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
			type answer struct {
				status int
				body   []byte
				err    error
				at     time.Duration
			}
			done := make(chan answer, 1)
			start := time.Now()
			go func() {
				resp, err := http.Post(gw.url+"/v1/chat/completions", "application/json", bytes.NewReader(body(i)))
				if err != nil {
					done <- answer{err: err}
					return
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				done <- answer{status: resp.StatusCode, body: b, err: err, at: time.Since(start)}
			}()
			var firstSeen, released time.Duration = -1, -1
			var maxPending float64
			var a answer
		poll:
			for {
				select {
				case a = <-done:
					break poll
				default:
				}
				p := pending()
				at := time.Since(start)
				if p > 0 && firstSeen < 0 {
					firstSeen = at
				}
				if p > maxPending {
					maxPending = p
				}
				if p == 0 && maxPending > 0 && released < 0 {
					released = at
				}
				time.Sleep(20 * time.Millisecond)
			}
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
			resp, err := http.Post(engine.url()+"/v1/chat/completions", "application/json", bytes.NewReader(body(i)))
			require.NoError(t, err)
			direct, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", direct)
			var viaGW, viaEngine map[string]any
			require.NoError(t, json.Unmarshal(a.body, &viaGW), "%s", a.body)
			require.NoError(t, json.Unmarshal(direct, &viaEngine), "%s", direct)
			assert.Equal(t, "chat.completion", viaGW["object"])
			assert.Equal(t, viaEngine["usage"], viaGW["usage"], "usage")
			assert.Equal(t, viaEngine["model"], viaGW["model"])
			gc, ec := viaGW["choices"].([]any)[0].(map[string]any), viaEngine["choices"].([]any)[0].(map[string]any)
			assert.Equal(t, ec["finish_reason"], gc["finish_reason"], "finish_reason")
			gm, em := gc["message"].(map[string]any), ec["message"].(map[string]any)
			assert.Equal(t, em["content"], gm["content"], "content")
			assert.Equal(t, em["role"], gm["role"], "role")
			assert.NotEmpty(t, gm["content"])
			t.Logf("keys: top gateway %v engine %v; choice gateway %v engine %v; message gateway %v engine %v",
				sortedKeys(viaGW), sortedKeys(viaEngine), sortedKeys(gc), sortedKeys(ec), sortedKeys(gm), sortedKeys(em))
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

//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

// Helpers of the P/D tests (pd_test.go): engines in echo mode (the answer
// is the last user message, so it is deterministic), llm-d's pd-sidecar,
// and requests whose answers are compared field by field.

// sidecarBin is llm-d's pd-sidecar, built by e2e/run.sh.
var sidecarBin = os.Getenv("EXA_E2E_SIDECAR")

func requireSidecar(t *testing.T) {
	t.Helper()
	if sidecarBin == "" {
		t.Fatal("EXA_E2E_SIDECAR is not set: run the end-to-end tests with e2e/run.sh")
	}
	if _, err := os.Stat(sidecarBin); err != nil {
		t.Fatalf("EXA_E2E_SIDECAR=%s: %v", sidecarBin, err)
	}
}

// pdSimArgs are the engine flags of the P/D tests: simArgs in echo mode,
// with the KV-transfer latency a decode after a remote prefill waits.
func pdSimArgs(port int, transfer time.Duration) []string {
	return append(simArgs(port, 512, prefillPerToken), "--mode", "echo", "--kv-cache-transfer-latency", transfer.String())
}

// startSidecar starts pd-sidecar on port in front of the engine on
// vllmPort, with the NIXL v2 connector and plain HTTP, as llm-d deploys it
// beside a decode vLLM.
func startSidecar(t *testing.T, port, vllmPort int) string {
	t.Helper()
	requireSidecar(t)
	startProc(t, fmt.Sprintf("sidecar-%d", port), []string{"POD_IP=127.0.0.1"}, sidecarBin,
		"--port", strconv.Itoa(port), "--vllm-port", strconv.Itoa(vllmPort),
		"--kv-connector", "nixlv2", "--secure-proxy=false")
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	waitFor(t, 20*time.Second, "sidecar "+url+" /health", func() bool { return get(url+"/health") == http.StatusOK })
	return url
}

// setFaults sets an engine's injected failures through its admin API:
// rate percent of requests fail with the sim's server_error (503).
func setFaults(t *testing.T, base string, rate int) {
	t.Helper()
	body := fmt.Sprintf(`{"failure-injection-rate": %d, "failure-types": ["server_error"]}`, rate)
	resp, err := http.Post(base+"/admin/config", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "POST %s/admin/config: %s", base, b)
}

// simCounter sums the series of an engine's metric whose labels include
// labels.
func simCounter(t *testing.T, base, name string, labels map[string]string) float64 {
	t.Helper()
	return sumSeries(metricFamilies(t, base)[name], labels, func(m *dto.Metric) float64 { return m.GetCounter().GetValue() })
}

// remoteDecodes is how many prefill requests (remote decode asked for) an
// engine has answered: its vllm:request_success_total with finish reason
// remote_decode.
func remoteDecodes(t *testing.T, base string) float64 {
	return simCounter(t, base, "vllm:request_success_total", map[string]string{"finish_reason": "remote_decode"})
}

// pdAnswer is what a client reads of a chat answer, the parts that must
// not depend on where the request ran.
type pdAnswer struct {
	Content      string
	FinishReason string
	PromptTokens int
	OutputTokens int
	HasUsage     bool
}

// pdReply is one request's outcome.
type pdReply struct {
	status int
	header http.Header
	body   []byte
	answer pdAnswer
	ttft   time.Duration // to the first byte of the body (plain) or the first data line (streamed)
}

// pdRequest is a chat request body: a system prompt, a user message, a
// token limit; streamed ones ask for usage.
func pdRequest(system, user string, maxTokens int, stream bool) []byte {
	req := map[string]any{
		"model": simModel, "max_tokens": maxTokens, "stream": stream,
		"messages": []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": user}},
	}
	if stream {
		req["stream_options"] = map[string]any{"include_usage": true}
	}
	b, _ := json.Marshal(req)
	return b
}

// chatRequest is a JSON POST of body to base's /v1/chat/completions with
// the given headers (name, value pairs).
func chatRequest(t *testing.T, base string, body []byte, hdr ...string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return req
}

// pdPost sends a chat request to base with the given headers and reads the
// whole answer.
func pdPost(t *testing.T, base string, body []byte, hdr ...string) pdReply {
	t.Helper()
	req := chatRequest(t, base, body, hdr...)
	start := time.Now()
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	r := pdReply{status: resp.StatusCode, header: resp.Header}
	br := bufio.NewReader(resp.Body)
	if _, err := br.Peek(1); err == nil {
		r.ttft = time.Since(start)
	}
	r.body, err = io.ReadAll(br)
	require.NoError(t, err)
	if r.status != http.StatusOK {
		return r
	}
	type usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		var a struct {
			Choices []struct {
				FinishReason string `json:"finish_reason"`
				Message      struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
			Usage *usage `json:"usage"`
		}
		require.NoError(t, json.Unmarshal(r.body, &a), "%s", r.body)
		require.Len(t, a.Choices, 1, "%s", r.body)
		r.answer = pdAnswer{Content: a.Choices[0].Message.Content, FinishReason: a.Choices[0].FinishReason}
		if a.Usage != nil {
			r.answer.PromptTokens, r.answer.OutputTokens, r.answer.HasUsage = a.Usage.PromptTokens, a.Usage.CompletionTokens, true
		}
		return r
	}
	var sb strings.Builder
	for line := range strings.SplitSeq(string(r.body), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ev struct {
			Choices []struct {
				FinishReason *string `json:"finish_reason"`
				Delta        struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *usage `json:"usage"`
		}
		require.NoError(t, json.Unmarshal([]byte(data), &ev), "%s", data)
		for _, c := range ev.Choices {
			sb.WriteString(c.Delta.Content)
			if c.FinishReason != nil {
				r.answer.FinishReason = *c.FinishReason
			}
		}
		if ev.Usage != nil {
			r.answer.PromptTokens, r.answer.OutputTokens, r.answer.HasUsage = ev.Usage.PromptTokens, ev.Usage.CompletionTokens, true
		}
	}
	r.answer.Content = sb.String()
	return r
}

// pdStreamTTFT sends a streamed chat request and returns the time to its
// first data line and the reply's P/D header.
func pdStreamTTFT(t *testing.T, base string, body []byte) (time.Duration, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	sc := bufio.NewScanner(resp.Body)
	var ttft time.Duration
	for sc.Scan() {
		if ttft == 0 && strings.HasPrefix(sc.Text(), "data: ") {
			ttft = time.Since(start)
		}
	}
	require.Positive(t, ttft)
	return ttft, resp.Header.Get("X-Exa-Disagg")
}

// pdConfig is a temporary routing configuration for the exa CLI.
func pdConfig(t *testing.T) string { return filepath.Join(t.TempDir(), "routing.json") }

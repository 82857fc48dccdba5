//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Engine timing of TestPDTTFT: prefill costs pdPrefillPerToken per
// uncached token, times the load factor (1 + (factor-1)(running-1)/31 with
// 32 sequences at most); a decode after a remote prefill first waits for
// the KV transfer, pdTransferPerToken per prompt token.
const (
	pdPrefillPerToken  = 200 * time.Microsecond
	pdTransferPerToken = 20 * time.Microsecond
	pdLoadFactor       = 4
	pdBackground       = 16 // long decodes kept running on the decode engine under load
)

// TestPDTTFT measures time to first token through the gateway, co-located
// (the decode engine prefills) and split (the prefill engine prefills, the
// KV cache is transferred), for a short and a long prompt, with the decode
// engine idle and then busy with pdBackground long decodes. The figures
// are in docs/disaggregation.md. It asserts what holds whatever the
// machine: an idle split request pays the transfer on top of the same
// prefill, and under load the split request of the long prompt, prefilled
// on the idle prefill engine, is faster than the co-located one.
func TestPDTTFT(t *testing.T) {
	c := newPDClusterArgs(t, 1, 1, false, func(port int) []string {
		args := simArgs(port, 1024, pdPrefillPerToken)
		return append(args, "--kv-cache-transfer-time-per-token", pdTransferPerToken.String(),
			"--time-factor-under-load", strconv.Itoa(pdLoadFactor), "--inter-token-latency", "10ms")
	})
	d0 := c.decode[0]
	const n = 4
	run := func(load string, tokens, threshold int) time.Duration {
		c.setThreshold(threshold)
		var ttfts []time.Duration
		for i := range n {
			ttft, hdr := pdStreamTTFT(t, c.gw.url, pdRequest("Be brief.", words(fmt.Sprintf("%s%dt%dr%dw", load, tokens, threshold, i), tokens), 4, true))
			want := "split; "
			if threshold > 0 {
				want = "colocated; "
			}
			require.Contains(t, hdr, want)
			ttfts = append(ttfts, ttft)
		}
		return percentile(ttfts, 0.5)
	}
	type row struct {
		load             string
		tokens           int
		colocated, split time.Duration
	}
	var rows []row
	measure := func(load string) {
		for _, tokens := range []int{128, 2048} {
			r := row{load: load, tokens: tokens}
			r.colocated = run(load, tokens, 10_000_000)
			r.split = run(load, tokens, 0)
			rows = append(rows, r)
		}
	}
	measure("idle")

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range pdBackground {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body, _ := json.Marshal(map[string]any{"model": simModel, "max_tokens": 150, "ignore_eos": true, "stream": true,
				"messages": []map[string]string{{"role": "user", "content": fmt.Sprintf("background %d", i)}}})
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d0.url()+"/v1/chat/completions", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				if resp, err := client.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	waitFor(t, 20*time.Second, "background decodes running on the decode engine", func() bool {
		return simGauge(t, d0.url(), "vllm:num_requests_running") >= pdBackground
	})
	measure("busy")

	t.Logf("TTFT p50 of %d streamed requests through the gateway (prefill %v/token, transfer %v/token, load factor %d, %d background decodes when busy):",
		n, pdPrefillPerToken, pdTransferPerToken, pdLoadFactor, pdBackground)
	t.Logf("%-5s %7s %10s %10s", "load", "tokens", "colocated", "split")
	for _, r := range rows {
		t.Logf("%-5s %7d %10v %10v", r.load, r.tokens, r.colocated.Round(time.Millisecond), r.split.Round(time.Millisecond))
	}
	idleLong, busyLong := rows[1], rows[3]
	assert.Greater(t, idleLong.split, idleLong.colocated, "idle, a split pays the transfer on top of the same prefill")
	assert.Less(t, busyLong.split, busyLong.colocated, "busy, the long prompt's prefill on the idle prefill engine wins")
}

// simGauge returns the value of an engine's gauge (summed over series).
func simGauge(t *testing.T, base, name string) float64 {
	t.Helper()
	return sumSeries(metricFamilies(t, base)[name], nil, func(m *dto.Metric) float64 { return m.GetGauge().GetValue() })
}

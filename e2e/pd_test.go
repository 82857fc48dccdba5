//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/examlops/gateway/httpgw"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// transferLatency is the decode engines' --kv-cache-transfer-latency: the
// time to first token of a decode after a remote prefill.
const transferLatency = 300 * time.Millisecond

// pdCluster is a gateway serving simModel disaggregated: prefill engines,
// decode engines (behind pd-sidecars in sidecar mode).
type pdCluster struct {
	t       *testing.T
	cfg     string
	prefill []*sim
	decode  []*sim   // the decode engines
	decodes []string // the decode pool's addresses: the engines or their sidecars
	gw      *gatewayProc
}

// newPDCluster starts the engines (echo mode), stores the model with the
// exa CLI (split every request; load weights on queue only, so that a
// busy decode replica is avoided: see steer) and starts the gateway.
func newPDCluster(t *testing.T, nPrefill, nDecode int, sidecar bool) *pdCluster {
	return newPDClusterArgs(t, nPrefill, nDecode, sidecar, func(port int) []string { return pdSimArgs(port, transferLatency) })
}

// newPDClusterArgs is newPDCluster with the engines' flags given.
func newPDClusterArgs(t *testing.T, nPrefill, nDecode int, sidecar bool, simArgs func(port int) []string) *pdCluster {
	requireBinaries(t)
	c := &pdCluster{t: t, cfg: pdConfig(t)}
	args := []string{"serve", "routing", "set", simModel, "--disaggregate", "--prefill-pool", "prefill", "--decode-pool", "decode",
		"--pd-min-uncached-tokens", "0", "--load-weights", "queue=1,kv=0,latency=0"}
	if sidecar {
		args = append(args, "--pd-mode", "sidecar")
	}
	for i := range nPrefill {
		port := freePort(t)
		s := startSim(t, port, simArgs(port))
		c.prefill = append(c.prefill, s)
		args = append(args, "--pool", fmt.Sprintf("prefill:p%d=%s", i, s.url()))
	}
	for i := range nDecode {
		port := freePort(t)
		s := startSim(t, port, simArgs(port))
		c.decode = append(c.decode, s)
		addr := s.url()
		if sidecar {
			addr = startSidecar(t, freePort(t), port)
		}
		c.decodes = append(c.decodes, addr)
		args = append(args, "--pool", fmt.Sprintf("decode:d%d=%s", i, addr))
	}
	exa(t, c.cfg, args...)
	c.gw = startGateway(t, c.cfg)
	var addrs []string
	for _, s := range c.prefill {
		addrs = append(addrs, s.url())
	}
	for _, a := range append(addrs, c.decodes...) {
		waitFor(t, 20*time.Second, "gateway to admit "+a, func() bool {
			h, _ := c.gw.engineHealthy(t, a)
			return h
		})
	}
	return c
}

// setThreshold sets the decider's threshold with the CLI and waits for the
// gateway to load it.
func (c *pdCluster) setThreshold(tokens int) {
	exa(c.t, c.cfg, "serve", "routing", "set", simModel, "--pd-min-uncached-tokens", strconv.Itoa(tokens))
	waitFor(c.t, 10*time.Second, "gateway to load threshold "+strconv.Itoa(tokens), func() bool {
		d := c.gw.stats(c.t).Models[simModel].Disaggregation
		return d != nil && d.MinUncachedTokens == tokens
	})
}

// loads returns the gateway's last scraped load (running plus waiting) of
// each decode pool address.
func (c *pdCluster) loads() map[string]int {
	out := map[string]int{}
	for _, e := range c.gw.stats(c.t).Engines {
		if slices.Contains(c.decodes, e.Address) {
			n := 0
			if e.Load != nil {
				n = e.Load.Running + e.Load.Waiting
			}
			out[e.Address] = n
		}
	}
	return out
}

// steer makes the decode replicas other than decodes[i] look busy to the
// gateway (a long answer streaming from each engine, asked of it directly,
// as the gateway's scrape of /metrics shows) until stop is called, so that
// load-aware routing picks decodes[i]. Idle replicas tie, and ties go to
// the one with less prefill work sent so far, which a test cannot steer.
func (c *pdCluster) steer(i int) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for j, s := range c.decode {
		if j == i {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Echo mode answers with the message: 3000 tokens at 1 ms.
			body, _ := json.Marshal(map[string]any{"model": simModel, "max_tokens": 4000, "stream": true,
				"messages": []map[string]string{{"role": "user", "content": words("busy", 3000)}}})
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.url()+"/v1/chat/completions", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			if resp, err := client.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	c.steered(i)
	return func() { cancel(); wg.Wait() }
}

// steered waits until the gateway's view has decodes[i] idle and the other
// decode replicas busy: a scrape taken while the previous request ran on
// decodes[i] lingers until the next one.
func (c *pdCluster) steered(i int) {
	waitFor(c.t, 10*time.Second, fmt.Sprintf("gateway to see every decode replica but d%d busy", i), func() bool {
		l := c.loads()
		for j, a := range c.decodes {
			if (j == i) != (l[a] == 0) {
				return false
			}
		}
		return true
	})
}

// words returns n distinct words tagged with tag, so prompts do not share
// cached prefixes unless meant to.
func words(tag string, n int) string {
	ws := make([]string, n)
	for i := range ws {
		ws[i] = fmt.Sprintf("%s%d", tag, i)
	}
	return strings.Join(ws, " ")
}

// TestPDGatewayMode runs the NIXL sequence from the gateway against real
// engines: split answers equal co-located ones (streamed and not), the
// prefill engine counts its remote-decode requests, the time to first
// token of a split request includes the KV transfer, the decider splits
// only long uncached prompts, and faults fall back as specified.
func TestPDGatewayMode(t *testing.T) {
	c := newPDCluster(t, 1, 2, false)
	p0, d1 := c.prefill[0], c.decode[1]
	system := "You are a terse assistant. " + words("sys", 40)
	decided, split := 0, 0

	t.Run("identical output", func(t *testing.T) {
		for _, stream := range []bool{false, true} {
			for _, tc := range []struct {
				user      string
				maxTokens int
			}{{"what is the capital of france", 40}, {"name three colours of the rainbow please", 3}} {
				body := pdRequest(system, tc.user, tc.maxTokens, stream)
				got := pdPost(t, c.gw.url, body)
				decided, split = decided+1, split+1
				require.Equal(t, http.StatusOK, got.status, "%s", got.body)
				assert.True(t, strings.HasPrefix(got.header.Get(httpgw.HeaderDisagg), "split; "), got.header.Get(httpgw.HeaderDisagg))
				assert.Equal(t, "prefill/p0", got.header.Get(httpgw.HeaderPrefillReplica))
				assert.Contains(t, []string{"decode/d0", "decode/d1"}, got.header.Get(httpgw.HeaderReplica))
				colocated := pdPost(t, d1.url(), body) // the same request on one engine
				require.Equal(t, http.StatusOK, colocated.status)
				assert.Equal(t, colocated.answer, got.answer, "stream=%v max_tokens=%d", stream, tc.maxTokens)
				assert.NotEmpty(t, got.answer.Content)
				assert.True(t, got.answer.HasUsage, "usage (stream_options restored on the decode request)")
				t.Logf("stream=%-5v max_tokens=%-2d split and co-located answers: %+v", stream, tc.maxTokens, got.answer)
			}
		}
		assert.Equal(t, float64(split), remoteDecodes(t, p0.url()), "the prefill engine answered every split request as a remote-decode prefill")
	})

	t.Run("time to first token", func(t *testing.T) {
		const n = 8
		measure := func(tag string) []time.Duration {
			var out []time.Duration
			for i := range n {
				ttft, _ := pdStreamTTFT(t, c.gw.url, pdRequest(system, words(tag+strconv.Itoa(i), 30), 16, true))
				out = append(out, ttft)
			}
			return out
		}
		sp := measure("split")
		decided, split = decided+n, split+n
		c.setThreshold(10_000_000)
		co := measure("colocated")
		decided += n
		spMed, coMed := percentile(sp, 0.5), percentile(co, 0.5)
		t.Logf("TTFT through the gateway, %d streamed requests each (decode engine --kv-cache-transfer-latency %v, --prefill-time-per-token %v):"+
			" split p50 %v (min %v, max %v); co-located p50 %v (min %v, max %v)", n, transferLatency, prefillPerToken,
			spMed.Round(time.Millisecond), percentile(sp, 0).Round(time.Millisecond), percentile(sp, 1).Round(time.Millisecond),
			coMed.Round(time.Millisecond), percentile(co, 0).Round(time.Millisecond), percentile(co, 1).Round(time.Millisecond))
		assert.GreaterOrEqual(t, percentile(sp, 0), transferLatency, "every split request waits for the KV transfer")
		assert.Less(t, coMed, transferLatency, "co-located requests do not")
	})

	t.Run("decider", func(t *testing.T) {
		c.setThreshold(400) // 1600 prompt bytes at 4 bytes a token
		long := words("doc", 400)
		defer c.steer(0)() // so that the repeated prompt meets the decode replica that cached it
		for i, tc := range []struct{ user, want string }{
			{"a short question", "colocated"},
			{long, "split"},
			{long, "colocated"}, // now cached on its decode replica
			{words("other", 400), "split"},
		} {
			c.steered(0)
			got := pdPost(t, c.gw.url, pdRequest("Be brief.", tc.user, 8, false))
			require.Equal(t, http.StatusOK, got.status)
			assert.True(t, strings.HasPrefix(got.header.Get(httpgw.HeaderDisagg), tc.want+"; "), "request %d: %s", i, got.header.Get(httpgw.HeaderDisagg))
			decided++
			if tc.want == "split" {
				split++
			}
		}
		d := c.gw.stats(t).Models[simModel].Disaggregation
		require.NotNil(t, d)
		assert.Equal(t, uint64(decided), d.Decided)
		assert.Equal(t, uint64(split), d.Split)
		assert.InDelta(t, float64(split)/float64(decided), d.SplitShare, 1e-9)
		assert.Equal(t, float64(split), c.gw.metric(t, "exa_gateway_disagg_requests_total", map[string]string{"model": simModel, "path": "split"}))
		assert.Equal(t, float64(split), remoteDecodes(t, p0.url()))
		t.Logf("decider at %d tokens: %d of %d requests split (share %.3f)", d.MinUncachedTokens, d.Split, d.Decided, d.SplitShare)
	})

	t.Run("faults", func(t *testing.T) {
		c.setThreshold(0)
		body := pdRequest(system, "is this request answered", 20, true)
		want := pdPost(t, d1.url(), body).answer
		fallbacks := func(reason string) float64 {
			return c.gw.metric(t, "exa_gateway_disagg_fallbacks_total", map[string]string{"model": simModel, "reason": reason})
		}

		// A prefill engine failing with 503: decoded co-located.
		before := remoteDecodes(t, p0.url())
		setFaults(t, p0.url(), 100)
		got := pdPost(t, c.gw.url, body)
		setFaults(t, p0.url(), 0)
		require.Equal(t, http.StatusOK, got.status, "%s", got.body)
		assert.True(t, strings.HasPrefix(got.header.Get(httpgw.HeaderDisagg), "prefill_failed; "), got.header.Get(httpgw.HeaderDisagg))
		assert.Equal(t, want, got.answer)
		assert.Equal(t, before, remoteDecodes(t, p0.url()))
		assert.Equal(t, 1.0, fallbacks("prefill_failed"))
		assert.Zero(t, fallbacks("prefill_retry"), "one prefill engine: nothing to retry on")

		// A prefill 4xx is the client's: relayed, nothing decoded.
		decodes := c.gw.metric(t, "exa_gateway_replica_requests_total", map[string]string{"replica": "decode/d0"}) +
			c.gw.metric(t, "exa_gateway_replica_requests_total", map[string]string{"replica": "decode/d1"})
		got = pdPost(t, c.gw.url, body, "X-Return-Error", "400")
		assert.Equal(t, http.StatusBadRequest, got.status)
		assert.Contains(t, string(got.body), "Simulated error triggered by X-Return-Error header")
		assert.Equal(t, decodes, c.gw.metric(t, "exa_gateway_replica_requests_total", map[string]string{"replica": "decode/d0"})+
			c.gw.metric(t, "exa_gateway_replica_requests_total", map[string]string{"replica": "decode/d1"}))

		// A decode engine failing before its first byte: the decode
		// request goes to the other decode engine; the prefill is not rerun.
		before = remoteDecodes(t, p0.url())
		setFaults(t, c.decode[0].url(), 100)
		stop := c.steer(0)
		got = pdPost(t, c.gw.url, body)
		stop()
		setFaults(t, c.decode[0].url(), 0)
		require.Equal(t, http.StatusOK, got.status, "%s", got.body)
		assert.True(t, strings.HasPrefix(got.header.Get(httpgw.HeaderDisagg), "split; "), got.header.Get(httpgw.HeaderDisagg))
		assert.Equal(t, "decode/d1", got.header.Get(httpgw.HeaderReplica))
		assert.Equal(t, want, got.answer)
		assert.Equal(t, before+1, remoteDecodes(t, p0.url()))
		assert.Equal(t, 1.0, fallbacks("decode_retry"))
	})
}

// TestPDSidecarMode puts llm-d's pd-sidecar v0.7.1 in front of each decode
// engine: the gateway names the prefill engine in x-prefiller-host-port
// and the sidecar runs the NIXL sequence. Split answers equal co-located
// ones, the prefill engine counts them, TTFT includes the transfer, the
// sidecar decodes locally when the prefill fails with a 5xx and returns a
// 4xx, and a decode failure is retried on another sidecar.
func TestPDSidecarMode(t *testing.T) {
	requireSidecar(t)
	c := newPDCluster(t, 1, 2, true)
	p0, d1 := c.prefill[0], c.decode[1]
	system := "You are a terse assistant. " + words("sys", 40)
	for _, stream := range []bool{false, true} {
		body := pdRequest(system, "what is the capital of france", 40, stream)
		got := pdPost(t, c.gw.url, body)
		require.Equal(t, http.StatusOK, got.status, "%s", got.body)
		assert.True(t, strings.HasPrefix(got.header.Get(httpgw.HeaderDisagg), "split; "))
		assert.Equal(t, "prefill/p0", got.header.Get(httpgw.HeaderPrefillReplica))
		assert.Equal(t, pdPost(t, d1.url(), body).answer, got.answer, "stream=%v", stream)
	}
	assert.Equal(t, 2.0, remoteDecodes(t, p0.url()), "the sidecar sent both prefills to the engine the gateway named")

	ttft, hdr := pdStreamTTFT(t, c.gw.url, pdRequest(system, words("ttft", 30), 16, true))
	t.Logf("sidecar mode: split TTFT %v (%s)", ttft.Round(time.Millisecond), hdr)
	assert.GreaterOrEqual(t, ttft, transferLatency)

	body := pdRequest(system, "is this request answered", 20, false)
	want := pdPost(t, d1.url(), body).answer
	before := remoteDecodes(t, p0.url())
	setFaults(t, p0.url(), 100)
	got := pdPost(t, c.gw.url, body)
	setFaults(t, p0.url(), 0)
	require.Equal(t, http.StatusOK, got.status, "the sidecar decodes locally after a prefill 503: %s", got.body)
	assert.Equal(t, want, got.answer)
	assert.Equal(t, before, remoteDecodes(t, p0.url()))
	assert.Zero(t, c.gw.metric(t, "exa_gateway_disagg_fallbacks_total", map[string]string{"model": simModel, "reason": "prefill_retry"}),
		"the sidecar runs the prefill: the gateway neither sees nor retries it")

	got = pdPost(t, c.gw.url, body, "X-Return-Error", "400")
	assert.Equal(t, http.StatusBadRequest, got.status, "the sidecar returns a prefill 4xx: %s", got.body)

	setFaults(t, c.decode[0].url(), 100)
	stop := c.steer(0)
	got = pdPost(t, c.gw.url, body)
	stop()
	setFaults(t, c.decode[0].url(), 0)
	require.Equal(t, http.StatusOK, got.status, "%s", got.body)
	assert.Equal(t, "decode/d1", got.header.Get(httpgw.HeaderReplica))
	assert.Equal(t, want, got.answer)
	assert.Equal(t, 1.0, c.gw.metric(t, "exa_gateway_disagg_fallbacks_total", map[string]string{"model": simModel, "reason": "decode_retry"}))
}

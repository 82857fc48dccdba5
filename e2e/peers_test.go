//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// startGatewayOn is startGateway on a given port and scrape interval.
func startGatewayOn(t *testing.T, name, cfg string, port int, scrape time.Duration) *gatewayProc {
	p := startProc(t, name, []string{"EXA_CONFIG=" + cfg, os.Getenv("EXA_E2E_GATEWAY_ENV")}, exaBin, "serve", "gateway",
		"--listen", "127.0.0.1:"+strconv.Itoa(port), "--reload-interval", "100ms",
		"--probe-interval", "200ms", "--probe-timeout", "500ms", "--scrape-interval", scrape.String())
	g := &gatewayProc{url: "http://127.0.0.1:" + strconv.Itoa(port), p: p}
	waitFor(t, 20*time.Second, name+" /healthz", func() bool { return get(g.url+"/healthz") == http.StatusOK })
	return g
}

// Two exa gateways in front of the same two engines, each the other's
// peer: while B has a long prompt waiting at each replica (a gateway
// hears a peer only up to half its own mean pending prefill per replica:
// fleet.PeerCap) and a prompt sent through A waits for its first token,
// B's /metrics reports A's pending prefill at that replica as its peers'
// (exa_gateway_peer_prefill_blocks), and B sends a new prompt to the
// other replica; once A's request is answered, the count goes back to 0.
func TestPeersSharePendingPrefill(t *testing.T) {
	requireBinaries(t)
	var reps []string
	var urls []string
	for i := range 2 {
		port := freePort(t)
		// 2 ms per prompt token: a ~3,000-token prompt waits about 6 s
		// for its first token.
		s := startSim(t, port, simArgs(port, 4096, 2*time.Millisecond))
		reps = append(reps, "--replica", fmt.Sprintf("e%d=%s", i, s.url()))
		urls = append(urls, s.url())
	}
	portA, portB := freePort(t), freePort(t)
	urlA, urlB := "http://127.0.0.1:"+strconv.Itoa(portA), "http://127.0.0.1:"+strconv.Itoa(portB)
	cfgA, cfgB := filepath.Join(t.TempDir(), "a.json"), filepath.Join(t.TempDir(), "b.json")
	exa(t, cfgA, append([]string{"serve", "routing", "set", simModel, "--mode", "cache_aware", "--peer", urlB}, reps...)...)
	exa(t, cfgB, append([]string{"serve", "routing", "set", simModel, "--mode", "cache_aware", "--peer", urlA}, reps...)...)
	a := startGatewayOn(t, "gateway-a", cfgA, portA, 100*time.Millisecond)
	b := startGatewayOn(t, "gateway-b", cfgB, portB, 100*time.Millisecond)
	for _, g := range []*gatewayProc{a, b} {
		for _, u := range urls {
			waitFor(t, 10*time.Second, "engines healthy", func() bool { h, ok := g.engineHealthy(t, u); return h && ok })
		}
	}
	waitFor(t, 10*time.Second, "peers up", func() bool {
		return a.metric(t, "exa_gateway_peer_up", map[string]string{"peer": urlB}) == 1 &&
			b.metric(t, "exa_gateway_peer_up", map[string]string{"peer": urlA}) == 1
	})

	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	// B's own traffic: a ~3,000-token prompt at each replica, about 6 s
	// to its first token.
	long := strings.Repeat("peer sharing keeps the gateways honest about queued prefill. ", 300)
	bDone := make(chan result, 2)
	for i := range 2 {
		go func() { bDone <- streamChat(ctx, b.url, fmt.Sprint("system prompt ", i, " of gateway B"), long, 2) }()
		waitFor(t, 10*time.Second, "B's own pending prefill", func() bool {
			n := 0
			for j := range 2 {
				if b.metric(t, "exa_gateway_pending_prefill_blocks", map[string]string{"model": simModel, "replica": fmt.Sprintf("e%d", j)}) > 0 {
					n++
				}
			}
			return n == i+1
		})
	}
	// A's prompt, a third as long: within half of B's own mean.
	medium := strings.Repeat("peer sharing keeps the gateways honest about queued prefill. ", 100)
	done := make(chan result, 1)
	go func() { done <- streamChat(ctx, a.url, "system prompt of gateway A", medium, 2) }()

	// A counts the prompt as pending at the replica it chose; B reads it.
	var chosen string
	var pending float64
	waitFor(t, 10*time.Second, "A's pending prefill", func() bool {
		for i := range 2 {
			r := fmt.Sprintf("e%d", i)
			if v := a.metric(t, "exa_gateway_pending_prefill_blocks", map[string]string{"model": simModel, "replica": r}); v > 0 {
				chosen, pending = r, v
				return true
			}
		}
		return false
	})
	other := map[string]string{"e0": "e1", "e1": "e0"}[chosen]
	t.Logf("A: %g blocks pending at %s", pending, chosen)
	waitFor(t, 5*time.Second, "B's peer prefill", func() bool {
		return b.metric(t, "exa_gateway_peer_prefill_blocks", map[string]string{"model": simModel, "replica": chosen}) == pending
	})
	assert.Zero(t, b.metric(t, "exa_gateway_peer_prefill_blocks", map[string]string{"model": simModel, "replica": other}))

	// B routes a short new prompt away from A's queued prefill. (The
	// engine's running count, which B scrapes too, points the same way;
	// httpgw's TestPeersShareTheirPendingPrefill isolates the peer term.)
	rb := streamChat(ctx, b.url, "another system prompt", "a short question for B", 1)
	require.Equal(t, http.StatusOK, rb.status, rb.errText)
	assert.Equal(t, other, rb.replica, "B avoids the replica where A's prefill is queued")

	ra := <-done
	require.Equal(t, http.StatusOK, ra.status, ra.errText)
	assert.Equal(t, chosen, ra.replica)
	for range 2 {
		rl := <-bDone
		require.Equal(t, http.StatusOK, rl.status, rl.errText)
	}
	waitFor(t, 5*time.Second, "B's peer prefill back to 0", func() bool {
		return b.metric(t, "exa_gateway_peer_prefill_blocks", map[string]string{"model": simModel}) == 0
	})
}

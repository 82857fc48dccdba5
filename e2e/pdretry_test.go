//go:build e2e

package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/examlops/gateway/httpgw"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPDPrefillRetry runs gateway mode over two prefill engines and one
// decode engine: when both prefill engines fail (the sim's injected 503),
// the request is tried on each, then decoded co-located; when one fails,
// a prefill sent there is retried on the other, whose KV cache the decode
// engine receives (it counts the remote-decode prefill), and the answer
// equals the co-located one. It logs the time to first byte a retry adds.
func TestPDPrefillRetry(t *testing.T) {
	c := newPDCluster(t, 2, 1, false)
	p0, p1, d0 := c.prefill[0], c.prefill[1], c.decode[0]
	system := "You are a terse assistant. " + words("sys", 40)
	fallbacks := func(reason string) float64 {
		return c.gw.metric(t, "exa_gateway_disagg_fallbacks_total", map[string]string{"model": simModel, "reason": reason})
	}
	prefills := func() float64 { return remoteDecodes(t, p0.url()) + remoteDecodes(t, p1.url()) }
	ask := func(tag string) (pdReply, pdAnswer) {
		body := pdRequest(system, words(tag, 30), 16, true)
		return pdPost(t, c.gw.url, body), pdPost(t, d0.url(), body).answer
	}

	// Healthy prefill engines: the time to first byte of a split request.
	var base []time.Duration
	for i := range 4 {
		got, want := ask(fmt.Sprintf("base%d", i))
		require.Equal(t, http.StatusOK, got.status, "%s", got.body)
		require.True(t, strings.HasPrefix(got.header.Get(httpgw.HeaderDisagg), "split; "), got.header.Get(httpgw.HeaderDisagg))
		assert.Equal(t, want, got.answer)
		base = append(base, got.ttft)
	}
	require.Equal(t, 4.0, prefills())
	require.Zero(t, fallbacks("prefill_retry"))

	// Both prefill engines fail: one retry, then co-located.
	setFaults(t, p0.url(), 100)
	setFaults(t, p1.url(), 100)
	got, want := ask("both")
	setFaults(t, p1.url(), 0)
	require.Equal(t, http.StatusOK, got.status, "%s", got.body)
	assert.True(t, strings.HasPrefix(got.header.Get(httpgw.HeaderDisagg), "prefill_failed; "), got.header.Get(httpgw.HeaderDisagg))
	assert.Equal(t, want, got.answer)
	assert.Equal(t, 1.0, fallbacks("prefill_retry"), "the failed prefill was retried on the other engine")
	assert.Equal(t, 1.0, fallbacks("prefill_failed"))
	for _, p := range []string{"prefill/p0", "prefill/p1"} {
		assert.Equal(t, 3.0, c.gw.metric(t, "exa_gateway_replica_requests_total", map[string]string{"replica": p}), "%s: 2 healthy, 1 failed", p)
	}
	assert.Equal(t, 4.0, prefills())
	bothTTFB := got.ttft

	// p0 fails: the first prefill sent there is retried on p1 (after it,
	// p0 is ejected: its second failure in a row).
	var retried []time.Duration
	served := 0
	for i := 0; i < 6 && len(retried) == 0; i++ {
		before := fallbacks("prefill_retry")
		got, want := ask(fmt.Sprintf("one%d", i))
		require.Equal(t, http.StatusOK, got.status, "%s", got.body)
		require.True(t, strings.HasPrefix(got.header.Get(httpgw.HeaderDisagg), "split; "), got.header.Get(httpgw.HeaderDisagg))
		assert.Equal(t, "prefill/p1", got.header.Get(httpgw.HeaderPrefillReplica))
		assert.Equal(t, want, got.answer)
		served++
		if fallbacks("prefill_retry") > before {
			retried = append(retried, got.ttft)
		}
	}
	setFaults(t, p0.url(), 0)
	require.NotEmpty(t, retried, "no prefill went to the failing engine in %d requests", served)
	assert.Equal(t, 4.0+float64(served), prefills(), "every split's prefill ran on p1, and the decode engine got its KV cache")
	assert.Equal(t, 1.0, fallbacks("prefill_failed"))
	t.Logf("time to first byte, streamed, through the gateway: split p50 %v (min %v, max %v, %d requests); "+
		"split after a failed prefill retried on the other engine %v; both prefills failed, co-located %v",
		percentile(base, 0.5).Round(time.Millisecond), percentile(base, 0).Round(time.Millisecond), percentile(base, 1).Round(time.Millisecond),
		len(base), retried[0].Round(time.Millisecond), bothTTFB.Round(time.Millisecond))
}

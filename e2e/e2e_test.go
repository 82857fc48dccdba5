//go:build e2e

package e2e

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Workload and engine sizing. Each system prompt is about 330 tokens (21
// blocks of 16 with the question); the 24 prompts together (about 500
// blocks) fit in the four engines' caches (4 x 192 blocks) but not in any
// one, which is when routing decides the hit rate. 8 clients in flight can
// never need more than 192 blocks at once, so no engine refuses a request
// for want of cache space.
const (
	engines         = 4
	kvBlocks        = 192
	prefillPerToken = 200 * time.Microsecond
	groups          = 24
	promptWords     = 320
	requestsPerMode = 192
	workers         = 8
)

// workload returns the shared-prefix requests: system prompts drawn at
// random (seeded) from `groups`, each with its own question.
func workload(seed uint64, n int) [][2]string {
	rng := rand.New(rand.NewPCG(seed, 7))
	prompts := make([]string, groups)
	for g := range prompts {
		words := make([]string, promptWords)
		for i := range words {
			words[i] = fmt.Sprintf("w%d", rng.IntN(5000))
		}
		prompts[g] = fmt.Sprintf("You are assistant %d. ", g) + strings.Join(words, " ")
	}
	out := make([][2]string, n)
	for i := range out {
		out[i] = [2]string{prompts[rng.IntN(groups)], fmt.Sprintf("Question %d: what does item %d mean?", i, rng.IntN(1000))}
	}
	return out
}

type cluster struct {
	t    *testing.T
	sims []*sim
	cfg  string
	gw   *gatewayProc
}

// newCluster starts the engines, stores the model's replicas with the
// exa CLI and starts `exa serve gateway` on that configuration.
func newCluster(t *testing.T, mode string) *cluster {
	c := startCluster(t, mode, engines, func(port int) []string { return simArgs(port, kvBlocks, prefillPerToken) })
	c.waitAllHealthy()
	return c
}

// startCluster starts n engines with the flags simFlags gives for their
// port, stores them as simModel's replicas e0..e<n-1> in mode with the exa
// CLI and starts `exa serve gateway` on that configuration. It does not
// wait for the gateway to admit the engines.
func startCluster(t *testing.T, mode string, n int, simFlags func(port int) []string) *cluster {
	requireBinaries(t)
	c := &cluster{t: t, cfg: filepath.Join(t.TempDir(), "routing.json")}
	args := []string{"serve", "routing", "set", simModel, "--mode", mode}
	for i := range n {
		port := freePort(t)
		s := startSim(t, port, simFlags(port))
		c.sims = append(c.sims, s)
		args = append(args, "--replica", fmt.Sprintf("e%d=%s", i, s.url()))
	}
	exa(t, c.cfg, args...)
	c.gw = startGateway(t, c.cfg)
	return c
}

func (c *cluster) waitAllHealthy() {
	for _, s := range c.sims {
		waitFor(c.t, 20*time.Second, "gateway to admit "+s.url(), func() bool {
			h, _ := c.gw.engineHealthy(c.t, s.url())
			return h
		})
	}
}

// restartEngines restarts every engine (empty caches, zeroed counters) and
// waits until the gateway has them all in rotation again.
func (c *cluster) restartEngines() {
	for _, s := range c.sims {
		s.kill()
	}
	for _, s := range c.sims {
		s.start()
	}
	c.waitAllHealthy()
}

// setMode switches the model's routing mode with the CLI and waits for the
// gateway to reload it.
func (c *cluster) setMode(mode string) {
	exa(c.t, c.cfg, "serve", "routing", "set", simModel, "--mode", mode)
	waitFor(c.t, 10*time.Second, "gateway to reload mode "+mode, func() bool {
		return c.gw.stats(c.t).Models[simModel].Mode == mode
	})
}

// engineHits sums the engines' own prefix-cache counters.
func (c *cluster) engineHits() (hits, queries float64) {
	for _, s := range c.sims {
		h, q := engineCounters(c.t, s.url())
		hits += h
		queries += q
	}
	return hits, queries
}

type phase struct {
	mode            string
	hits, queries   float64
	p50, p90, mean  time.Duration
	ok, errs, total int
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func summarize(mode string, rs []result, hits, queries float64) phase {
	ph := phase{mode: mode, hits: hits, queries: queries, total: len(rs)}
	var ttfts []time.Duration
	var sum time.Duration
	for _, r := range rs {
		// An error event in a 200 stream (the engine failed the request
		// after the headers) is a failure, not a first token.
		if r.status == http.StatusOK && r.done && r.errText == "" {
			ph.ok++
			ttfts = append(ttfts, r.ttft)
			sum += r.ttft
		} else {
			ph.errs++
		}
	}
	ph.p50, ph.p90 = percentile(ttfts, 0.5), percentile(ttfts, 0.9)
	if len(ttfts) > 0 {
		ph.mean = sum / time.Duration(len(ttfts))
	}
	return ph
}

// TestCacheAwareBeatsRoundRobin drives the same shared-prefix workload
// through the gateway in round_robin and cache_aware modes, on freshly
// started engines each time, and compares the engines' own prefix-cache
// hit counters and the clients' measured times to first token.
func TestCacheAwareBeatsRoundRobin(t *testing.T) {
	c := newCluster(t, "round_robin")
	reqs := workload(1, requestsPerMode)
	var phases []phase
	for i, mode := range []string{"round_robin", "cache_aware"} {
		if i > 0 {
			c.restartEngines()
			c.setMode(mode)
		}
		rs := runWorkload(c.gw.url, reqs, workers, 4, nil)
		for j, r := range rs {
			require.True(t, r.status == http.StatusOK && r.done, "%s request %d: status %d, error %q, net %v", mode, j, r.status, r.errText, r.netErr)
		}
		hits, queries := c.engineHits()
		ph := summarize(mode, rs, hits, queries)
		phases = append(phases, ph)
		t.Logf("%-11s engine prefix-cache hits %6.0f of %6.0f prompt tokens (%.1f%%); TTFT p50 %v p90 %v mean %v; %d ok",
			mode, ph.hits, ph.queries, 100*ph.hits/ph.queries, ph.p50.Round(time.Millisecond), ph.p90.Round(time.Millisecond),
			ph.mean.Round(time.Millisecond), ph.ok)
	}
	rr, ca := phases[0], phases[1]
	assert.Greater(t, ca.hits, rr.hits, "cache_aware earns more engine prefix-cache hits")
	assert.Less(t, ca.p50, rr.p50, "cache_aware has a lower median TTFT")
	assert.Less(t, ca.mean, rr.mean, "cache_aware has a lower mean TTFT")
	st := c.gw.stats(t).Models[simModel]
	t.Logf("gateway /stats for cache_aware: requests %d, block hit rate %.3f, decisions %v", st.Requests,
		float64(st.MatchedBlocks)/max(1, float64(st.Blocks)), st.Decisions)
	assert.Equal(t, uint64(requestsPerMode), st.Requests)
	assert.Positive(t, st.Decisions["affinity"])

	// The operator's view of the same figures, live from the gateway.
	out := exa(t, c.cfg, "serve", "routing", "stats", simModel, "--gateway", c.gw.url)
	t.Logf("exa serve routing stats %s --gateway %s:\n%s", simModel, c.gw.url, out)
	assert.Contains(t, out, "affinity")
}

// TestEngineKilledMidRun kills one engine while the workload runs: every
// request gets an answer or a clear error, the gateway ejects the engine,
// and readmits it once it is back.
func TestEngineKilledMidRun(t *testing.T) {
	c := newCluster(t, "cache_aware")
	victim := c.sims[2]
	reqs := workload(2, 240)
	var killed atomic.Bool
	// Answers of 48 tokens at 1 ms each keep streams open when the engine
	// dies, so some are cut mid-way.
	rs := runWorkload(c.gw.url, reqs, workers, 48, func(done int) {
		if done == 60 && killed.CompareAndSwap(false, true) {
			victim.kill()
		}
	})
	require.True(t, killed.Load())
	// The engine stays dead until restarted below, so its ejection is
	// awaited here, on the test's goroutine.
	waitFor(t, 20*time.Second, "the gateway to eject the killed engine "+victim.url(), func() bool {
		h, _ := c.gw.engineHealthy(t, victim.url())
		return !h
	})
	var ok, clearErr int
	for i, r := range rs {
		require.True(t, r.clear(), "request %d got neither a response nor a clear error: status %d, done %v, error %q, net %v",
			i, r.status, r.done, r.errText, r.netErr)
		if r.status == http.StatusOK && r.done {
			ok++
		} else {
			if clearErr == 0 {
				t.Logf("first clear error (request %d, status %d): %s", i, r.status, r.errText)
			}
			clearErr++
		}
	}
	t.Logf("with one engine killed after 60 requests: %d answered, %d clear errors of %d", ok, clearErr, len(rs))
	assert.Greater(t, ok, len(rs)*9/10, "nearly every request is answered: a dead engine costs at most the requests in flight on it")
	assert.GreaterOrEqual(t, c.gw.metric(t, "exa_gateway_ejections_total", map[string]string{"address": victim.url()}), 1.0)
	total := c.gw.metric(t, "exa_gateway_requests_total", map[string]string{"model": simModel})
	assert.Equal(t, float64(len(rs)), total, "the gateway counted every request")

	// The engine comes back: the gateway's probes readmit it and traffic
	// reaches it again.
	victim.start()
	waitFor(t, 20*time.Second, "readmission of "+victim.url(), func() bool {
		h, _ := c.gw.engineHealthy(t, victim.url())
		return h
	})
	assert.GreaterOrEqual(t, c.gw.metric(t, "exa_gateway_readmissions_total", map[string]string{"address": victim.url()}), 1.0)
	rs = runWorkload(c.gw.url, workload(3, 64), workers, 4, nil)
	served := 0
	for _, r := range rs {
		require.True(t, r.status == http.StatusOK && r.done, "after readmission: status %d error %q net %v", r.status, r.errText, r.netErr)
		if r.replica == "e2" {
			served++
		}
	}
	t.Logf("after readmission the restarted engine served %d of %d requests", served, len(rs))
	assert.Positive(t, served, "the readmitted engine gets traffic again")
	_, q := engineCounters(t, victim.url())
	t.Logf("the restarted engine's prompt tokens: %v", q)
}

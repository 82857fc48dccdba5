//go:build e2e

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/httpgw"
)

// A disaggregated model on the exact index through the real exa binary:
// two prefill engines and one decode engine (llm-d-inference-sim, its KV
// cache on) publish their KV events to the gateway's bound endpoint; the
// gateway runs the NIXL sequence. Its prediction for the prefill replica
// (X-Exa-Prefill-Decision) is compared with the prefill engine's own
// count of cached prompt tokens (vllm:prefix_cache_hits), its prediction
// for the decode replica (X-Exa-Decision) with the decode answer's
// cached_tokens.

// pdKVAnswer is one request's outcome through the gateway.
type pdKVAnswer struct {
	disagg, prefill, decode string
	preMatched, preBlocks   int // predicted for the prefill replica, in blocks
	decMatched, decBlocks   int // predicted for the decode replica
	decCached, prompt       int // the decode engine's usage, in tokens
}

func pdKVPost(t *testing.T, base string, r kvRequest) pdKVAnswer {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": simModel, "max_tokens": 2, "messages": r.msgs()})
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
	a := pdKVAnswer{disagg: resp.Header.Get(httpgw.HeaderDisagg), prefill: resp.Header.Get(httpgw.HeaderPrefillReplica),
		decode: resp.Header.Get(httpgw.HeaderReplica)}
	match := func(h string, m, n *int) {
		v := resp.Header.Get(h)
		if v == "" {
			return
		}
		require.True(t, strings.HasSuffix(v, "; index=exact"), "%s: %q keyed on the engines' tokens", h, v)
		sm := decisionRE.FindStringSubmatch(v)
		require.NotNil(t, sm, "%s: %q", h, v)
		*m, _ = strconv.Atoi(sm[1])
		*n, _ = strconv.Atoi(sm[2])
	}
	match(httpgw.HeaderPrefillDecision, &a.preMatched, &a.preBlocks)
	match(httpgw.HeaderDecision, &a.decMatched, &a.decBlocks)
	a.decCached, a.prompt = usageTokens(t, raw)
	return a
}

// prefixCounts returns an engine's vllm:prefix_cache_hits and
// vllm:prefix_cache_queries: prompt tokens found cached, and looked up.
func prefixCounts(t *testing.T, base string) (hits, queries float64) {
	return simCounter(t, base, "vllm:prefix_cache_hits", nil), simCounter(t, base, "vllm:prefix_cache_queries", nil)
}

// TestPDExactIndex: every request split (threshold 0), a repeated
// document's prefill goes to the prefill replica whose engine holds it,
// and the gateway's predicted cached blocks equal the prefill engine's
// cached tokens / 16 for every request, and the decode engine's; with a
// threshold, a prompt the decode engine holds (its events say so after
// the KV transfer) is decoded co-located, a new one split.
func TestPDExactIndex(t *testing.T) {
	requireBinaries(t)
	zmqPort := freePort(t)
	prefill := []*kvSim{startKVSim(t, zmqPort, 4096, false), startKVSim(t, zmqPort, 4096, true)}
	decode := startKVSim(t, zmqPort, 4096, false)
	cfg := filepath.Join(t.TempDir(), "routing.json")
	exaSet(t, cfg, "--disaggregate", "--prefill-pool", "prefill", "--decode-pool", "decode", "--pd-min-uncached-tokens", "0",
		"--index", "exact", "--block-size", strconv.Itoa(kvBlockSize), "--kv-events-bind", "tcp://127.0.0.1:"+strconv.Itoa(zmqPort),
		"--pool", "prefill:p0="+prefill[0].url(), "--pool", "prefill:p1="+prefill[1].url(), "--pool", "decode:d0="+decode.url())
	g := startGateway(t, cfg)
	keys := map[string]*kvSim{"prefill/p0": prefill[0], "prefill/p1": prefill[1], "decode/d0": decode}
	for name, s := range keys {
		waitFor(t, 20*time.Second, "gateway to admit "+name, func() bool { h, _ := g.engineHealthy(t, s.url()); return h })
		pdKVWarmUp(t, g, s, simModel+"/"+name)
	}

	rng := rand.New(rand.NewPCG(7, 11))
	docs := make([]string, 3)
	for i := range docs {
		docs[i] = fmt.Sprintf("Document %d. ", i) + kvWords(rng, 300)
	}
	holder := map[int]string{} // document → the prefill replica that prefilled it first
	order := []int{0, 1, 0, 2, 1, 0, 2, 1, 2, 0}
	agree, repeats := 0, 0
	for i, d := range order {
		r := kvRequest{system: docs[d], user: fmt.Sprintf("Question %d: %s?", i, kvWords(rng, 40))}
		before := g.kvEngines(t)
		var hits, queries [2]float64
		for j, s := range prefill {
			hits[j], queries[j] = prefixCounts(t, s.url())
		}
		a := pdKVPost(t, g.url, r)
		require.True(t, strings.HasPrefix(a.disagg, "split; "), "request %d: %s", i, a.disagg)
		p := prefill[0]
		j := 0
		if a.prefill == "prefill/p1" {
			p, j = prefill[1], 1
		}
		// The prefill engine's own count of the request's prompt tokens
		// found cached (its metrics lag its answer a little).
		var h, q float64
		waitFor(t, 10*time.Second, "prefix cache counters of "+a.prefill, func() bool {
			h, q = prefixCounts(t, p.url())
			return q > queries[j]
		})
		preCached, prePrompt := int(h-hits[j]), int(q-queries[j])
		require.Equal(t, a.prompt, prePrompt, "request %d: both engines saw the same prompt", i)
		require.Equal(t, a.prompt/kvBlockSize, a.preBlocks, "request %d: the gateway keyed the engines' tokens", i)
		t.Logf("request %d (document %d): prefill %s predicted %d/%d blocks, engine cached %d tokens; decode %s predicted %d, engine cached %d",
			i, d, a.prefill, a.preMatched, a.preBlocks, preCached, a.decode, a.decMatched, a.decCached)
		if a.preMatched == preCached/kvBlockSize && a.decMatched == a.decCached/kvBlockSize {
			agree++
		}
		if first, seen := holder[d]; seen {
			repeats++
			require.Equal(t, first, a.prefill, "request %d: document %d's prefill goes where it is cached", i, d)
			require.Positive(t, a.preMatched, "request %d", i)
		} else {
			holder[d] = a.prefill
		}
		// Both engines' events reach the gateway before the next request.
		waitStored(t, g, before, a.prefill, a.prompt, preCached)
		waitStored(t, g, before, a.decode, a.prompt, a.decCached)
	}
	t.Logf("%d/%d requests: predicted cached blocks equal the prefill and decode engines' cached_tokens / 16; %d repeated documents prefilled where cached",
		agree, len(order), repeats)
	require.Equal(t, len(order), agree)
	require.Equal(t, 7, repeats)

	// The decider on the decode engine's events: the decode engine stored
	// every block it received, so a repeated prompt stays co-located.
	exaSet(t, cfg, "--pd-min-uncached-tokens", "64")
	waitFor(t, 10*time.Second, "threshold 64", func() bool {
		d := g.stats(t).Models[simModel].Disaggregation
		return d != nil && d.MinUncachedTokens == 64
	})
	remote := remoteDecodes(t, prefill[0].url()) + remoteDecodes(t, prefill[1].url())
	// A new question over document 0: more than 64 tokens are new to the
	// decode engine, so it is split; its blocks reach the decode engine.
	last := kvRequest{system: docs[0], user: "Question 10: " + kvWords(rng, 80) + "?"}
	before := g.kvEngines(t)
	a := pdKVPost(t, g.url, last)
	require.True(t, strings.HasPrefix(a.disagg, "split; "), a.disagg)
	t.Logf("threshold 64, a new question: %s, decode predicted %d/%d blocks, engine cached %d tokens", a.disagg, a.decMatched, a.decBlocks, a.decCached)
	waitStored(t, g, before, a.decode, a.prompt, a.decCached)
	// Asked again, it is wholly on the decode engine: co-located.
	a = pdKVPost(t, g.url, last)
	t.Logf("asked again: %s, decode predicted %d/%d blocks, engine cached %d tokens", a.disagg, a.decMatched, a.decBlocks, a.decCached)
	require.True(t, strings.HasPrefix(a.disagg, "colocated; uncached=0"), a.disagg)
	require.Empty(t, a.prefill)
	require.Equal(t, a.decBlocks, a.decMatched)
	require.Equal(t, a.decCached/kvBlockSize, a.decMatched, "the decode engine served it from cache")
	waitFor(t, 10*time.Second, "one prefill, the split's, counted by the prefill engines", func() bool {
		return remoteDecodes(t, prefill[0].url())+remoteDecodes(t, prefill[1].url()) == remote+1
	})
	before = g.kvEngines(t)
	fresh := pdKVPost(t, g.url, kvRequest{system: "Document 9. " + kvWords(rng, 150), user: "Question: new?"})
	require.True(t, strings.HasPrefix(fresh.disagg, "split; "), fresh.disagg)
	require.Zero(t, fresh.preMatched+fresh.decMatched, "a new document")
	waitStored(t, g, before, fresh.prefill, fresh.prompt, 0)
	waitStored(t, g, before, fresh.decode, fresh.prompt, fresh.decCached)

	rec := g.stats(t).Models[simModel]
	require.Equal(t, config.IndexExact, rec.Index)
	require.NotNil(t, rec.KVEvents)
	require.Len(t, rec.KVEvents.Engines, 3)
	for _, e := range rec.KVEvents.Engines {
		require.Zero(t, e.Dropped+e.Gaps+e.Restarts+e.Clears, "%+v", e)
	}
	require.Zero(t, g.metric(t, "exa_gateway_kv_unresolved_total", nil))
	// Each pool's index holds what its engines' events say they hold.
	require.NotNil(t, rec.Disaggregation.Prefill)
	engines := g.kvEngines(t)
	for _, r := range append(rec.Replicas, rec.Disaggregation.Prefill.Replicas...) {
		require.Positive(t, r.CachedBlocks, r.Name)
		require.Equal(t, engines[simModel+"/"+r.Name].MappedBlocks, r.CachedBlocks, r.Name)
	}
	out := exa(t, cfg, "serve", "routing", "stats", simModel, "--gateway", g.url)
	t.Logf("exa serve routing stats:\n%s", out)
	require.Contains(t, out, "prefill pool:")
	require.Contains(t, out, "exact index (blocks of 16 tokens")
}

// waitStored waits until the gateway has applied the blocks the engine of
// replica name (pool/name) stored for a request of prompt tokens, cached
// of them, counted from before (kvEngines, taken before sending).
func waitStored(t *testing.T, g *gatewayProc, before map[string]config.KVEngineStats, name string, prompt, cached int) {
	t.Helper()
	key := simModel + "/" + name
	stored := uint64(prompt/kvBlockSize - cached/kvBlockSize)
	waitFor(t, 10*time.Second, fmt.Sprintf("%d stored blocks of %s", stored, key), func() bool {
		e := g.kvEngines(t)[key]
		return e.StoredBlocks >= before[key].StoredBlocks+stored || e.Dropped > before[key].Dropped
	})
}

// pdKVWarmUp sends an engine unique short prompts directly until one of
// its events reaches the gateway (a PUB drops what it publishes before
// the subscription reaches it).
func pdKVWarmUp(t *testing.T, g *gatewayProc, s *kvSim, key string) {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(s.port), 3))
	for attempt := 0; ; attempt++ {
		before := g.kvEngines(t)[key].Messages
		kvRequest{prompt: fmt.Sprintf("warm up %d %d ", s.port, attempt) + kvWords(rng, 20)}.send(t, s.url())
		deadline := time.Now().Add(2 * time.Second)
		for g.kvEngines(t)[key].Messages <= before && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if g.kvEngines(t)[key].Messages > before {
			return
		}
		require.Less(t, attempt, 10, "engine %s: no event reached the gateway", key)
	}
}

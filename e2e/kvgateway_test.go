//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/examlops/gateway/config"
)

// The exact index through the real exa binary: `exa serve routing set
// --index exact` writes the configuration, `exa serve gateway` listens
// for (or connects to) the llm-d-inference-sim engines' KV events,
// tokenizes each request on an engine's /tokenize and routes it; its
// prediction (X-Exa-Decision: matched=M/N blocks of 16 tokens) is compared
// with the engine's usage.prompt_tokens_details.cached_tokens.

// kvReplicaArgs names each sim a replica s0, s1... at its address, whose
// host:port is its POD_IP: the pod its topic names.
func kvReplicaArgs(sims []*kvSim) []string {
	var args []string
	for i, s := range sims {
		args = append(args, "--replica", fmt.Sprintf("s%d=%s", i, s.url()))
	}
	return args
}

// exaSet runs `exa serve routing set simModel ARGS` on cfg.
func exaSet(t *testing.T, cfg string, args ...string) {
	t.Helper()
	exa(t, cfg, append([]string{"serve", "routing", "set", simModel}, args...)...)
}

// kvAnswer is one request's outcome through a gateway.
type kvAnswer struct {
	replica         string
	matched, blocks int  // the gateway's prediction, in blocks
	exact           bool // keyed on the exact index, without fallback
	fallback        string
	cached, prompt  int // the engine's usage, in tokens
	latency         time.Duration
}

var decisionRE = regexp.MustCompile(`matched=(\d+)/(\d+)`)

// sendVia posts the request to a gateway (one output token, not
// streamed) and reads its decision header and usage.
func (r kvRequest) sendVia(t *testing.T, base string) kvAnswer {
	t.Helper()
	path, b := r.body()
	start := time.Now()
	resp, err := http.Post(base+path, "application/json", bytes.NewReader(b))
	require.NoError(t, err)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	a := kvAnswer{latency: time.Since(start), replica: resp.Header.Get("X-Exa-Replica")}
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
	dec := resp.Header.Get("X-Exa-Decision")
	m := decisionRE.FindStringSubmatch(dec)
	require.NotNil(t, m, "decision %q", dec)
	a.matched, _ = strconv.Atoi(m[1])
	a.blocks, _ = strconv.Atoi(m[2])
	a.exact = strings.HasSuffix(dec, "; index=exact")
	if _, fb, ok := strings.Cut(dec, "fallback="); ok {
		a.fallback = fb
	}
	a.cached, a.prompt = usageTokens(t, raw)
	return a
}

// kvEngines returns a gateway's KV-event figures of simModel's engines,
// by replica (model/replica).
func (g *gatewayProc) kvEngines(t *testing.T) map[string]config.KVEngineStats {
	t.Helper()
	out := map[string]config.KVEngineStats{}
	rec, ok := g.stats(t).Models[simModel]
	if !ok || rec.KVEvents == nil {
		return out
	}
	for _, e := range rec.KVEvents.Engines {
		for _, r := range e.Replicas {
			out[r] = e
		}
	}
	return out
}

// waitEvents waits until each gateway has applied the blocks the engine
// of replica stored for a request (prompt minus cached tokens, in whole
// blocks), counted from before (kvEngines of each, taken before sending).
func waitEvents(t *testing.T, gws []*gatewayProc, before []map[string]config.KVEngineStats, a kvAnswer) {
	t.Helper()
	stored := uint64(a.prompt/kvBlockSize - a.cached/kvBlockSize)
	if stored == 0 {
		return
	}
	key := simModel + "/" + a.replica
	for i, g := range gws {
		b := before[i][key]
		waitFor(t, 10*time.Second, fmt.Sprintf("%d stored blocks of %s at gateway %d", stored, key, i), func() bool {
			e := g.kvEngines(t)[key]
			return e.StoredBlocks >= b.StoredBlocks+stored || e.Dropped > b.Dropped
		})
	}
}

// kvGatewayWarmUp sends each engine unique one-block prompts until its
// events reach every gateway (a PUB drops what it publishes before a
// subscription reaches it).
func kvGatewayWarmUp(t *testing.T, sims []*kvSim, gws ...*gatewayProc) {
	t.Helper()
	for i, s := range sims {
		key := fmt.Sprintf("%s/s%d", simModel, i)
		rng := rand.New(rand.NewPCG(uint64(s.port), uint64(s.n)))
		for attempt := 0; ; attempt++ {
			before := make([]uint64, len(gws))
			for j, g := range gws {
				before[j] = g.kvEngines(t)[key].Messages
			}
			kvRequest{prompt: fmt.Sprintf("warm up %d %d %d ", s.port, s.n, attempt) + kvWords(rng, 20)}.send(t, s.url())
			reached := func() bool {
				for j, g := range gws {
					if g.kvEngines(t)[key].Messages <= before[j] {
						return false
					}
				}
				return true
			}
			deadline := time.Now().Add(2 * time.Second)
			for !reached() && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if reached() {
				break
			}
			require.Less(t, attempt, 10, "engine %s: no event reached the gateways", s.pod())
		}
	}
}

// kvRunVia sends the requests, request i through gateway (i/2)%len(gws)
// (kvWorkload alternates completions and chats, so each gateway gets
// both), waiting
// after each for its engine's events to reach every gateway on the exact
// index (wait), and returns the answers.
func kvRunVia(t *testing.T, gws []*gatewayProc, reqs []kvRequest, wait bool) []kvAnswer {
	t.Helper()
	out := make([]kvAnswer, len(reqs))
	for i, r := range reqs {
		var before []map[string]config.KVEngineStats
		if wait {
			for _, g := range gws {
				before = append(before, g.kvEngines(t))
			}
		}
		out[i] = r.sendVia(t, gws[(i/2)%len(gws)].url)
		if wait {
			waitEvents(t, gws, before, out[i])
		}
	}
	return out
}

// tokenHitRate is the share of prompt tokens the engines served from cache.
func tokenHitRate(as []kvAnswer) float64 {
	cached, prompt := 0, 0
	for _, a := range as {
		cached += a.cached
		prompt += a.prompt
	}
	return float64(cached) / float64(prompt)
}

// TestKVGatewayExactPrediction: three engines (two publishing arrays, one
// maps) publish to the gateway's bound endpoint; for at least 99% of 150
// requests (completions and chats over 12 shared documents) the gateway's
// predicted cached blocks are the engine's cached_tokens / 16.
func TestKVGatewayExactPrediction(t *testing.T) {
	requireBinaries(t)
	zmqPort := freePort(t)
	sims := []*kvSim{startKVSim(t, zmqPort, 4096, false), startKVSim(t, zmqPort, 4096, false), startKVSim(t, zmqPort, 4096, true)}
	cfg := filepath.Join(t.TempDir(), "routing.json")
	exaSet(t, cfg, append([]string{"--mode", "cache_aware", "--index", "exact", "--block-size", strconv.Itoa(kvBlockSize),
		"--kv-events-bind", "tcp://127.0.0.1:" + strconv.Itoa(zmqPort)}, kvReplicaArgs(sims)...)...)
	g := startGateway(t, cfg)
	kvGatewayWarmUp(t, sims, g)

	reqs := kvWorkload(1, 12, 150)
	answers := kvRunVia(t, []*gatewayProc{g}, reqs, true)
	agree, hits, exact := 0, 0, 0
	for i, a := range answers {
		if a.exact {
			exact++
		}
		if a.exact && a.matched == a.cached/kvBlockSize {
			agree++
		} else {
			t.Logf("request %d on %s: predicted %d cached blocks (%s), engine %d of %d", i, a.replica, a.matched, a.fallback, a.cached/kvBlockSize, a.prompt/kvBlockSize)
		}
		if a.cached > 0 {
			hits++
		}
		if a.exact {
			require.Equal(t, a.prompt/kvBlockSize, a.blocks, "request %d: the gateway keyed the engine's own tokens", i)
		}
	}
	t.Logf("through exa serve gateway: %d/%d predictions equal the engine's cached_tokens (rounded to blocks); %d keyed exactly; %d hit; token hit rate %.3f",
		agree, len(answers), exact, hits, tokenHitRate(answers))
	require.GreaterOrEqual(t, agree*100, 99*len(answers))
	require.GreaterOrEqual(t, hits*2, len(answers), "the workload reuses prefixes")

	// The figures, in /stats, /metrics and `exa serve routing stats`.
	rec := g.stats(t).Models[simModel]
	require.Equal(t, config.IndexExact, rec.Index)
	require.NotNil(t, rec.KVEvents)
	require.Equal(t, uint64(len(reqs)), rec.KVEvents.Tokenize.Requests)
	require.Len(t, rec.KVEvents.Engines, 3)
	for _, e := range rec.KVEvents.Engines {
		require.Zero(t, e.Dropped+e.Gaps+e.Restarts+e.Clears, "%+v", e)
		require.Positive(t, e.StoredBlocks)
	}
	for _, r := range rec.Replicas {
		require.Equal(t, g.kvEngines(t)[simModel+"/"+r.Name].MappedBlocks, r.CachedBlocks, r.Name)
	}
	require.Positive(t, g.metric(t, "exa_gateway_kv_events_applied_total", nil))
	require.Zero(t, g.metric(t, "exa_gateway_kv_unresolved_total", nil))
	require.Equal(t, float64(len(reqs)), g.metric(t, "exa_gateway_tokenize_requests_total", map[string]string{"model": simModel}))
	out := exa(t, cfg, "serve", "routing", "stats", simModel, "--gateway", g.url)
	t.Logf("exa serve routing stats:\n%s", out)
	require.Contains(t, out, "exact index (blocks of 16 tokens")
	require.Contains(t, out, "events: listening on tcp://127.0.0.1:"+strconv.Itoa(zmqPort))
}

// TestKVGatewayTwoGateways: two `exa serve gateway` processes on one
// configuration, each connected to a relay that republishes every
// engine's events (test harness), take turns routing. The engines' token
// hit rate with the exact index is within 2 points of one gateway's; the
// approximate index's drop is measured beside it.
func TestKVGatewayTwoGateways(t *testing.T) {
	requireBinaries(t)
	fwdSub, fwdPub := kvForwarder(t)
	sims := []*kvSim{startKVSim(t, fwdSub, 4096, false), startKVSim(t, fwdSub, 4096, true), startKVSim(t, fwdSub, 4096, false)}
	cfg := filepath.Join(t.TempDir(), "routing.json")
	relay := "tcp://127.0.0.1:" + strconv.Itoa(fwdPub)
	args := append([]string{"--mode", "cache_aware", "--index", "exact"}, kvReplicaArgs(sims)...)
	for i := range sims {
		args = append(args, "--kv-events-connect", fmt.Sprintf("s%d=%s", i, relay))
	}
	exaSet(t, cfg, args...)
	gws := []*gatewayProc{startGateway(t, cfg), startGateway(t, cfg)}
	kvGatewayWarmUp(t, sims, gws...)

	// The same workload shape in each phase, with text of its own so that
	// no phase hits what another cached.
	phase := func(name string) []kvRequest {
		reqs := kvWorkload(4, 10, 120)
		for i := range reqs {
			reqs[i].prompt = strings.ReplaceAll(reqs[i].prompt, "Document", name+" document")
			reqs[i].system = strings.ReplaceAll(reqs[i].system, "Document", name+" document")
		}
		return reqs
	}
	one := kvRunVia(t, gws[:1], phase("one-exact"), true)
	two := kvRunVia(t, gws, phase("two-exact"), true)
	agree := 0
	for _, a := range two {
		if a.exact && a.matched == a.cached/kvBlockSize {
			agree++
		}
	}

	exaSet(t, cfg, "--index", "approximate")
	for _, g := range gws {
		waitFor(t, 10*time.Second, "the approximate index", func() bool { return g.stats(t).Models[simModel].Index == config.IndexApproximate })
	}
	oneA := kvRunVia(t, gws[:1], phase("one-approx"), false)
	twoA := kvRunVia(t, gws, phase("two-approx"), false)

	for _, ph := range []struct {
		name string
		as   []kvAnswer
	}{{"one exact", one}, {"two exact", two}, {"one approx", oneA}, {"two approx", twoA}} {
		per := map[string]int{}
		for _, a := range ph.as {
			per[a.replica]++
		}
		t.Logf("%s: requests per replica %v", ph.name, per)
	}
	h1, h2, a1, a2 := tokenHitRate(one), tokenHitRate(two), tokenHitRate(oneA), tokenHitRate(twoA)
	t.Logf("engines' token hit rate, 120 requests over 10 documents on 3 engines: exact index: one gateway %.3f, two taking turns %.3f (%+.3f); "+
		"approximate index: one gateway %.3f, two taking turns %.3f (%+.3f); two exact gateways predicted %d/%d exactly",
		h1, h2, h2-h1, a1, a2, a2-a1, agree, len(two))
	require.GreaterOrEqual(t, h2, h1-0.02, "two gateways on the exact index hit within 2 points of one")
	require.GreaterOrEqual(t, agree*100, 99*len(two))
}

// TestKVGatewayRestart: an engine killed mid-run is ejected, and its
// entries leave the index; restarted (same address, same pod, its
// sequence starting over) it is readmitted and the index holds only what
// it stored since: every prediction on it is exact, none stale.
func TestKVGatewayRestart(t *testing.T) {
	requireBinaries(t)
	zmqPort := freePort(t)
	sims := []*kvSim{startKVSim(t, zmqPort, 2048, false), startKVSim(t, zmqPort, 2048, false)}
	cfg := filepath.Join(t.TempDir(), "routing.json")
	exaSet(t, cfg, append([]string{"--mode", "cache_aware", "--index", "exact",
		"--kv-events-bind", "tcp://127.0.0.1:" + strconv.Itoa(zmqPort)}, kvReplicaArgs(sims)...)...)
	g := startGateway(t, cfg)
	kvGatewayWarmUp(t, sims, g)
	reqs := kvWorkload(2, 6, 40)
	kvRunVia(t, []*gatewayProc{g}, reqs, true)
	cachedOf := func(replica string) int {
		for _, r := range g.stats(t).Models[simModel].Replicas {
			if r.Name == replica {
				return r.CachedBlocks
			}
		}
		return -1
	}
	heldBefore := cachedOf("s0")
	require.Positive(t, heldBefore)

	victim := sims[0]
	victim.p.kill()
	waitFor(t, 10*time.Second, "s0 ejected", func() bool { h, _ := g.engineHealthy(t, victim.url()); return !h })
	waitFor(t, 5*time.Second, "s0's entries reset", func() bool { return cachedOf("s0") == 0 })
	require.Equal(t, uint64(1), g.kvEngines(t)[simModel+"/s0"].Resets)

	victim.start()
	waitFor(t, 10*time.Second, "s0 readmitted", func() bool { h, _ := g.engineHealthy(t, victim.url()); return h })
	kvGatewayWarmUp(t, sims[:1], g)
	e := g.kvEngines(t)[simModel+"/s0"]
	require.Equal(t, e.MappedBlocks, cachedOf("s0"), "only blocks stored since the restart")
	require.Less(t, cachedOf("s0"), heldBefore, "the warm-up prompt's")

	// The old prompts again: every prediction is the engine's count,
	// on either engine; those sent to the restarted one find nothing
	// stale.
	answers := kvRunVia(t, []*gatewayProc{g}, reqs, true)
	agree, onVictim := 0, 0
	for _, a := range answers {
		if a.exact && a.matched == a.cached/kvBlockSize {
			agree++
		}
		if a.replica == "s0" {
			onVictim++
		}
	}
	t.Logf("after the restart: %d/%d predictions exact, %d requests on the restarted engine", agree, len(answers), onVictim)
	require.Equal(t, len(answers), agree)
}

// TestKVGatewayLatency measures what the exact index adds per request
// through exa serve gateway: two gateways over the same two engines, one
// on the exact index (tokenizing on an engine), one on the approximate,
// take turns with the same requests; each prompt is sent twice, the
// second time answered from the gateway's cache of tokenized requests.
// Logged, not asserted: timings.
func TestKVGatewayLatency(t *testing.T) {
	requireBinaries(t)
	zmqPort := freePort(t)
	sims := []*kvSim{startKVSim(t, zmqPort, 4096, false), startKVSim(t, zmqPort, 4096, false)}
	exactCfg := filepath.Join(t.TempDir(), "exact.json")
	exaSet(t, exactCfg, append([]string{"--mode", "cache_aware", "--index", "exact",
		"--kv-events-bind", "tcp://127.0.0.1:" + strconv.Itoa(zmqPort)}, kvReplicaArgs(sims)...)...)
	approxCfg := filepath.Join(t.TempDir(), "approx.json")
	exaSet(t, approxCfg, append([]string{"--mode", "cache_aware"}, kvReplicaArgs(sims)...)...)
	ge, ga := startGateway(t, exactCfg), startGateway(t, approxCfg)
	kvGatewayWarmUp(t, sims, ge)

	const n = 200
	reqs := kvWorkload(9, 20, n)
	var first, again [2][]time.Duration // [exact, approximate]
	for _, r := range reqs {
		for _, into := range []*[2][]time.Duration{&first, &again} {
			e := r.sendVia(t, ge.url)
			a := r.sendVia(t, ga.url)
			require.True(t, e.exact, "keyed on the exact index")
			into[0] = append(into[0], e.latency)
			into[1] = append(into[1], a.latency)
		}
	}
	pct := func(d []time.Duration, p float64) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		return s[int(p*float64(len(s)-1))]
	}
	for _, c := range []struct {
		name string
		d    [2][]time.Duration
	}{{"first sight (tokenized on an engine)", first}, {"repeated (tokenizer cache)", again}} {
		t.Logf("%s, %d requests each, client-side latency: exact p50 %v p90 %v p99 %v; approximate p50 %v p90 %v p99 %v; p50 difference %v",
			c.name, n, pct(c.d[0], .5), pct(c.d[0], .9), pct(c.d[0], .99), pct(c.d[1], .5), pct(c.d[1], .9), pct(c.d[1], .99),
			pct(c.d[0], .5)-pct(c.d[1], .5))
	}
	rec := ge.stats(t).Models[simModel].KVEvents
	t.Logf("exact gateway: %d tokenizations, %d engine /tokenize calls", rec.Tokenize.Requests, rec.Tokenize.EngineCalls)
	require.Equal(t, uint64(2*n), rec.Tokenize.Requests)
	require.Equal(t, uint64(n), rec.Tokenize.EngineCalls, "each distinct request tokenized on an engine once")
}

// rawPublisher speaks ZMTP 3 (NULL mechanism) as a PUB from a chosen
// local address: a rogue on another loopback address (Linux routes all
// of 127.0.0.0/8 to lo without setup).
func rawPublisher(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	b := make([]byte, 64)
	b[0], b[9], b[10] = 0xff, 0x7f, 3
	copy(b[12:], "NULL")
	b = append(b, 0x04, 25, 5, 'R', 'E', 'A', 'D', 'Y', 11)
	b = append(b, "Socket-Type"...)
	b = append(b, 0, 0, 0, 3, 'P', 'U', 'B')
	_, _ = c.Write(b)
	return c
}

// rogueStored writes, on c, one message of topic with sequence number seq
// announcing the blocks of tokens as stored (array encoding); write errors
// (a connection the gateway closed) are returned.
func rogueStored(t *testing.T, c net.Conn, topic string, seq uint64, tokens []uint32) error {
	t.Helper()
	n := len(tokens) / kvBlockSize
	hashes := make([]any, n)
	for i := range hashes {
		hashes[i] = seq<<20 + uint64(i)
	}
	payload, err := msgpack.Marshal([]any{1.0, []any{[]any{"BlockStored", hashes, nil, tokens[:n*kvBlockSize], kvBlockSize, nil, "GPU", nil}}, 0})
	require.NoError(t, err)
	var msg []byte
	for i, f := range [][]byte{[]byte(topic), binary.BigEndian.AppendUint64(nil, seq), payload} {
		flags := byte(0)
		if i < 2 {
			flags = 1
		}
		msg = append(msg, flags|2)
		msg = binary.BigEndian.AppendUint64(msg, uint64(len(f)))
		msg = append(msg, f...)
	}
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Write(msg)
	return err
}

// TestKVGatewayRoguePublisher: the attacks of issue 21 against three
// engines publishing to the gateway's bound endpoint. Before each of 60
// requests with fresh prompts, a rogue on 127.0.0.99 connects and
// publishes the request's blocks as stored by engine s0 (with a sequence
// number that skips ahead, which used to clear s0 and apply the batch),
// and a process on the engines' own host publishes them under a topic
// variant naming another model (which used to be a new engine with its
// own state). None of it reaches the index: every prediction equals the
// engine's cached_tokens, and the requests are not drawn to s0.
func TestKVGatewayRoguePublisher(t *testing.T) {
	requireBinaries(t)
	zmqPort := freePort(t)
	sims := []*kvSim{startKVSim(t, zmqPort, 4096, false), startKVSim(t, zmqPort, 4096, false), startKVSim(t, zmqPort, 4096, false)}
	cfg := filepath.Join(t.TempDir(), "routing.json")
	bind := "127.0.0.1:" + strconv.Itoa(zmqPort)
	exaSet(t, cfg, append([]string{"--mode", "cache_aware", "--index", "exact", "--block-size", strconv.Itoa(kvBlockSize),
		"--kv-events-bind", "tcp://" + bind}, kvReplicaArgs(sims)...)...)
	g := startGateway(t, cfg)
	kvGatewayWarmUp(t, sims, g)

	rng := rand.New(rand.NewPCG(21, 99))
	reqs := make([]kvRequest, 60)
	for i := range reqs {
		reqs[i] = kvRequest{prompt: fmt.Sprintf("Rogue %d. ", i) + kvWords(rng, 150)}
	}
	tok := tokenizerFor(sims[1])
	s0 := "kv@" + sims[0].pod() + "@" + simModel
	variant := "kv@" + sims[0].pod() + "@" + simModel + "-variant"
	local := rawPublisher(t, "127.0.0.1", bind) // the engines' host: allowed to connect
	var answers []kvAnswer
	for i, r := range reqs {
		tokens, err := tok.Tokenize(context.Background(), r.tokenizeRequest())
		require.NoError(t, err)
		rogue := rawPublisher(t, "127.0.0.99", bind)
		_ = rogueStored(t, rogue, s0, 1_000_000+uint64(i), tokens)
		require.NoError(t, rogueStored(t, local, variant, uint64(i+1), tokens))
		waitFor(t, 10*time.Second, "the rogue refused and the variant heard", func() bool {
			return g.metric(t, "exa_gateway_kv_endpoint_closed_total", map[string]string{"reason": "source"}) == float64(i+1) &&
				g.metric(t, "exa_gateway_kv_unresolved_total", nil) == float64(i+1)
		})
		answers = append(answers, kvRunVia(t, []*gatewayProc{g}, []kvRequest{r}, true)...)
	}
	by := map[string]int{}
	for i, a := range answers {
		by[a.replica]++
		require.True(t, a.exact, "request %d keyed on the exact index", i)
		require.Equal(t, a.cached/kvBlockSize, a.matched, "request %d on %s: the prediction is the engine's own cache", i, a.replica)
	}
	t.Logf("60 requests with a rogue on 127.0.0.99 and a topic variant from 127.0.0.1: by replica %v; rogue connections refused %v, variant messages unresolved %v",
		by, g.metric(t, "exa_gateway_kv_endpoint_closed_total", map[string]string{"reason": "source"}), g.metric(t, "exa_gateway_kv_unresolved_total", nil))
	require.Less(t, by["s0"], len(reqs)/2, "the rogue does not draw requests to s0")
	for _, e := range g.stats(t).Models[simModel].KVEvents.Engines {
		require.Zero(t, e.Gaps+e.Restarts+e.Clears+e.Skipped+e.Rejected, "%+v", e)
	}
}

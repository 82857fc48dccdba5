package httpgw

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
)

// pdExactFixture is a pdFixture on the exact index (blocks of 4 words,
// in-process word tokenizer) whose engines' events come to a bound
// endpoint, each engine heard under its address's host:port.
type pdExactFixture struct {
	*pdFixture
	bind string
	seq  map[string]uint64
}

func newPDExactFixture(t *testing.T, nPrefill, nDecode, minUncached int, edit func(*config.Model)) *pdExactFixture {
	t.Helper()
	bind := freeTCP(t)
	f := newPDFixtureOpts(t, nPrefill, nDecode, func(m *config.Model) {
		m.Index, m.BlockSize, m.KVEventsBind = config.IndexExact, 4, bind
		m.PDMinUncachedTokens = &minUncached
		if edit != nil {
			edit(m)
		}
	}, Options{Fleet: fleet.Options{Tokenizer: &wordTokenizer{}}})
	return &pdExactFixture{pdFixture: f, bind: bind, seq: map[string]uint64{}}
}

// store announces, as engine e, the whole blocks of text's tokens under
// hashes from base, as one message.
func (f *pdExactFixture) store(e *pdEngine, base uint64, text string) {
	pod := hostPort(f.t, e.srv.URL)
	tokens := wordTokens(text)
	hashes := make([]uint64, len(tokens)/4)
	for i := range hashes {
		hashes[i] = base + uint64(i)
	}
	f.seq[pod]++
	f.srv.HandleKVFrames(f.bind, eventFrames(f.t, "kv@"+pod+"@"+testModel, f.seq[pod], storedEvent(hashes, nil, tokens[:4*len(hashes)], 4)))
}

// cachedBlocks returns the blocks each replica (pool/name) holds in the
// index of its pool, from /stats.
func (f *pdExactFixture) cachedBlocks() map[string]int {
	out := map[string]int{}
	rec := f.stats().Models[testModel]
	for _, r := range rec.Replicas {
		out[r.Name] = r.CachedBlocks
	}
	if p := rec.Disaggregation.Prefill; p != nil {
		for _, r := range p.Replicas {
			out[r.Name] = r.CachedBlocks
		}
	}
	return out
}

// A disaggregated model on the exact index: the prefill replica is the
// one whose engine's events say it holds the prompt, with that match in
// X-Exa-Prefill-Decision; the decider reads the decode engines' events,
// in blocks of engine tokens; routing changes neither index.
func TestPDExactIndex(t *testing.T) {
	f := newPDExactFixture(t, 2, 1, 8, nil)
	p1, d0 := f.prefill[1], f.decode[0]
	sys, user := words("sys", 8), words("ask", 8) // 16 tokens: 4 blocks
	f.store(p1, 100, " "+sys+" "+words("ask", 4)) // p1 holds 3 of them

	send := func() *http.Response {
		t.Helper()
		resp := f.post("/v1/chat/completions", chatBody(testModel, false, sys, user))
		b := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		return resp
	}
	resp := send()
	assert.Equal(t, "split; uncached=16", resp.Header.Get(HeaderDisagg), "4 blocks of 4 tokens, none on the decode engine")
	assert.Equal(t, "prefill/p1", resp.Header.Get(HeaderPrefillReplica))
	assert.Equal(t, "affinity; matched=3/4; index=exact", resp.Header.Get(HeaderPrefillDecision))
	assert.Equal(t, "decode/d0", resp.Header.Get(HeaderReplica))
	assert.Regexp(t, `; matched=0/4; index=exact$`, resp.Header.Get(HeaderDecision))
	assert.Len(t, p1.requests(), 1)
	assert.Empty(t, f.prefill[0].requests())
	assert.Equal(t, map[string]int{"prefill/p0": 0, "prefill/p1": 3, "decode/d0": 0}, f.cachedBlocks(),
		"only events change the exact index: routing the split added nothing")

	// The decode engine now holds the transferred blocks (vLLM's NIXL
	// decode side and the sim both store them): the decider keeps the
	// request co-located.
	f.store(d0, 500, " "+sys+" "+user)
	resp = send()
	assert.Equal(t, "colocated; uncached=0", resp.Header.Get(HeaderDisagg))
	assert.Empty(t, resp.Header.Get(HeaderPrefillDecision))
	assert.Regexp(t, `; matched=4/4; index=exact$`, resp.Header.Get(HeaderDecision))
	assert.Len(t, p1.requests(), 1)

	// Two blocks not on the decode engine: 8 tokens, the threshold.
	resp = f.post("/v1/chat/completions", chatBody(testModel, false, sys, words("new", 8)))
	readAll(t, resp)
	assert.Equal(t, "split; uncached=8", resp.Header.Get(HeaderDisagg))
	assert.Equal(t, "affinity; matched=2/4; index=exact", resp.Header.Get(HeaderPrefillDecision), "p1 holds the system prompt's 2 blocks")

	// A request keyed without tokens is all uncached, at 4 bytes a token.
	salted := strings.Replace(chatBody(testModel, false, sys, user), `{`, `{"cache_salt":"tenant-7",`, 1)
	resp = f.post("/v1/chat/completions", salted)
	readAll(t, resp)
	assert.Regexp(t, `^split; uncached=\d+$`, resp.Header.Get(HeaderDisagg))
	assert.Regexp(t, `; matched=0/\d+; index=exact; fallback=unsupported$`, resp.Header.Get(HeaderPrefillDecision))

	rec := f.stats().Models[testModel]
	require.NotNil(t, rec.KVEvents)
	assert.Equal(t, config.IndexExact, rec.Index)
	assert.Equal(t, config.IndexExact, rec.Disaggregation.Prefill.Index)
	var heard []string
	for _, e := range rec.KVEvents.Engines {
		heard = append(heard, e.Replicas...)
	}
	assert.ElementsMatch(t, []string{"m1/prefill/p1", "m1/decode/d0"}, heard)
	assert.Equal(t, uint64(3), rec.KVEvents.Tokenize.Requests, "the salted request was not tokenized")
	var cached float64
	for _, s := range f.series("exa_gateway_index_cached_blocks", map[string]string{"model": testModel, "replica": "prefill/p1"}) {
		cached = s.GetGauge().GetValue()
	}
	assert.Equal(t, 3.0, cached)
}

// An engine serving both roles, a member of both pools, updates both
// pools' indexes; a reload that keeps the routing keeps them.
func TestPDExactIndexEngineInBothPools(t *testing.T) {
	f := newPDExactFixture(t, 1, 1, 0, nil)
	p0 := f.prefill[0]
	m := f.srv.Snapshot().File.Models[testModel]
	m.Pools["decode"] = append(m.Pools["decode"], config.Replica{Name: "p0", Address: p0.srv.URL})
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: m}}))
	f.store(p0, 1, words("doc", 8))
	assert.Equal(t, map[string]int{"prefill/p0": 2, "decode/d0": 0, "decode/p0": 2}, f.cachedBlocks())

	m.PDMinUncachedTokens = nil // the decider's setting is not a routing option
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: m}}))
	assert.Equal(t, map[string]int{"prefill/p0": 2, "decode/d0": 0, "decode/p0": 2}, f.cachedBlocks())

	// Switched to the approximate index, the model gets fresh tables.
	m.Index = ""
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: m}}))
	assert.Equal(t, map[string]int{"prefill/p0": 0, "decode/d0": 0, "decode/p0": 0}, f.cachedBlocks())
	resp := f.post("/v1/chat/completions", chatBody(testModel, false, "sys", strings.Repeat("w ", 40)))
	readAll(t, resp)
	assert.NotContains(t, resp.Header.Get(HeaderDecision), "index=exact")
}

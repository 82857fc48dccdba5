package reference

import (
	"fmt"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/keys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func key(n int) gateway.Key {
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = uint64(i)
	}
	return keys.AppendHashes(nil, ids)
}

func keyFrom(base uint64, n int) gateway.Key {
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = base<<20 | uint64(i)
	}
	return keys.AppendHashes(nil, ids)
}

func req(n int, cands []gateway.Candidate) *gateway.Request {
	return reqFor(key(n), cands)
}

func reqFor(k gateway.Key, cands []gateway.Candidate) *gateway.Request {
	r := &gateway.Request{Key: k}
	for _, c := range cands {
		r.MaxMatched = max(r.MaxMatched, c.Matched)
	}
	return r
}

func cands(n int) []gateway.Candidate {
	c := make([]gateway.Candidate, n)
	for i := range c {
		c[i].Name = fmt.Sprintf("r%d", i)
		c[i].CacheBlocks = 1000
	}
	return c
}

var t0 = time.Unix(1000, 0)

// route announces a request of n blocks of 16 tokens to a Tracker, then
// picks for it.
func route(p gateway.Policy, id uint64, at time.Duration, k gateway.Key, cs []gateway.Candidate) int {
	tr, ok := p.(Tracker)
	if ok {
		tr.Arrive(Arrival{ID: id, Time: t0.Add(at), Tokens: 16 * len(k), BlockTokens: 16, UserContent: k[0]})
	}
	i := p.Pick(reqFor(k, cs), cs)
	if ok {
		tr.Routed(id, cs[i].Name) // as the gateway reports it, under the request's id
	}
	return i
}

func TestSGLangRules(t *testing.T) {
	// Replica 1 has seen prompt A; replica 0 has seen nothing.
	warm := func(p *SGLang) []gateway.Candidate {
		cs := cands(2)
		cs[0].InFlight = 1 // the miss goes to r1, the least loaded
		require.Equal(t, 1, route(p, 1, 0, keyFrom(1, 10), cs))
		return cands(2)
	}
	t.Run("a match over the threshold follows the tree", func(t *testing.T) {
		p := NewSGLang(1)
		cs := warm(p)
		cs[1].InFlight = 5
		assert.Equal(t, 1, route(p, 2, time.Second, keyFrom(1, 10), cs))
		assert.Equal(t, 10, p.Predicted())
	})
	t.Run("a match at the threshold is a miss", func(t *testing.T) {
		p := NewSGLang(1)
		cs := warm(p)
		cs[1].InFlight = 1
		k := append(append(gateway.Key{}, keyFrom(1, 10)[:5]...), keyFrom(2, 5)...) // 5 of 10 blocks
		assert.Equal(t, 0, route(p, 2, time.Second, k, cs), "0.5 is not above 0.5")
		k = append(append(gateway.Key{}, keyFrom(1, 10)[:6]...), keyFrom(3, 4)...) // 6 of 10
		assert.Equal(t, 1, route(p, 3, time.Second, k, cs), "0.6 is")
	})
	t.Run("imbalance goes to the first least loaded", func(t *testing.T) {
		p := NewSGLang(1)
		cs := cands(4)
		cs[0].InFlight, cs[1].InFlight, cs[2].InFlight, cs[3].InFlight = 40, 2, 2, 3
		first := route(p, 1, 0, keyFrom(0, 4), cs)
		assert.Contains(t, []int{1, 2}, first)
		for i := range 5 {
			assert.Equal(t, first, route(p, uint64(i+2), 0, keyFrom(uint64(i), 4), cs), "always the same of the two")
		}
	})
	t.Run("small absolute gap is balanced", func(t *testing.T) {
		p := NewSGLang(1)
		cs := warm(p)
		cs[1].InFlight = 30
		assert.Equal(t, 1, route(p, 2, time.Second, keyFrom(1, 10), cs))
	})
	t.Run("misses spread over equally loaded replicas", func(t *testing.T) {
		p := NewSGLang(3)
		seen := map[int]int{}
		cs := cands(8)
		for i := range 400 {
			seen[route(p, uint64(i+1), 0, keyFrom(uint64(100+i), 4), cs)]++
		}
		assert.Len(t, seen, 8)
		for r, n := range seen {
			assert.Greater(t, n, 20, "replica %d", r)
		}
	})
	t.Run("first-min miss path piles on the first registered replica", func(t *testing.T) {
		p := NewSGLang(3)
		p.Miss = MissMinLoadFirst
		cs := cands(8)
		first := route(p, 1, 0, keyFrom(100, 4), cs)
		for i := range 50 {
			assert.Equal(t, first, route(p, uint64(i+2), 0, keyFrom(uint64(101+i), 4), cs))
		}
	})
	t.Run("tree-size miss path picks the smallest tree", func(t *testing.T) {
		p := NewSGLang(3)
		p.Miss = MissSmallestTree
		cs := cands(3)
		first := route(p, 1, 0, keyFrom(1, 10), cs)
		second := route(p, 2, 0, keyFrom(2, 4), cs)
		third := route(p, 3, 0, keyFrom(3, 2), cs)
		assert.ElementsMatch(t, []int{0, 1, 2}, []int{first, second, third}, "each miss to an empty tree")
		assert.Equal(t, third, route(p, 4, 0, keyFrom(4, 2), cs), "the 2-block tree is now the smallest")
	})
}

func TestSGLangEviction(t *testing.T) {
	p := NewSGLang(1) // 10,000 characters = 2,500 tokens every 30 s
	cs := cands(1)
	for i := range 20 {
		route(p, uint64(i+1), time.Duration(i)*time.Second, keyFrom(uint64(i), 16), cs) // 256 tokens each
	}
	s := p.tree.tenant("r0")
	assert.Equal(t, int64(20*256), p.tree.size[s], "no eviction before 30 s")
	route(p, 99, 31*time.Second, keyFrom(50, 1), cs)
	assert.LessOrEqual(t, p.tree.size[s], int64(2500+16))
	// The oldest prompts went first: the newest is still matched whole.
	m, _ := p.tree.match(keyFrom(19, 16))
	assert.Equal(t, 16, m)
	m, _ = p.tree.match(keyFrom(0, 16))
	assert.Zero(t, m)
	// The CLI's budget keeps them all.
	q := NewSGLangCLI(1)
	for i := range 20 {
		route(q, uint64(i+1), time.Duration(i)*10*time.Second, keyFrom(uint64(i), 16), cs)
	}
	assert.Equal(t, int64(20*256), q.tree.size[q.tree.tenant("r0")])
}

// TestSGLangTreeInvariant: whatever the insertions and evictions, every
// tenant on a node is on its parent, sizes add up, and no node is empty.
func TestSGLangTreeInvariant(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := &SGLang{EvictionInterval: time.Second, MaxTreeChars: rapid.IntRange(64, 4000).Draw(t, "max"), Seed: 1}
		cs := cands(rapid.IntRange(1, 4).Draw(t, "n"))
		for i := range rapid.IntRange(1, 60).Draw(t, "reqs") {
			k := keyFrom(uint64(rapid.IntRange(0, 5).Draw(t, "prefix")), rapid.IntRange(1, 12).Draw(t, "len"))
			route(p, uint64(i+1), time.Duration(i)*300*time.Millisecond, k, cs)
		}
		tr := p.tree
		size := make([]int64, len(tr.size))
		for _, n := range tr.nodes {
			if len(n.holders) == 0 && n.children == 0 {
				t.Fatalf("empty node %x left in the tree", n.key)
			}
			for _, h := range n.holders {
				size[h.tenant] += int64(n.tokens)
				if n.parent.holder(h.tenant) == nil {
					t.Fatalf("tenant %d on %x but not on its parent", h.tenant, n.key)
				}
			}
		}
		for i := range size {
			if size[i] != tr.size[i] {
				t.Fatalf("tenant %d: counted %d tokens, recorded %d", i, size[i], tr.size[i])
			}
		}
	})
}

func TestDynamo(t *testing.T) {
	t.Run("overlap wins", func(t *testing.T) {
		cs := cands(2)
		cs[1].Matched = 8
		assert.Equal(t, 1, route(NewDynamo(1), 1, 0, key(10), cs))
	})
	t.Run("active prefill outweighs overlap", func(t *testing.T) {
		p := NewDynamo(1)
		cs := cands(2)
		cs[1].Matched = 8
		// A 10-block prompt, all uncached, sent to r1 and still prefilling.
		cs0 := cands(2)
		cs0[0].Matched = 10
		require.Equal(t, 0, route(p, 1, 0, keyFrom(9, 10), cs0))
		cs0 = cands(2)
		cs0[1].Matched = 10
		require.Equal(t, 1, route(p, 2, 0, keyFrom(8, 30), cs0[:2]))
		// r1 now has 20 uncached blocks prefilling and 30 active blocks.
		assert.Equal(t, 0, route(p, 3, 0, key(10), cs))
		p.FirstToken(2)
		p.Done(2, gateway.DoneInfo{})
		assert.Equal(t, 1, route(p, 4, 0, key(10), cs), "freed: the overlap wins again")
	})
	t.Run("shared active blocks count once", func(t *testing.T) {
		p := NewDynamo(1)
		cs := cands(2)
		cs[0].Matched = 10
		require.Equal(t, 0, route(p, 1, 0, key(10), cs))
		w := p.worker("r0")
		assert.Len(t, w.unique, 10)
		require.Equal(t, 0, route(p, 2, 0, key(10), cs))
		assert.Len(t, w.unique, 10)
		p.Done(1, gateway.DoneInfo{})
		assert.Len(t, w.unique, 10)
		p.Done(2, gateway.DoneInfo{})
		assert.Empty(t, w.unique)
		assert.Zero(t, w.activeTokens)
	})
	t.Run("ties go to the smaller tree", func(t *testing.T) {
		p := NewDynamo(1)
		p.KVEvent("r0", gateway.CacheEvent{Blocks: keyFrom(5, 20)})
		p.KVEvent("r2", gateway.CacheEvent{Blocks: keyFrom(6, 3)})
		p.KVEvent("r1", gateway.CacheEvent{Blocks: keyFrom(7, 3)})
		p.KVEvent("r1", gateway.CacheEvent{Kind: gateway.BlocksRemoved, Blocks: keyFrom(7, 1)})
		for i := range 5 {
			assert.Equal(t, 1, route(p, uint64(i+1), 0, keyFrom(uint64(i), 2), cands(3)))
			p.Done(uint64(i+1), gateway.DoneInfo{})
		}
	})
	t.Run("equal trees tie at random", func(t *testing.T) {
		seen := map[int]bool{}
		p := NewDynamo(4)
		for i := range 64 {
			seen[route(p, uint64(i+1), 0, keyFrom(uint64(i), 2), cands(4))] = true
			p.Done(uint64(i+1), gateway.DoneInfo{})
		}
		assert.Len(t, seen, 4)
	})
	t.Run("overlap weight trades prefill for decode blocks", func(t *testing.T) {
		// r0 holds 3 of the 10 blocks but decodes a 12-block request;
		// r1 is idle. Weight 1: r0 costs 7+7+12 = 26 against r1's 10+10.
		// Weight 20: r0 costs 20·7+19 = 159 against r1's 210.
		for _, tt := range []struct {
			w    float64
			want int
		}{{1, 1}, {20, 0}} {
			p := NewDynamo(1)
			p.OverlapWeight = tt.w
			busy := cands(1)
			require.Equal(t, 0, route(p, 1, 0, keyFrom(3, 12), busy))
			p.FirstToken(1)
			cs := cands(2)
			cs[0].Matched = 3
			assert.Equal(t, tt.want, route(p, 2, 0, key(10), cs), "weight %v", tt.w)
		}
	})
}

func TestGIE(t *testing.T) {
	t.Run("score formula", func(t *testing.T) {
		// r0: empty queue, half-full KV; r1: longest queue, empty KV;
		// r2: middle queue, holds the prompt.
		p := NewGIE(1)
		cs := cands(3)
		cs[0].Load = gateway.Load{QueueDepth: 0, KVUtilization: 0.5}
		cs[1].Load = gateway.Load{QueueDepth: 4}
		cs[2].Load = gateway.Load{QueueDepth: 2, KVUtilization: 0.2}
		// Warm r2 with the prompt: with equal loads, random, so force it.
		warm := cands(3)
		warm[0].Load.QueueDepth, warm[1].Load.QueueDepth = 9, 9
		require.Equal(t, 2, route(p, 1, 0, key(8), warm))
		// Scores: r0 2·1+2·0.5+0 = 3; r1 0+2·1+0 = 2; r2 2·0.5+2·0.8+3·1 = 5.6.
		assert.Equal(t, 2, route(p, 2, 0, key(8), cs))
		assert.Equal(t, 8, p.Predicted())
		// Without the prefix r2 scores 2.6: r0 wins.
		assert.Equal(t, 0, route(p, 3, 0, keyFrom(7, 8), cs))
	})
	t.Run("only the first 4096 tokens count", func(t *testing.T) {
		p := NewGIE(1)
		warm := cands(2)
		warm[0].Load.QueueDepth = 9
		k := keyFrom(3, 400) // 6,400 tokens
		require.Equal(t, 1, route(p, 1, 0, k, warm))
		// A prompt agreeing on the first 256 blocks scores a full match.
		k2 := append(append(gateway.Key{}, k[:256]...), keyFrom(4, 10)...)
		route(p, 2, 0, k2, cands(2))
		assert.Equal(t, 256, p.Predicted(), "a full match of the hashed window")
	})
	t.Run("the index forgets beyond its capacity", func(t *testing.T) {
		p := &GIE{Seed: 1, LRUTokens: 10 * 16}
		cs := cands(1)
		route(p, 1, 0, keyFrom(1, 8), cs)
		route(p, 2, 0, keyFrom(2, 8), cs) // evicts 6 blocks of the first prompt
		route(p, 3, 0, keyFrom(1, 8), cs)
		assert.Equal(t, 0, p.Predicted(), "its leading blocks were evicted")
	})
	t.Run("ties at random", func(t *testing.T) {
		p := NewGIE(9)
		seen := map[int]bool{}
		for i := range 64 {
			seen[route(p, uint64(i+1), 0, keyFrom(uint64(i), 4), cands(4))] = true
		}
		assert.Len(t, seen, 4)
	})
}

func TestLLMDPrecise(t *testing.T) {
	cs := cands(3)
	cs[0].Load.KVUtilization = 0.9
	cs[2].Matched = 5
	p := NewLLMDPrecise(1)
	assert.Equal(t, 2, p.Pick(req(10, cs), cs), "half the prompt cached: 1.5 of prefix score")
	cs[2].Load.QueueDepth, cs[1].Load.QueueDepth = 10, 0
	assert.Equal(t, 1, p.Pick(req(10, cs), cs), "its queue now costs 2, more than the prefix gives")
}

func TestCHWBL(t *testing.T) {
	p := &CHWBL{}
	cs := cands(4)
	r := req(3, cs)
	first := p.Pick(r, cs)
	for range 10 {
		require.Equal(t, first, p.Pick(r, cs), "same prefix, same replica")
	}
	// Over 1.25 × the mean with the request: it moves on, clockwise,
	// deterministically.
	cs[first].InFlight = 10
	next := p.Pick(r, cs)
	assert.NotEqual(t, first, next)
	assert.Equal(t, next, p.Pick(r, cs))
	// Different prefixes spread over replicas.
	seen := map[int]bool{}
	cs = cands(4)
	for i := range 64 {
		k := keys.AppendHashes(nil, []uint64{uint64(1000 + i)})
		seen[p.Pick(&gateway.Request{Key: k}, cs)] = true
	}
	assert.Len(t, seen, 4)
}

// TestCHWBLKeysOnUserMessage: with the request announced, the key is the
// first user message, not the prompt's first block: two prompts with the
// same system prompt and different user messages land apart as often as
// different prefixes do, and the same user message after different system
// prompts lands together.
func TestCHWBLKeysOnUserMessage(t *testing.T) {
	p := &CHWBL{}
	cs := cands(8)
	sys := keyFrom(1, 4)
	spots := map[int]bool{}
	for u := range 32 {
		p.Arrive(Arrival{ID: uint64(u), UserContent: uint64(5000 + u)})
		spots[p.Pick(reqFor(sys, cs), cs)] = true
	}
	assert.Greater(t, len(spots), 4, "one system prompt, many user messages: spread")
	for s := range 8 {
		p.Arrive(Arrival{ID: uint64(100 + s), UserContent: 42})
		got := p.Pick(reqFor(keyFrom(uint64(s), 4), cs), cs)
		p.Arrive(Arrival{ID: 1, UserContent: 42})
		assert.Equal(t, got, p.Pick(reqFor(keyFrom(99, 4), cs), cs))
	}
}

func TestCHWBLBoundProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 8).Draw(t, "n")
		cs := cands(n)
		for i := range cs {
			cs[i].InFlight = rapid.IntRange(0, 50).Draw(t, "load")
		}
		total := 0
		minLoad := cs[0].InFlight
		for _, c := range cs {
			total += c.InFlight
			minLoad = min(minLoad, c.InFlight)
		}
		k := keys.AppendHashes(nil, []uint64{rapid.Uint64().Draw(t, "id")})
		i := (&CHWBL{}).Pick(&gateway.Request{Key: k}, cs)
		// KubeAI's bound: load <= 1.25·(total+1)/n, which the least
		// loaded replica always meets.
		if total > 0 && float64(cs[i].InFlight) > 1.25*float64(total+1)/float64(n) {
			t.Fatalf("picked %d with load %d over the bound", i, cs[i].InFlight)
		}
	})
}

func TestP2C(t *testing.T) {
	cs := cands(5)
	for i := range cs {
		cs[i].InFlight = i * 10
	}
	a, b := NewP2C(1), NewP2C(1)
	counts := make([]int, len(cs))
	for range 1000 {
		i := a.Pick(req(2, cs), cs)
		require.Equal(t, i, b.Pick(req(2, cs), cs), "same seed, same picks")
		counts[i]++
	}
	// The most loaded replica is never the lesser of two distinct picks.
	assert.Zero(t, counts[4])
	assert.Greater(t, counts[0], counts[3])
	assert.Equal(t, 0, (&P2C{}).Pick(req(1, cs[:1]), cs[:1]))
}

func TestPrefixAffinity(t *testing.T) {
	p := &PrefixAffinity{}
	cs := cands(4)
	cs[2].Matched, cs[2].InFlight = 3, 1000
	assert.Equal(t, 2, p.Pick(req(5, cs), cs), "ignores load")
	cs = cands(4)
	r := req(5, cs)
	first := p.Pick(r, cs)
	for range 5 {
		assert.Equal(t, first, p.Pick(r, cs), "sticky without a match")
	}
}

// seededPolicies makes each randomised reference policy with a seed.
var seededPolicies = map[string]func(seed uint64) gateway.Policy{
	"sglang":       func(s uint64) gateway.Policy { return NewSGLang(s) },
	"sglang_tree":  func(s uint64) gateway.Policy { p := NewSGLang(s); p.Miss = MissSmallestTree; return p },
	"dynamo":       func(s uint64) gateway.Policy { return NewDynamo(s) },
	"gie":          func(s uint64) gateway.Policy { return NewGIE(s) },
	"llmd_precise": func(s uint64) gateway.Policy { return NewLLMDPrecise(s) },
	"p2c":          func(s uint64) gateway.Policy { return NewP2C(s) },
	"smg":          func(s uint64) gateway.Policy { return NewSMG(s, false) },
	"smg_events":   func(s uint64) gateway.Policy { return NewSMG(s, true) },
}

// TestSameSeedSamePicks: two instances with one seed make the same
// decisions on the same requests, ties included.
func TestSameSeedSamePicks(t *testing.T) {
	for name, mk := range seededPolicies {
		t.Run(name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				seed := rapid.Uint64().Draw(t, "seed")
				a, b := mk(seed), mk(seed)
				cs := cands(rapid.IntRange(1, 6).Draw(t, "n"))
				for i := range rapid.IntRange(1, 40).Draw(t, "reqs") {
					k := keyFrom(uint64(rapid.IntRange(0, 3).Draw(t, "prefix")), rapid.IntRange(1, 6).Draw(t, "len"))
					for j := range cs {
						cs[j].InFlight = rapid.IntRange(0, 3).Draw(t, "load")
					}
					if x, y := route(a, uint64(i+1), 0, k, cs), route(b, uint64(i+1), 0, k, cs); x != y {
						t.Fatalf("request %d: %d vs %d", i, x, y)
					}
				}
			})
		})
	}
}

func TestPoliciesThroughGateway(t *testing.T) {
	for _, p := range []gateway.Policy{NewSGLang(1), NewSGLangCLI(1), NewDynamo(1), NewGIE(1), NewLLMDPrecise(1), &CHWBL{}, NewP2C(3), &PrefixAffinity{}, NewSMG(1, false), NewSMG(1, true)} {
		t.Run(fmt.Sprintf("%T", p), func(t *testing.T) {
			g, err := gateway.New([]gateway.Replica{{Name: "a"}, {Name: "b"}, {Name: "c"}}, gateway.WithPolicy(p))
			require.NoError(t, err)
			for i := range 50 {
				d, err := g.Route(keys.AppendHashes(nil, []uint64{uint64(i % 7), uint64(i)}))
				require.NoError(t, err)
				assert.Contains(t, []string{"a", "b", "c"}, d.Replica)
				d.Done(gateway.DoneInfo{})
			}
		})
	}
}

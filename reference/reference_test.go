package reference

import (
	"fmt"
	"testing"

	"github.com/examlops/gateway"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func key(n int) gateway.Key {
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = uint64(i)
	}
	return gateway.KeyFromHashes(ids)
}

func req(n int, cands []gateway.Candidate) *gateway.Request {
	r := &gateway.Request{Key: key(n)}
	for _, c := range cands {
		r.MaxMatched = max(r.MaxMatched, c.Matched)
	}
	return r
}

func TestSGLang(t *testing.T) {
	tests := []struct {
		name  string
		cands []gateway.Candidate
		want  int
		kind  gateway.Kind
	}{
		{"match above threshold", []gateway.Candidate{{Name: "a", Matched: 2}, {Name: "b", Matched: 6}}, 1, gateway.KindAffinity},
		{"match at threshold goes to free cache", []gateway.Candidate{{Name: "a", Matched: 5, Load: gateway.Load{KVUtilization: 0.9}}, {Name: "b", Load: gateway.Load{KVUtilization: 0.1}}}, 1, gateway.KindLoadAware},
		{"imbalance beats match", []gateway.Candidate{{Name: "a", Matched: 10, InFlight: 40}, {Name: "b", InFlight: 5}}, 1, gateway.KindLoadAware},
		{"small absolute gap is not imbalance", []gateway.Candidate{{Name: "a", Matched: 10, InFlight: 30}, {Name: "b", InFlight: 0}}, 0, gateway.KindAffinity},
		{"small relative gap is not imbalance", []gateway.Candidate{{Name: "a", Matched: 10, InFlight: 400}, {Name: "b", InFlight: 365}}, 0, gateway.KindAffinity},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ch := (&SGLang{}).Pick(req(10, tt.cands), tt.cands)
			assert.Equal(t, tt.want, ch.Index)
			assert.Equal(t, tt.kind, ch.Kind)
		})
	}
}

func TestDynamo(t *testing.T) {
	tests := []struct {
		name  string
		p     Dynamo
		cands []gateway.Candidate
		want  int
	}{
		{"overlap wins", Dynamo{}, []gateway.Candidate{{Name: "a"}, {Name: "b", Matched: 8}}, 1},
		{"queued prefill outweighs overlap", Dynamo{}, []gateway.Candidate{{Name: "a"}, {Name: "b", Matched: 8, PendingPrefill: 9}}, 0},
		{"active blocks count", Dynamo{}, []gateway.Candidate{{Name: "a", CacheBlocks: 100, Load: gateway.Load{KVUtilization: 0.5}}, {Name: "b", Matched: 4, CacheBlocks: 100}}, 1},
		{"decode load outweighs a small overlap", Dynamo{}, []gateway.Candidate{{Name: "a", Matched: 3, CacheBlocks: 100, Load: gateway.Load{KVUtilization: 0.5}}, {Name: "b", CacheBlocks: 100}}, 1},
		{"heavier overlap weight", Dynamo{OverlapWeight: 20}, []gateway.Candidate{{Name: "a", Matched: 3, CacheBlocks: 100, Load: gateway.Load{KVUtilization: 0.5}}, {Name: "b", CacheBlocks: 100}}, 0},
		{"tie to fewer in flight", Dynamo{}, []gateway.Candidate{{Name: "a", InFlight: 3}, {Name: "b", InFlight: 1}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.p.Pick(req(10, tt.cands), tt.cands).Index)
		})
	}
}

func cands(n int) []gateway.Candidate {
	c := make([]gateway.Candidate, n)
	for i := range c {
		c[i].Name = fmt.Sprintf("r%d", i)
	}
	return c
}

func TestCHWBL(t *testing.T) {
	p := &CHWBL{}
	cs := cands(4)
	r := req(3, cs)
	first := p.Pick(r, cs).Index
	for range 10 {
		require.Equal(t, first, p.Pick(r, cs).Index, "same prefix, same replica")
	}
	// Loaded beyond 1.25 × mean: it moves on, clockwise, deterministically.
	cs[first].InFlight = 10
	next := p.Pick(r, cs)
	assert.NotEqual(t, first, next.Index)
	assert.Equal(t, gateway.FallbackLoadGuard, next.Fallback)
	assert.Equal(t, next, p.Pick(r, cs))
	// Different prefixes spread over replicas.
	seen := map[int]bool{}
	cs = cands(4)
	for i := range 64 {
		k := gateway.KeyFromHashes([]uint64{uint64(1000 + i)})
		seen[p.Pick(&gateway.Request{Key: k}, cs).Index] = true
	}
	assert.Len(t, seen, 4)
}

func TestCHWBLBoundProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 8).Draw(t, "n")
		cs := cands(n)
		for i := range cs {
			cs[i].InFlight = rapid.IntRange(0, 50).Draw(t, "load")
		}
		total := 0
		for _, c := range cs {
			total += c.InFlight
		}
		k := gateway.KeyFromHashes([]uint64{rapid.Uint64().Draw(t, "id")})
		i := (&CHWBL{}).Pick(&gateway.Request{Key: k}, cs).Index
		bound := 1.25 * float64(total+1) / float64(n)
		minLoad := cs[0].InFlight
		for _, c := range cs {
			minLoad = min(minLoad, c.InFlight)
		}
		// The chosen replica is within the bound (rounded up), which the
		// least loaded replica always is.
		if float64(cs[i].InFlight+1) > float64(int(bound)+1) && cs[i].InFlight != minLoad {
			t.Fatalf("picked %d with load %d over bound %.2f", i, cs[i].InFlight, bound)
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
		i := a.Pick(req(2, cs), cs).Index
		require.Equal(t, i, b.Pick(req(2, cs), cs).Index, "same seed, same picks")
		counts[i]++
	}
	// The most loaded replica is never the lesser of two distinct picks.
	assert.Zero(t, counts[4])
	assert.Greater(t, counts[0], counts[3])
	assert.Equal(t, 0, (&P2C{}).Pick(req(1, cs[:1]), cs[:1]).Index)
}

func TestPrefixAffinity(t *testing.T) {
	p := &PrefixAffinity{}
	cs := cands(4)
	cs[2].Matched, cs[2].InFlight = 3, 1000
	assert.Equal(t, 2, p.Pick(req(5, cs), cs).Index, "ignores load")
	cs = cands(4)
	r := req(5, cs)
	first := p.Pick(r, cs)
	assert.Equal(t, gateway.FallbackNoMatch, first.Fallback)
	for range 5 {
		assert.Equal(t, first.Index, p.Pick(r, cs).Index, "sticky without a match")
	}
}

func TestPoliciesThroughGateway(t *testing.T) {
	for _, p := range []gateway.Policy{&SGLang{}, &Dynamo{}, &CHWBL{}, NewP2C(3), &PrefixAffinity{}} {
		t.Run(fmt.Sprintf("%T", p), func(t *testing.T) {
			g, err := gateway.New([]gateway.Replica{{Name: "a"}, {Name: "b"}, {Name: "c"}}, gateway.WithPolicy(p))
			require.NoError(t, err)
			for i := range 50 {
				d, err := g.Route(gateway.KeyFromHashes([]uint64{uint64(i % 7), uint64(i)}))
				require.NoError(t, err)
				assert.Contains(t, []string{"a", "b", "c"}, d.Replica)
				d.Done(gateway.DoneInfo{})
			}
		})
	}
}

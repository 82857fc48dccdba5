package reference

import (
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSMGRules(t *testing.T) {
	t.Run("a miss goes to the fewest in flight, then the fewest sent", func(t *testing.T) {
		p := NewSMG(1, false)
		cs := cands(4)
		cs[0].InFlight, cs[1].InFlight, cs[2].InFlight, cs[3].InFlight = 3, 1, 1, 2
		first := route(p, 1, 0, keyFrom(1, 4), cs)
		require.Contains(t, []int{1, 2}, first)
		// The other of the two has been sent fewer requests now.
		second := route(p, 2, 0, keyFrom(2, 4), cs)
		assert.Equal(t, 3-first, second)
		// Equal in both: the router's order decides, then they alternate.
		third := route(p, 3, 0, keyFrom(3, 4), cs)
		require.Contains(t, []int{1, 2}, third)
		assert.Equal(t, 3-third, route(p, 4, 0, keyFrom(4, 4), cs))
	})
	t.Run("misses rotate over idle replicas", func(t *testing.T) {
		p := NewSMG(3, false)
		seen := map[int]int{}
		cs := cands(8)
		for i := range 80 {
			seen[route(p, uint64(i+1), 0, keyFrom(uint64(100+i), 4), cs)]++
		}
		for r := range 8 {
			assert.Equal(t, 10, seen[r], "replica %d", r)
		}
	})
	t.Run("a match over 0.3 follows the tree", func(t *testing.T) {
		p := NewSMG(1, false)
		cs := cands(2)
		cs[0].InFlight = 1
		require.Equal(t, 1, route(p, 1, 0, keyFrom(1, 10), cs))
		cs[0].InFlight, cs[1].InFlight = 0, 5
		k := append(append(gateway.Key{}, keyFrom(1, 10)[:4]...), keyFrom(2, 6)...) // 4 of 10
		assert.Equal(t, 1, route(p, 2, time.Second, k, cs))
		assert.Equal(t, 4, p.Predicted())
		k = append(append(gateway.Key{}, keyFrom(1, 10)[:3]...), keyFrom(3, 7)...) // 3 of 10
		assert.Equal(t, 0, route(p, 3, time.Second, k, cs), "0.3 is not above 0.3")
	})
	t.Run("imbalance goes to the least loaded", func(t *testing.T) {
		p := NewSMG(1, false)
		cs := cands(2)
		require.Equal(t, 0, route(p, 1, 0, keyFrom(1, 10), cs[:1]))
		cs[0].InFlight, cs[1].InFlight = 100, 10
		assert.Equal(t, 1, route(p, 2, 0, keyFrom(1, 10), cs), "100 > 10+64 and > 1.5×10")
		cs[0].InFlight = 70
		assert.Equal(t, 0, route(p, 3, 0, keyFrom(1, 10), cs), "70 is within 64 of 10: the tree")
	})
	t.Run("events: longest overlap, then fewer in flight, then the smaller tree", func(t *testing.T) {
		p := NewSMG(1, true)
		p.KVEvent("r0", gateway.CacheEvent{Blocks: keyFrom(9, 5)})
		p.KVEvent("r2", gateway.CacheEvent{Blocks: keyFrom(9, 2)})
		cs := cands(3)
		cs[0].Matched, cs[1].Matched, cs[2].Matched = 2, 3, 3
		cs[1].InFlight = 1
		assert.Equal(t, 2, route(p, 1, 0, keyFrom(1, 10), cs), "3 blocks and fewer in flight")
		cs[1].InFlight = 0
		assert.Equal(t, 1, route(p, 2, 0, keyFrom(1, 10), cs), "r1's indexed tree is smaller (0 vs 2)")
		cs[1].Matched, cs[2].Matched = 0, 0
		assert.Equal(t, 0, route(p, 3, 0, keyFrom(1, 10), cs), "only overlap counts, not load: r0 holds 2")
		cs[0].Matched = 0
		cs[0].InFlight, cs[2].InFlight = 1, 1
		assert.Equal(t, 1, route(p, 4, 0, keyFrom(1, 10), cs), "no overlap: the least loaded")
		p.KVEvent("r0", gateway.CacheEvent{Kind: gateway.AllCleared})
		p.KVEvent("r2", gateway.CacheEvent{Kind: gateway.BlocksRemoved, Blocks: keyFrom(9, 2)})
		assert.Zero(t, p.blocks)
	})
}

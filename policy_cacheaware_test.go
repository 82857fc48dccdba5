package gateway

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func caReq(n int, cands []Candidate) *Request {
	m := 0
	for _, c := range cands {
		m = max(m, c.Matched)
	}
	return &Request{Key: make(Key, n), MaxMatched: m}
}

// TestCacheAwareCost checks the cost terms one at a time on hand-made
// candidates.
func TestCacheAwareCost(t *testing.T) {
	tests := []struct {
		name  string
		cands []Candidate
		want  int
	}{
		{"longest match when idle", []Candidate{{Name: "a", Matched: 2}, {Name: "b", Matched: 8}}, 1},
		{"queued prefill outweighs a match", []Candidate{{Name: "a", Matched: 2}, {Name: "b", Matched: 8, PendingPrefill: 40}}, 0},
		{"decode load counts", []Candidate{{Name: "a", InFlight: 5}, {Name: "b", InFlight: 1}}, 1},
		{"engine queue counts", []Candidate{{Name: "a", Load: Load{QueueDepth: 3}}, {Name: "b"}}, 1},
		{"ties go to less assigned work", []Candidate{{Name: "a", AssignedPrefill: 30}, {Name: "b", AssignedPrefill: 10}, {Name: "c", AssignedPrefill: 20}}, 1},
		{"then to fewer in flight", []Candidate{{Name: "a", InFlight: 1, Load: Load{Running: 2}}, {Name: "b", InFlight: 0, Load: Load{Running: 2}}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, (&CacheAware{}).Pick(caReq(10, tt.cands), tt.cands).Index)
		})
	}
	t.Run("a busy cluster values hits more", func(t *testing.T) {
		// a holds 4 of 10 blocks with 8 blocks queued; b is idle; c is busy.
		cs := []Candidate{{Name: "a", Matched: 4, PendingPrefill: 8}, {Name: "b"}, {Name: "c", PendingPrefill: 40}}
		// λ = 1 + 48/3/10 = 2.6: a = 8 + 3.6·6 = 29.6, b = 3.6·10 = 36, c = 76.
		assert.Equal(t, 0, (&CacheAware{}).Pick(caReq(10, cs), cs).Index)
		cs[2].PendingPrefill = 0
		cs[0].PendingPrefill = 12
		// λ = 1 + 12/3/10 = 1.4: a = 12 + 2.4·6 = 26.4 > b = 24.
		ch := (&CacheAware{}).Pick(caReq(10, cs), cs)
		assert.Equal(t, 1, ch.Index)
		assert.Equal(t, KindLoadAware, ch.Kind)
		assert.Equal(t, FallbackLoadGuard, ch.Fallback)
	})
	t.Run("negative weights switch terms off", func(t *testing.T) {
		cs := []Candidate{{Name: "a", Matched: 5, InFlight: 50, Load: Load{Running: 50}}, {Name: "b"}}
		assert.Equal(t, 1, (&CacheAware{}).Pick(caReq(10, cs), cs).Index, "a's batch outweighs its match")
		assert.Equal(t, 0, (&CacheAware{DecodeWeight: -1}).Pick(caReq(10, cs), cs).Index, "with no decode term a's match wins")
	})
}

// TestCacheAwareSpreadsMisses: with every replica idle and nothing cached,
// sequential requests for new prompts spread evenly (ties go to the replica
// sent the least prefill), instead of piling onto the first candidate.
func TestCacheAwareSpreadsMisses(t *testing.T) {
	g, err := New(replicaNames(4), WithMode(ModeCacheAware))
	require.NoError(t, err)
	counts := map[string]int{}
	for i := range 8 {
		d, err := g.Route(KeyFromHashes([]uint64{uint64(100 * i), 1, 2, 3, 4, 5, 6, 7, 8, 9}))
		require.NoError(t, err)
		counts[d.Replica]++
		d.Done(DoneInfo{})
	}
	assert.Equal(t, map[string]int{"r0": 2, "r1": 2, "r2": 2, "r3": 2}, counts)
}

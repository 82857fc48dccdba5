package gateway

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestTiesFollowTie: among candidates tied in every respect, CacheAware and
// LoadAware choose by Request.Tie, not by their order: the same Tie gives
// the same choice, and over 500·n routes each of n equal candidates is
// chosen about as often as the others (each within 25% of 500 times, more
// than five standard deviations: a choice by order, the old rule, puts
// them all on the first).
func TestTiesFollowTie(t *testing.T) {
	for _, n := range []int{2, 8, 32, 64} {
		cands := make([]Candidate, n)
		for i := range cands {
			cands[i] = Candidate{Name: fmt.Sprintf("r%d", i), Matched: 1, CacheBlocks: 100, AssignedPrefill: 10, LastPicked: 1}
		}
		for _, p := range []Policy{&CacheAware{}, &LoadAware{}} {
			counts := make([]int, n)
			routes := 500 * n
			for tie := range uint64(routes) {
				req := Request{Key: Key{1, 2, 3}, MaxMatched: 1, Tie: tie}
				i := p.Pick(&req, cands)
				assert.Equal(t, i, p.Pick(&req, cands), "same Tie, same choice")
				counts[i]++
			}
			for i, c := range counts {
				assert.InDelta(t, 500, c, 125, "%T, %d candidates: candidate %d chosen %d times", p, n, i, c)
			}
		}
	}
}

// TestPropTieOnlyAmongEquals: the tie draw never chooses a candidate that
// is worse than another by the cost or by a tie-break rule: with one
// candidate made strictly cheaper (an idle replica holding more of the
// key), it is chosen whatever the Tie.
func TestPropTieOnlyAmongEquals(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(2, 64).Draw(t, "n")
		best := rapid.IntRange(0, n-1).Draw(t, "best")
		cands := make([]Candidate, n)
		for i := range cands {
			cands[i] = Candidate{Name: fmt.Sprintf("r%d", i), Matched: 1, CacheBlocks: 1000, AssignedPrefill: 10, LastPicked: 1}
		}
		cands[best].Matched = 2
		req := Request{Key: Key{1, 2, 3, 4}, MaxMatched: 2, Tie: rapid.Uint64().Draw(t, "tie")}
		if got := (&CacheAware{}).Pick(&req, cands); got != best {
			t.Fatalf("chose %d, want %d", got, best)
		}
	})
}

// lastPickedPolicy picks the candidate named want and records every
// candidate's LastPicked.
type lastPickedPolicy struct {
	want string
	seen map[string]uint64
}

func (p *lastPickedPolicy) Pick(_ *Request, cands []Candidate) int {
	best := 0
	for i, c := range cands {
		p.seen[c.Name] = c.LastPicked
		if c.Name == p.want {
			best = i
		}
	}
	return best
}

// TestLastPickedOfAddedReplica: a replica added in the slot a removed one
// freed has never been chosen (LastPicked 0), so the tie order does not
// take it for the removed replica, chosen recently.
func TestLastPickedOfAddedReplica(t *testing.T) {
	p := &lastPickedPolicy{want: "r1", seen: map[string]uint64{}}
	g := mustNew(t, replicaNames(2), WithPolicy(p))
	for range 3 {
		d, err := g.Route(Key{1})
		require.NoError(t, err)
		require.Equal(t, "r1", d.Replica)
	}
	require.NoError(t, g.RemoveReplica("r1"))
	require.NoError(t, g.AddReplica(Replica{Name: "r2"}))
	p.want = "r0"
	_, err := g.Route(Key{1})
	require.NoError(t, err)
	require.Zero(t, p.seen["r2"], "the added replica was never chosen")
	require.Zero(t, p.seen["r0"])
}

// TestLoadAwareTieOrder: at equal load scores LoadAware prefers the
// replica sent less prefill work so far, then the one with fewer
// requests in flight, whatever Request.Tie draws and wherever it stands.
func TestLoadAwareTieOrder(t *testing.T) {
	var p LoadAware
	for tie := range uint64(64) {
		cs := []Candidate{{Name: "more", AssignedPrefill: 9}, {Name: "less", AssignedPrefill: 3}, {Name: "most", AssignedPrefill: 12}}
		require.Equal(t, "less", cs[p.Pick(&Request{Key: Key{1}, Tie: tie}, cs)].Name, "tie %d", tie)
		// Equal work sent, equal load score (queue depth normalised by the
		// largest; in flight counts only through Outstanding, here the
		// engines' larger counts): fewer in flight wins.
		cs = []Candidate{
			{Name: "busier", InFlight: 2, Load: Load{QueueDepth: 4}},
			{Name: "idler", InFlight: 1, Load: Load{QueueDepth: 4}},
		}
		require.Equal(t, "idler", cs[p.Pick(&Request{Key: Key{1}, Tie: tie}, cs)].Name, "tie %d", tie)
	}
}

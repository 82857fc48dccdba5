package gateway

import (
	"fmt"
	"testing"

	"github.com/examlops/gateway/keys"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// Tests of CacheAware's rules against adapters starving one another and
// piling up (see CacheAware and docs/lora.md): each case fails without
// its rule.

// pickAdapter runs CacheAware on candidates built for a request for
// adapter "a" with a key of n blocks, and returns the chosen name.
func pickAdapter(t require.TestingT, p *CacheAware, n int, cands []Candidate) string {
	req := Request{Key: make(Key, n), Adapter: "a"}
	for i := range cands {
		req.MaxMatched = max(req.MaxMatched, cands[i].Matched)
	}
	i := p.Pick(&req, cands)
	require.GreaterOrEqual(t, i, 0)
	return cands[i].Name
}

func TestAdapterRules(t *testing.T) {
	running := func(active, slots int) LoRAState {
		return LoRAState{Running: true, Loaded: true, Routed: 1, Active: active, MaxLoras: slots}
	}
	for _, tc := range []struct {
		name  string
		n     int // key blocks; 8 if 0
		cands []Candidate
		want  string
	}{
		{
			// r0 holds the prompt, but another adapter waits for r0's
			// slot while "a" runs clear at r1: r0 drains.
			name: "starved slot drains",
			cands: []Candidate{
				{Name: "r0", Matched: 8, InFlight: 1, LoRA: running(2, 1)},
				{Name: "r1", InFlight: 1, LoRA: running(1, 1)},
			},
			want: "r1",
		},
		{
			// The same without a clear replica: r0 keeps the adapter.
			name: "no clear replica",
			cands: []Candidate{
				{Name: "r0", Matched: 8, InFlight: 1, LoRA: running(2, 1)},
				{Name: "r1", InFlight: 1, LoRA: running(2, 1)},
			},
			want: "r0",
		},
		{
			// "a" runs clear at r0 behind a long queue; r1 is idle but
			// its slot is b's. Busy cluster (λ ≈ 95): the wait costs
			// more than the queue.
			name: "wait priced by load",
			cands: []Candidate{
				{Name: "r0", Matched: 8, PendingPrefill: 1500, InFlight: 1, LoRA: running(1, 1)},
				{Name: "r1", Matched: 8, LoRA: LoRAState{Active: 1, MaxLoras: 1}},
			},
			want: "r0",
		},
		{
			// A popular adapter (10 of 12 requests in flight) on one of
			// four replicas, two of which have never held an adapter,
			// after warm-up: it spreads to an empty one.
			name:  "popular adapter replicates",
			cands: popular(1, 1, 2000),
			want:  "r2",
		},
		{
			// A 64-block prompt that r0 holds: priced as if the empty
			// replica held it too, as a hot prefix is replicated.
			name:  "popular adapter replicates with its prompt",
			n:     64,
			cands: popular(1, 1, 2000),
			want:  "r2",
		},
		{
			name:  "not before warm-up",
			cands: popular(1, 1, demandWindow-1),
			want:  "r0",
		},
		{
			name:  "never into the last empty slot",
			cands: popular(1, 0, 2000),
			want:  "r0",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := tc.n
			if n == 0 {
				n = 8
			}
			for i := range tc.cands {
				if tc.cands[i].Matched > 0 {
					tc.cands[i].Matched = n
				}
			}
			require.Equal(t, tc.want, pickAdapter(t, &CacheAware{}, n, tc.cands))
		})
	}
}

// popular is four one-slot replicas: r0 runs "a" with 10 requests in
// flight, r1 runs "b" with 2, r2 and r3 are idle with e2 and e3 empty
// slots; the gateway has routed seen requests.
func popular(e2, e3 int, seen uint64) []Candidate {
	return []Candidate{
		{Name: "r0", Matched: 8, PendingPrefill: 40, InFlight: 10, LastPicked: seen,
			LoRA: LoRAState{Running: true, Loaded: true, Routed: 10, Active: 1, MaxLoras: 1}},
		{Name: "r1", InFlight: 2, LoRA: LoRAState{Active: 1, MaxLoras: 1}},
		{Name: "r2", LoRA: LoRAState{MaxLoras: 1, Empty: e2}},
		{Name: "r3", LoRA: LoRAState{MaxLoras: 1, Empty: e3}},
	}
}

// TestPropLoRAStarvedSlotDrains: whatever the queues and cached prefixes
// (within what a wait for a slot outweighs), a request for an adapter
// never goes to a replica where another adapter waits for a slot while
// the adapter runs at a replica where none waits.
func TestPropLoRAStarvedSlotDrains(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(2, 8).Draw(t, "replicas")
		slots := rapid.IntRange(1, 3).Draw(t, "slots")
		cands := make([]Candidate, n)
		clear := false
		for i := range cands {
			c := &cands[i]
			c.Name = fmt.Sprintf("r%d", i)
			c.Matched = rapid.IntRange(0, 8).Draw(t, "matched")
			c.PendingPrefill = rapid.IntRange(0, 100).Draw(t, "pending")
			c.InFlight = rapid.IntRange(0, 4).Draw(t, "inflight")
			c.AssignedPrefill = rapid.IntRange(0, 3).Draw(t, "assigned")
			c.LastPicked = uint64(rapid.IntRange(0, 3).Draw(t, "last"))
			l := LoRAState{MaxLoras: slots, Active: rapid.IntRange(0, slots+2).Draw(t, "active")}
			if l.Active > 0 && rapid.Bool().Draw(t, "running") {
				l.Running, l.Loaded, l.Routed = true, true, min(c.InFlight, 1)
				clear = clear || l.Active <= slots
			}
			c.LoRA = l
		}
		got := pickAdapter(t, &CacheAware{}, 8, cands)
		l := cands[nameIndex(got)].LoRA
		if clear {
			require.False(t, l.inBatch() && l.Active > l.MaxLoras, "chose %s %+v, where another adapter waits, over a clear replica", got, l)
		}
	})
}

// TestLoRAEmptySlots: LoRAState.Empty counts the slots no adapter has
// held, waited for or last used there.
func TestLoRAEmptySlots(t *testing.T) {
	key := keys.Salt(keys.AppendHashes(nil, []uint64{1, 2}), "a")
	sp := &spy{inner: &CacheAware{}}
	g2, err := New(replicaNames(2), WithPolicy(sp))
	require.NoError(t, err)
	require.NoError(t, g2.UpdateAdapters("r0", AdapterReport{MaxLoras: 3, Running: []string{"b"}, Waiting: []string{"c"}}))
	require.NoError(t, g2.UpdateAdapters("r1", AdapterReport{MaxLoras: 3}))
	d, err := g2.RouteWith(key, Target{Adapter: "a", Allow: func(n string) bool { return n == "r1" }})
	require.NoError(t, err)
	require.Equal(t, 3, sp.cands[0].LoRA.Empty, "r1 has held nothing")
	_, err = g2.RouteWith(key, Target{Adapter: "a"})
	require.NoError(t, err)
	require.Equal(t, 1, sp.cands[0].LoRA.Empty, "r0: b holds a slot, c waits for one")
	require.Equal(t, 2, sp.cands[1].LoRA.Empty, "r1: a was routed there")
	d.Done(DoneInfo{})
	_, err = g2.RouteWith(key, Target{Adapter: "z"})
	require.NoError(t, err)
	require.Equal(t, 2, sp.cands[1].LoRA.Empty, "r1: a last used a slot there")
	require.NoError(t, g2.UpdateAdapters("r1", AdapterReport{}))
	_, err = g2.RouteWith(key, Target{Adapter: "z"})
	require.NoError(t, err)
	require.Zero(t, sp.cands[1].LoRA.Empty, "slots unknown")
}

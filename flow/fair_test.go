package flow

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// RoundRobin serves a flow that has just become backlogged before the
// flows that have had their turn in the current round (start-time fair
// queueing), not at the end of the turn order; a flow that has just had
// its turn, or that re-sends at once, waits for the others.
func TestNewlyBackloggedGoesNext(t *testing.T) {
	type op struct {
		push string // a request of this flow, or "" for a Next
	}
	next := op{}
	push := func(f string) op { return op{push: f} }
	for _, tc := range []struct {
		name string
		ops  []op
		want string // flows of the requests Next returns, in order
	}{
		{"a quiet flow after a flood's turns",
			[]op{push("noisy"), push("noisy"), push("noisy"), push("noisy"), next, next, push("quiet"), next, next, next},
			"noisy noisy quiet noisy noisy"},
		{"a newcomer after a full round",
			[]op{push("a"), push("b"), push("a"), push("b"), next, next, push("c"), next, next, next},
			"a b c a b"},
		{"a newcomer within a round waits for those still owed a turn",
			[]op{push("a"), push("b"), push("a"), push("b"), next, push("c"), next, next, next, next},
			"a b c a b"},
		{"a flow that re-sends at once waits for the round",
			[]op{push("noisy"), push("noisy"), push("noisy"), next, push("quiet"), next, push("quiet"), next, next, next},
			"noisy quiet noisy quiet noisy"},
		{"a flow whose last request went this round waits when it comes back",
			[]op{push("a"), push("b"), push("b"), next, next, push("a"), next, next},
			"a b b a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := mustNew[string](t, Config{})
			var got []string
			for _, o := range tc.ops {
				if o.push != "" {
					_, err := q.Push(Request[string]{Value: o.push, Flow: o.push}, t0, nil)
					require.NoError(t, err)
					continue
				}
				v, ok := q.Next(func(string) bool { return true })
				require.True(t, ok)
				got = append(got, v)
			}
			assert.Equal(t, tc.want, fmt.Sprint(got)[1:len(fmt.Sprint(got))-1])
		})
	}
}

// TestPropFairQueueingBound: in one band, with room for every head and
// pushes of any flow between dispatches (flows emptying and coming back),
// over any run of dispatches during which two flows stay backlogged their
// dispatch counts differ by at most one; and a flow that pushes its next
// request only once its last has gone (one at a time, at once or later)
// is never dispatched more often than a flow backlogged all along, plus
// one.
func TestPropFairQueueingBound(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		q, _ := New[int](Config{Total: Limits{MaxRequests: 1 << 20}})
		nf := rapid.IntRange(2, 5).Draw(t, "flows")
		held := make([]int, nf+1) // flow nf is the one-at-a-time sender
		push := func(f int) {
			if _, err := q.Push(Request[int]{Value: f, Flow: fmt.Sprint(f)}, t0, nil); err != nil {
				t.Fatal(err)
			}
			held[f]++
		}
		// Flow 0 is backlogged all along.
		for i := 0; i < 200; i++ {
			push(0)
		}
		// backlogged[k][f]: flow f held requests before dispatch k, and
		// still held one after it or was the one dispatched.
		var got []int
		var before [][]bool
		count := make([]int, nf+1)
		for step := 0; step < 120; step++ {
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0:
				push(rapid.IntRange(1, nf-1).Draw(t, "flow"))
			case 1:
				if held[nf] == 0 && rapid.Bool().Draw(t, "resend") {
					push(nf)
				}
			case 2:
				b := make([]bool, nf+1)
				for f := range b {
					b[f] = held[f] > 0
				}
				v, ok := q.Next(func(int) bool { return true })
				if !ok {
					t.Fatal("nothing dispatched though flow 0 is backlogged")
				}
				held[v]--
				count[v]++
				got = append(got, v)
				before = append(before, b)
				if count[nf] > count[0]+1 {
					t.Fatalf("the one-at-a-time flow got %d dispatches, the backlogged flow %d: %v", count[nf], count[0], got)
				}
			}
		}
		// Every run [i, j] during which f and g were both backlogged: held
		// before dispatch i, and before every dispatch up to j, and f (g)
		// still backlogged after j unless j dispatched it.
		for f := 0; f <= nf; f++ {
			for g := f + 1; g <= nf; g++ {
				for i := range got {
					w := [2]int{}
					for j := i; j < len(got) && before[j][f] && before[j][g]; j++ {
						if got[j] == f {
							w[0]++
						}
						if got[j] == g {
							w[1]++
						}
						if w[0]-w[1] > 1 || w[1]-w[0] > 1 {
							t.Fatalf("flows %d and %d both backlogged over dispatches %d..%d got %d and %d: %v", f, g, i, j, w[0], w[1], got)
						}
					}
				}
			}
		}
	})
}

// A client sending from ever new fairness ids, one request each, makes
// flows that empty as their request goes; the queue remembers each
// until the band's virtual time passes it, but never more than MaxFlows
// of them.
func TestIdleFlowsBounded(t *testing.T) {
	q := mustNew[int](t, Config{MaxFlows: 3})
	for i := 0; i < 4; i++ {
		_, err := q.Push(Request[int]{Value: -1, Flow: "a"}, t0, nil)
		require.NoError(t, err)
	}
	v, ok := q.Next(always)
	require.True(t, ok)
	require.Equal(t, -1, v) // a has had its turn: the newcomers go first
	for i := 0; i < 100; i++ {
		_, err := q.Push(Request[int]{Value: i, Flow: fmt.Sprint("x", i)}, t0, nil)
		require.NoError(t, err)
		v, ok := q.Next(always)
		require.True(t, ok)
		require.Equal(t, i, v, "a newcomer goes before the flow that had its turn")
		assert.LessOrEqual(t, len(q.bands[0].flows), 2*3+1, "flows remembered")
	}
}

package gateway

import (
	"errors"
	"fmt"
	"testing"

	"github.com/examlops/gateway/keys"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// Edge cases of issue 13, finding 1: states the API allows must not panic.

// firstPolicy always picks the first candidate: a custom policy, to check
// the gateway never calls Pick without candidates.
type firstPolicy struct{}

func (firstPolicy) Pick(_ *Request, cands []Candidate) int {
	_ = cands[0] // panics on an empty slice
	return 0
}

// TestRemoveLastReplicaThenRoute: removing every replica is allowed, and
// Route then returns an error wrapping ErrNoHealthyReplica instead of
// panicking (round-robin divided by zero, cache-aware indexed -1); adding
// a replica back makes Route work again.
func TestRemoveLastReplicaThenRoute(t *testing.T) {
	for _, opt := range []Option{WithMode(ModeRoundRobin), WithMode(ModeCacheAware), WithMode(ModeLoadAware), WithPolicy(firstPolicy{})} {
		g := mustNew(t, replicaNames(2), opt)
		k := keys.AppendHashes(nil, []uint64{1, 2, 3})
		d, err := g.Route(k)
		require.NoError(t, err)
		require.NoError(t, g.RemoveReplica("r0"))
		require.NoError(t, g.RemoveReplica("r1"))
		require.Empty(t, g.Replicas())
		_, err = g.Route(k)
		require.ErrorIs(t, err, ErrNoHealthyReplica)
		require.ErrorContains(t, err, "no replicas")
		_, err = g.RouteWith(k, Target{Allow: func(name string) bool { return name != "r0" }})
		require.ErrorIs(t, err, ErrNoHealthyReplica)
		d.Done(DoneInfo{}) // a decision for a removed replica still completes
		require.NoError(t, g.AddReplica(Replica{Name: "r9"}))
		d, err = g.Route(k)
		require.NoError(t, err)
		require.Equal(t, "r9", d.Replica)
		d.Done(DoneInfo{})
	}
}

// TestNewNilOption: a nil Option is an error naming its position, not a
// panic.
func TestNewNilOption(t *testing.T) {
	_, err := New(replicaNames(1), nil)
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "option 1 of 1 is nil")
	_, err = New(replicaNames(1), WithMode(ModeCacheAware), nil, withIndex(indexExact))
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "option 2 of 3 is nil")
}

// TestPDPoolEmptied: a decode pool whose replicas were all removed makes
// PD.Route fail with ErrNoHealthyReplica; an emptied (or absent) prefill
// pool decodes co-located, with the reason said. A PD without a decode
// gateway, or with a block of no tokens, is an error.
func TestPDPoolEmptied(t *testing.T) {
	k := keys.AppendHashes(nil, []uint64{1, 2})
	pd := PD{Prefill: mustNew(t, replicaNames(1)), Decode: mustNew(t, replicaNames(1))}
	require.NoError(t, pd.Prefill.RemoveReplica("r0"))
	plan, err := pd.Route(k, 16, Target{}, Target{})
	require.NoError(t, err)
	require.False(t, plan.Split)
	require.Equal(t, "prefill_unavailable", plan.Reason)
	plan.Decode.Done(DoneInfo{})
	pd.Prefill = nil
	plan, err = pd.Route(keys.AppendHashes(nil, []uint64{3, 4}), 16, Target{}, Target{}) // uncached on the decode replica
	require.NoError(t, err)
	require.Equal(t, "prefill_unavailable", plan.Reason)
	plan.Decode.Done(DoneInfo{})
	require.NoError(t, pd.Decode.RemoveReplica("r0"))
	_, err = pd.Route(k, 16, Target{}, Target{})
	require.ErrorIs(t, err, ErrNoHealthyReplica)

	for _, bad := range []*PD{nil, {}, {Prefill: mustNew(t, replicaNames(1))}} {
		_, err := bad.Route(k, 16, Target{}, Target{})
		require.ErrorIs(t, err, ErrInvalid)
	}
	_, err = (&PD{Decode: mustNew(t, replicaNames(1))}).Route(k, 0, Target{}, Target{})
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "tokensPerBlock 0")
}

// TestRoundRobinPickEmpty: called directly with no candidates (a Gateway
// never does), RoundRobin returns an invalid index instead of dividing by
// zero.
func TestRoundRobinPickEmpty(t *testing.T) {
	var p RoundRobin
	require.Equal(t, -1, p.Pick(&Request{Key: Key{1}}, nil))
	require.Equal(t, 0, p.Pick(&Request{Key: Key{1}}, []Candidate{{Name: "a"}}))
}

// TestPickEmpty: every built-in policy called directly with no candidates
// (a Gateway never does; a policy wrapping one may) returns an invalid
// index, as RoundRobin does, never one a caller would index cands with.
func TestPickEmpty(t *testing.T) {
	for _, p := range []Policy{&RoundRobin{}, &CacheAware{}, &LoadAware{}, &LoadAware{Weights: LoadWeights{KV: 1}}} {
		require.Equal(t, -1, p.Pick(&Request{Key: Key{1}}, nil), "%T", p)
		require.Equal(t, -1, p.Pick(&Request{Key: Key{1}}, []Candidate{}), "%T", p)
	}
}

// TestPropNoPanics: random sequences of replica changes, health changes,
// load reports, cache events and routes, on every policy and on a
// disaggregated pair, never panic; Route fails exactly when no replica is
// eligible, with an error wrapping ErrNoHealthyReplica.
func TestPropNoPanics(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		opt := rapid.SampledFrom([]Option{
			WithMode(ModeRoundRobin), WithMode(ModeCacheAware), WithMode(ModeLoadAware),
			WithPolicy(firstPolicy{}), WithPolicy(&CacheAware{LoadFactor: 1.25}),
		}).Draw(t, "policy")
		index := rapid.SampledFrom([]indexMode{indexApproximate, indexExact}).Draw(t, "index")
		pg, err := New(replicaNames(2), WithMode(ModeCacheAware), opt, withIndex(index))
		require.NoError(t, err)
		dg, err := New(replicaNames(2), WithMode(ModeLoadAware), opt, withIndex(index))
		require.NoError(t, err)
		dis := PD{Prefill: pg, Decode: dg}
		pools := map[*Gateway]map[string]bool{ // name → healthy
			dis.Prefill: {"r0": true, "r1": true},
			dis.Decode:  {"r0": true, "r1": true},
		}
		name := func(t *rapid.T) string { return fmt.Sprintf("r%d", rapid.IntRange(0, 3).Draw(t, "replica")) }
		key := func(t *rapid.T) Key {
			return keys.AppendHashes(nil, rapid.SliceOfN(rapid.Uint64Range(0, 3), 0, 5).Draw(t, "ids"))
		}
		var open []Decision
		for range rapid.IntRange(1, 60).Draw(t, "steps") {
			g := rapid.SampledFrom([]*Gateway{dis.Prefill, dis.Decode}).Draw(t, "pool")
			reps := pools[g]
			switch op := rapid.IntRange(0, 9).Draw(t, "op"); op {
			case 0:
				n := name(t)
				err := g.AddReplica(Replica{Name: n, CacheBlocks: rapid.IntRange(0, 4).Draw(t, "cap")})
				_, dup := reps[n]
				require.Equal(t, dup, errors.Is(err, ErrInvalid))
				if !dup {
					reps[n] = true
				}
			case 1, 2:
				n := name(t)
				err := g.RemoveReplica(n)
				_, ok := reps[n]
				require.Equal(t, !ok, errors.Is(err, ErrUnknownReplica))
				delete(reps, n)
			case 3:
				n, h := name(t), rapid.Bool().Draw(t, "healthy")
				if g.SetHealthy(n, h) == nil {
					reps[n] = h
				}
			case 4:
				_ = g.UpdateLoad(name(t), Load{QueueDepth: rapid.IntRange(0, 9).Draw(t, "queue")})
			case 5:
				kind := CacheEventKind(rapid.IntRange(0, 2).Draw(t, "kind"))
				_ = g.ApplyEvent(name(t), CacheEvent{Kind: kind, Blocks: key(t)})
			case 6:
				if len(open) > 0 {
					i := rapid.IntRange(0, len(open)-1).Draw(t, "done")
					open[i].FirstToken()
					open[i].Done(DoneInfo{})
				}
			case 7:
				k := key(t)
				dd, err := dis.Route(k, 4, Target{}, Target{})
				if err == nil {
					open = append(open, dd.Prefill, dd.Decode)
				} else if len(k) == 0 {
					require.ErrorIs(t, err, ErrInvalid)
				} else if len(k) > 0 {
					require.ErrorIs(t, err, ErrNoHealthyReplica)
				}
			default:
				k, except := key(t), name(t)
				d, err := g.RouteWith(k, Target{Allow: func(name string) bool { return name != except }})
				eligible := 0
				for n, h := range reps {
					if h && n != except {
						eligible++
					}
				}
				switch {
				case len(k) == 0:
					require.ErrorIs(t, err, ErrInvalid)
				case eligible == 0:
					require.ErrorIs(t, err, ErrNoHealthyReplica)
				default:
					require.NoError(t, err)
					require.True(t, reps[d.Replica], "routed to %q, not a healthy replica", d.Replica)
					open = append(open, d)
				}
			}
		}
		for _, d := range open {
			d.Done(DoneInfo{})
		}
	})
}

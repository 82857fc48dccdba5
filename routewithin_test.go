package gateway

import (
	"errors"
	"testing"

	"github.com/examlops/gateway/keys"
	"github.com/stretchr/testify/require"
)

// TestRouteWithin: a replica allow rejects is never chosen, even when it
// holds the whole prefix; a nil allow, or one accepting an unknown name
// only, changes nothing; with nothing healthy and allowed the error wraps
// ErrNoHealthyReplica.
func TestRouteWithin(t *testing.T) {
	g, err := New(replicaNames(3), WithMode(ModeCacheAware))
	require.NoError(t, err)
	key := keys.AppendHashes(nil, []uint64{1, 2, 3})
	d, err := g.Route(key)
	require.NoError(t, err)
	d.Done(DoneInfo{})
	// Only d.Replica holds the key.
	e, err := g.RouteWith(key, Target{})
	require.NoError(t, err)
	require.Equal(t, d.Replica, e.Replica, "a nil allow accepts every replica")
	require.Equal(t, KindAffinity, e.Kind)
	e.Done(DoneInfo{})
	other := func(name string) bool { return name != d.Replica }
	for i := range 10 {
		e, err := g.RouteWith(key, Target{Allow: other})
		require.NoError(t, err)
		require.NotEqual(t, d.Replica, e.Replica)
		if i == 0 {
			require.Equal(t, KindLoadAware, e.Kind, "no allowed replica holds the key yet")
			require.Equal(t, FallbackNoMatch, e.Fallback)
		}
		e.Done(DoneInfo{})
	}
	only := func(name string) bool { return name == "r2" }
	for range 3 {
		e, err := g.RouteWith(key, Target{Allow: only})
		require.NoError(t, err)
		require.Equal(t, "r2", e.Replica)
		e.Done(DoneInfo{})
	}
	_, err = g.RouteWith(key, Target{Allow: func(string) bool { return false }})
	require.True(t, errors.Is(err, ErrNoHealthyReplica), "%v", err)
	require.Contains(t, err.Error(), "allowed")

	for _, r := range replicaNames(3) {
		if r.Name != d.Replica {
			require.NoError(t, g.SetHealthy(r.Name, false))
		}
	}
	_, err = g.RouteWith(key, Target{Allow: other})
	require.True(t, errors.Is(err, ErrNoHealthyReplica), "%v", err)
}

// TestRouteWithinAllocs: RouteWithin with a closure, as a retrying proxy
// writes it, allocates nothing.
func TestRouteWithinAllocs(t *testing.T) {
	g, err := New(replicaNames(4), WithMode(ModeCacheAware))
	require.NoError(t, err)
	key := keys.PrefixKey("You are a helpful assistant.", "sess-1", "")
	failed := "r1"
	allocs := testing.AllocsPerRun(200, func() {
		d, err := g.RouteWith(key, Target{Allow: func(name string) bool { return name != failed }})
		if err != nil || d.Replica == failed {
			t.Fatalf("%v %v", d.Replica, err)
		}
		d.Done(DoneInfo{})
	})
	require.Zero(t, allocs)
}

package gateway

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRouteExcept: the excluded replica is never chosen, even when it holds
// the whole prefix; with nothing else healthy the error wraps
// ErrNoHealthyReplica and names the excluded replica.
func TestRouteExcept(t *testing.T) {
	g, err := New(replicaNames(3), WithMode(ModeCacheAware))
	require.NoError(t, err)
	key := KeyFromHashes([]uint64{1, 2, 3})
	d, err := g.Route(key)
	require.NoError(t, err)
	d.Done(DoneInfo{})
	// Only d.Replica holds the key: an unknown name excludes nothing.
	e, err := g.RouteExcept(key, "no-such-replica")
	require.NoError(t, err)
	require.Equal(t, d.Replica, e.Replica, "an unknown name excludes nothing")
	e.Done(DoneInfo{})
	for range 10 {
		e, err := g.RouteExcept(key, d.Replica)
		require.NoError(t, err)
		require.NotEqual(t, d.Replica, e.Replica)
		e.Done(DoneInfo{})
	}

	for _, r := range replicaNames(3) {
		if r.Name != d.Replica {
			require.NoError(t, g.SetHealthy(r.Name, false))
		}
	}
	_, err = g.RouteExcept(key, d.Replica)
	require.True(t, errors.Is(err, ErrNoHealthyReplica), "%v", err)
	require.Contains(t, err.Error(), d.Replica)
}

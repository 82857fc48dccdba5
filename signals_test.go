package gateway

import (
	"errors"
	"math"
	"testing"

	"github.com/examlops/gateway/keys"
	"github.com/stretchr/testify/require"
)

// TestUpdateLoadRejectsHugeCounts: a count past maxRequestCount is a broken
// report; accepting it would overflow Outstanding and make the replica look
// idle.
func TestUpdateLoadRejectsHugeCounts(t *testing.T) {
	g, err := New(replicaNames(2), WithMode(ModeLoadAware))
	require.NoError(t, err)
	for _, l := range []Load{{QueueDepth: math.MaxInt}, {Running: maxRequestCount + 1}} {
		err := g.UpdateLoad("r0", l)
		require.True(t, errors.Is(err, ErrInvalid), "%v", err)
		require.Contains(t, err.Error(), "gateway:")
	}
	require.NoError(t, g.UpdateLoad("r0", Load{QueueDepth: maxRequestCount, Running: maxRequestCount}))
	d, err := g.Route(keys.AppendHashes(nil, []uint64{1}))
	require.NoError(t, err)
	require.Equal(t, "r1", d.Replica, "the overloaded replica must not look idle")
}

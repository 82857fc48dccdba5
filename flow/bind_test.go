package flow

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
)

// Bind: a saturated model binds nothing; an admitted-only
// request goes unrouted; with no healthy replica it waits; otherwise the
// library routes it at that moment, counting it in flight.
func TestBind(t *testing.T) {
	gw, err := gateway.New([]gateway.Replica{{Name: "a"}, {Name: "b"}})
	require.NoError(t, err)
	a := gateway.Admission{QueueDepth: 2}
	key := gateway.Key{1, 2, 3}
	for _, r := range []string{"a", "b"} {
		require.NoError(t, gw.UpdateLoad(r, gateway.Load{QueueDepth: 5}))
	}
	ok, _, routed := Bind(gw, key, gateway.Target{}, a, false)
	assert.False(t, ok, "saturated: not yet")
	assert.False(t, routed)
	require.NoError(t, gw.UpdateLoad("b", gateway.Load{}))
	ok, _, routed = Bind(gw, key, gateway.Target{}, a, true)
	assert.True(t, ok)
	assert.False(t, routed, "admitted only: planned after")
	ok, d, routed := Bind(gw, key, gateway.Target{}, a, false)
	require.True(t, ok)
	require.True(t, routed)
	// Which replica is the policy's (admission only says some has room).
	inFlight := 0
	for _, r := range gw.Replicas() {
		inFlight += r.InFlight
		if r.Name == d.Replica {
			assert.Equal(t, 1, r.InFlight, "bound means routed: counted in flight")
		}
	}
	assert.Equal(t, 1, inFlight)
	d.Done(gateway.DoneInfo{})
	require.NoError(t, gw.SetHealthy("a", false))
	require.NoError(t, gw.SetHealthy("b", false))
	ok, _, _ = Bind(gw, key, gateway.Target{}, a, false)
	assert.False(t, ok, "no healthy replica: wait (scale from zero)")
}

func TestBindDoesNotAllocate(t *testing.T) {
	gw, err := gateway.New([]gateway.Replica{{Name: "a"}, {Name: "b"}})
	require.NoError(t, err)
	a := gateway.Admission{Outstanding: 4}
	key := gateway.Key{1, 2, 3}
	allocs := testing.AllocsPerRun(100, func() {
		ok, d, routed := Bind(gw, key, gateway.Target{}, a, false)
		if !ok || !routed {
			t.Fatal("not bound")
		}
		d.Done(gateway.DoneInfo{})
	})
	assert.Zero(t, allocs)
}

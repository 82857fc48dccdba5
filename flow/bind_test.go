package flow

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

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
	ok, _, _ = Bind(gw, key, gateway.Target{}, a, true)
	assert.False(t, ok, "admitted only, no healthy replica: wait too")
	ok, _, _ = Bind(gw, key, gateway.Target{}, gateway.Admission{}, true)
	assert.False(t, ok, "admitted only, no healthy replica, no thresholds: wait too")
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
	allocs = testing.AllocsPerRun(100, func() {
		if ok, _, _ := Bind(gw, key, gateway.Target{}, a, true); !ok {
			t.Fatal("not admitted")
		}
	})
	assert.Zero(t, allocs, "admitted only")
}

// TestPropLimit: a usage limit only tightens: wherever a replica has room
// under Limit(a, c) it has room under a (so a saturated pool stays
// saturated for a limited band); a ceiling of 1 or out of (0, 1) changes
// nothing; a threshold set stays set (never 0, "not checked").
func TestPropLimit(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := gateway.Admission{
			QueueDepth:     rapid.IntRange(0, 8).Draw(t, "queue"),
			KVUtilization:  rapid.SampledFrom([]float64{0, 0.5, 0.8, 1}).Draw(t, "kv"),
			Outstanding:    rapid.IntRange(0, 300).Draw(t, "outstanding"),
			PendingPrefill: rapid.IntRange(0, 100).Draw(t, "pending"),
		}
		c := rapid.Float64Range(-0.5, 1.5).Draw(t, "ceiling")
		l := Limit(a, c)
		if !(c > 0 && c < 1) {
			if l != a {
				t.Fatalf("ceiling %v changed %+v to %+v", c, a, l)
			}
			return
		}
		for _, p := range [][2]int{{a.QueueDepth, l.QueueDepth}, {a.Outstanding, l.Outstanding}, {a.PendingPrefill, l.PendingPrefill}} {
			if p[1] > p[0] || (p[0] > 0) != (p[1] > 0) {
				t.Fatalf("ceiling %v: threshold %d became %d", c, p[0], p[1])
			}
		}
		if l.KVUtilization > a.KVUtilization || (a.KVUtilization > 0) != (l.KVUtilization > 0) {
			t.Fatalf("ceiling %v: KV %v became %v", c, a.KVUtilization, l.KVUtilization)
		}
		// Room: one replica with drawn load; saturated under a means
		// saturated under the limit.
		gw, err := gateway.New([]gateway.Replica{{Name: "r"}})
		if err != nil {
			t.Fatal(err)
		}
		load := gateway.Load{
			QueueDepth:    rapid.IntRange(0, 10).Draw(t, "load queue"),
			Running:       rapid.IntRange(0, 300).Draw(t, "load running"),
			KVUtilization: rapid.Float64Range(0, 1).Draw(t, "load kv"),
		}
		if err := gw.UpdateLoad("r", load); err != nil {
			t.Fatal(err)
		}
		if gw.Saturated(gateway.Target{}, a) && !gw.Saturated(gateway.Target{}, l) {
			t.Fatalf("saturated under %+v but not under its limit %+v (load %+v)", a, l, load)
		}
	})
}

// TestBindPinned: a request pinned to a replica with no room waits; once
// that replica is not eligible it goes unrouted at once (the caller
// answers 503) instead of waiting for its deadline, even while other
// replicas have room; with room it is routed there.
func TestBindPinned(t *testing.T) {
	gw, err := gateway.New([]gateway.Replica{{Name: "a"}, {Name: "b"}})
	require.NoError(t, err)
	a := gateway.Admission{QueueDepth: 2}
	key := gateway.Key{1, 2, 3}
	pin := gateway.Target{Allow: func(name string) bool { return name == "a" }}
	require.NoError(t, gw.UpdateLoad("a", gateway.Load{QueueDepth: 5}))
	ok, _, routed := BindPinned(gw, key, pin, a)
	assert.False(t, ok, "its replica has no room: wait")
	assert.False(t, routed)

	require.NoError(t, gw.UpdateLoad("a", gateway.Load{}))
	ok, d, routed := BindPinned(gw, key, pin, a)
	require.True(t, ok)
	require.True(t, routed)
	assert.Equal(t, "a", d.Replica)
	d.Done(gateway.DoneInfo{})

	require.NoError(t, gw.SetHealthy("a", false))
	ok, _, routed = BindPinned(gw, key, pin, a)
	assert.True(t, ok, "its replica is not eligible: answered at once")
	assert.False(t, routed)
	ok, _, _ = Bind(gw, key, pin, a, false)
	assert.False(t, ok, "Bind waits for it (scale from zero)")
	for _, r := range gw.Replicas() {
		assert.Zero(t, r.InFlight, r.Name)
	}
}

package sim

import (
	"testing"

	"github.com/examlops/gateway"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestAdmissionPastCapacity: far past capacity, admission control sheds
// the gateway's own policies' excess instead of queueing it: their queues
// stay short and more requests meet the TTFT SLO per second than without
// it, while the peers, which run without it, are untouched.
func TestAdmissionPastCapacity(t *testing.T) {
	w, err := Chat(ChatConfig{Requests: 3000, Rate: 400, Sessions: 100})
	require.NoError(t, err)
	var pols []Policy
	for _, n := range []string{"cache_aware", "round_robin", "sglang"} {
		p, err := PolicyByName(n)
		require.NoError(t, err)
		pols = append(pols, p)
	}
	run := func(a Admission) *Report {
		rep, err := Run(Config{Workload: w, Replicas: 2, Seed: 1, Policies: pols, Admission: a, Parallel: 1})
		require.NoError(t, err)
		return rep
	}
	off, on := run(Admission{}), run(Admission{QueueDepth: 2})
	for i, r := range on.Results {
		o := off.Results[i]
		assert.Equal(t, r.Requests, r.Completed+r.Dropped+r.Failed, r.Policy)
		if r.Policy == "sglang" {
			assert.Equal(t, o, r, "a peer runs without admission")
			continue
		}
		assert.Zero(t, o.Shed, r.Policy)
		assert.Positive(t, r.Shed, r.Policy)
		assert.Equal(t, r.Shed, r.Dropped, r.Policy)
		assert.Greater(t, r.Goodput, o.Goodput, r.Policy)
		assert.Less(t, r.PeakQueue, o.PeakQueue/4, "%s: peak queue %d with, %d without", r.Policy, r.PeakQueue, o.PeakQueue)
	}
	assert.Equal(t, on.Results, run(Admission{QueueDepth: 2}).Results, "deterministic")
	for _, bad := range []Admission{{QueueDepth: -1}, {KVUtilization: 1.5}, {Outstanding: -2}} {
		_, err := Run(Config{Workload: w, Admission: bad, Policies: pols[:1]})
		assert.ErrorIs(t, err, ErrInvalidConfig)
		assert.ErrorContains(t, err, "Admission.")
	}
}

// TestPropSaturated: the engine sheds exactly when some replica is healthy
// and every healthy one lacks room by one of the thresholds set.
func TestPropSaturated(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 6).Draw(t, "replicas")
		a := Admission{
			QueueDepth:    rapid.IntRange(0, 4).Draw(t, "queue"),
			KVUtilization: float64(rapid.IntRange(0, 4).Draw(t, "kv")) / 4,
			Outstanding:   rapid.IntRange(0, 6).Draw(t, "outstanding"),
		}
		reps := make([]gateway.Replica, n)
		for i := range reps {
			reps[i] = gateway.Replica{Name: string(rune('a' + i))}
		}
		g, err := gateway.New(reps)
		require.NoError(t, err)
		healthy, room := 0, 0
		for _, r := range reps {
			l := gateway.Load{QueueDepth: rapid.IntRange(0, 5).Draw(t, "q"), Running: rapid.IntRange(0, 5).Draw(t, "run"),
				KVUtilization: float64(rapid.IntRange(0, 4).Draw(t, "k")) / 4}
			require.NoError(t, g.UpdateLoad(r.Name, l))
			ok := rapid.Bool().Draw(t, "healthy")
			require.NoError(t, g.SetHealthy(r.Name, ok))
			if !ok {
				continue
			}
			healthy++
			if (a.QueueDepth == 0 || l.QueueDepth < a.QueueDepth) && (a.KVUtilization == 0 || l.KVUtilization < a.KVUtilization) &&
				(a.Outstanding == 0 || l.QueueDepth+l.Running < a.Outstanding) {
				room++
			}
		}
		e := &engine{cfg: &Config{Admission: a}}
		assert.Equal(t, healthy > 0 && room == 0, e.saturated(&router{g: g}), "healthy %d, with room %d", healthy, room)
	})
}

package sim

import (
	"testing"

	"github.com/examlops/gateway"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
	run := func(a gateway.Admission) *Report {
		rep, err := Run(Config{Workload: w, Replicas: 2, Seed: 1, Policies: pols, Admission: a, Parallel: 1})
		require.NoError(t, err)
		return rep
	}
	off, on := run(gateway.Admission{}), run(gateway.Admission{QueueDepth: 2})
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
	assert.Equal(t, on.Results, run(gateway.Admission{QueueDepth: 2}).Results, "deterministic")
	for _, bad := range []gateway.Admission{{QueueDepth: -1}, {KVUtilization: 1.5}, {Outstanding: -2}} {
		_, err := Run(Config{Workload: w, Admission: bad, Policies: pols[:1]})
		assert.ErrorIs(t, err, ErrInvalidConfig)
		assert.ErrorContains(t, err, "Admission.")
	}
}

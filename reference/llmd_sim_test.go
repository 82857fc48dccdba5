package reference_test

import (
	"testing"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/reference"
	"github.com/examlops/gateway/sim"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLLMDPredictedInSimulator: both modes run in the simulator, on its
// clock (reference.Clocked), and a run is the same for the same seed.
func TestLLMDPredictedInSimulator(t *testing.T) {
	w, err := sim.SharedPrefix(sim.SharedPrefixConfig{Requests: 3000, Rate: 60, Groups: 16, SystemTokens: 1024, QuestionTokens: 128, OutputTokens: 64})
	require.NoError(t, err)
	run := func() *sim.Report {
		rep, err := sim.Run(sim.Config{Workload: w, Replicas: 4, Seed: 9, Policies: sim.LLMDPredictedPolicies()})
		require.NoError(t, err)
		return rep
	}
	a, b := run(), run()
	for _, name := range []string{"llmd_predicted", "llmd_predicted_e2e"} {
		ra, ok := a.Result(name)
		require.True(t, ok, name)
		rb, _ := b.Result(name)
		assert.Equal(t, 3000, ra.Completed, name)
		assert.Equal(t, ra, rb, "%s: the same seed, the same run", name)
	}
	// It learns on the simulated clock: 50 s of traffic, a retrain every
	// 10 s (on the wall clock the run is over before the first flush).
	var p *reference.LLMDPredicted
	pol := sim.Policy{Name: "llmd", Source: "test", New: func(seed uint64) gateway.Policy {
		p = reference.NewLLMDPredicted(seed, false)
		return p
	}}
	_, err = sim.Run(sim.Config{Workload: w, Replicas: 4, Seed: 9, Policies: []sim.Policy{pol}})
	require.NoError(t, err)
	assert.Greater(t, reference.LLMDSamples(p), 100)
}

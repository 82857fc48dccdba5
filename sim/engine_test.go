package sim

import (
	"testing"

	"github.com/examlops/gateway"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRouterHitRateCountsAdmittedOnly: with MaxQueue shedding most
// requests, the index's predicted hit rate ("index says") counts only the
// admitted requests, like its denominator, so it stays below 1. It used to
// count shed requests too and reached 614%.
func TestRouterHitRateCountsAdmittedOnly(t *testing.T) {
	w, err := SharedPrefix(SharedPrefixConfig{Requests: 4000, Rate: 400, Groups: 4})
	require.NoError(t, err)
	pols := make([]Policy, 0, 2)
	for _, n := range []string{"cache_aware", "round_robin"} {
		p, err := PolicyByName(n)
		require.NoError(t, err)
		pols = append(pols, p)
	}
	for _, idx := range []gateway.IndexMode{gateway.IndexApproximate, gateway.IndexExact} {
		rep, err := Run(Config{Workload: w, Replicas: 2, MaxQueue: 1, Seed: 1, Policies: pols, Index: idx})
		require.NoError(t, err)
		for _, r := range rep.Results {
			require.Positive(t, r.Dropped, "%s: the test needs shed requests", r.Policy)
			assert.Positive(t, r.RouterTokenHitRate, r.Policy)
			assert.Less(t, r.RouterTokenHitRate, 1.0, "%s %v: index says %.3f", r.Policy, idx, r.RouterTokenHitRate)
		}
	}
}

package sim

import (
	"io"
	"testing"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/flow"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Config.RateLimit refuses, for every policy alike, exactly the requests
// flow.Rate.Admit refuses when each tenant is a client of one gateway, at
// the workload's arrival times; each tenant's refusals are its shed, and
// every request is still accounted for. Two gateways keep a limiter each,
// so fewer are refused. A bad rate is an error naming the field.
func TestRateLimit(t *testing.T) {
	w := smallTenants(t, 3000, 300, TenantsConfig{Tenants: 3, Noisy: 5})
	rate := flow.Rate{PerSecond: 40, Burst: 5}
	// The reference: Admit per tenant.
	st, err := w.Open(4)
	require.NoError(t, err)
	tat, refused, total := map[string]int64{}, map[string]int{}, 0
	var r Request
	for st.Next(&r) != io.EOF {
		at, ok := tat[r.Tenant]
		if !ok {
			at = int64(r.Arrival)
		}
		next, wait := rate.Admit(at, int64(r.Arrival))
		if wait > 0 {
			refused[r.Tenant]++
			total++
			continue
		}
		tat[r.Tenant] = next
	}
	require.NoError(t, st.Close())
	require.Greater(t, total, 1000, "the limit refuses the noisy tenant's excess: %v", refused)
	require.Greater(t, refused["quiet1"], 0, "a quiet tenant's bursts too: %v", refused)

	var peer Policy
	for _, p := range DefaultPolicies() {
		if p.Source != "" {
			peer = p
			break
		}
	}
	cfg := Config{Workload: w, Replicas: 3, Preset: smallPreset(), Seed: 4, RateLimit: flow.RateLimit{Rate: rate},
		Policies: []Policy{cacheAware, {Name: "round_robin", Mode: gateway.ModeRoundRobin}, peer}}
	rep, err := Run(cfg)
	require.NoError(t, err)
	for _, x := range rep.Results {
		assert.Equal(t, total, x.RateLimited, x.Policy)
		assert.Equal(t, x.Requests, x.Completed+x.Dropped+x.Failed+x.Expired, x.Policy)
		assert.GreaterOrEqual(t, x.Dropped, x.RateLimited, x.Policy)
		require.Len(t, x.Tenants, 3, x.Policy)
		for _, g := range x.Tenants {
			assert.Equal(t, refused[g.Name], g.Shed, "%s %s", x.Policy, g.Name)
		}
	}
	assert.Equal(t, rate, rep.RateLimit)

	cfg.Gateways = 2
	two, err := Run(cfg)
	require.NoError(t, err)
	for _, x := range two.Results {
		assert.Less(t, x.RateLimited, total, "%s: each of two gateways limits its own share", x.Policy)
		assert.Positive(t, x.RateLimited, x.Policy)
	}

	cfg.Gateways = 1
	cfg.RateLimit = flow.RateLimit{Rate: flow.Rate{PerSecond: 40}}
	_, err = Run(cfg)
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.ErrorContains(t, err, "RateLimit: ")
	assert.ErrorContains(t, err, "Burst")
}

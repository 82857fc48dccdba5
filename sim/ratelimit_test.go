package sim

import (
	"io"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/flow"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Config.RateLimit refuses, for cache_aware, round_robin and a peer
// alike, exactly the requests
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

// A request that fails (larger than the KV cache) spends its tenant's
// rate, as at the gateway, which limits before it reads the body (it was
// checked after, and the next request of the tenant got through).
func TestRateLimitBeforeFailed(t *testing.T) {
	big := make([]uint64, 3000) // 48,000 tokens, past smallPreset's 32,768
	for i := range big {
		big[i] = uint64(1000 + i)
	}
	reqs := []Request{
		{Arrival: 0, InputTokens: 16 * len(big), OutputTokens: 1, Blocks: big, Tenant: "a"},
		{Arrival: time.Millisecond, InputTokens: 64, OutputTokens: 1, Blocks: []uint64{1, 2, 3, 4}, Tenant: "a"},
	}
	rep, err := Run(Config{Workload: &listWorkload{bt: 16, reqs: reqs}, Replicas: 1, Preset: smallPreset(), Seed: 1,
		Policies: []Policy{cacheAware}, RateLimit: flow.RateLimit{Rate: flow.Rate{PerSecond: 1, Burst: 1}}})
	require.NoError(t, err)
	x := rep.Results[0]
	require.Equal(t, 1, x.Failed)
	require.Equal(t, 1, x.RateLimited, "the failed request spent tenant a's burst; completed %d", x.Completed)
}

// RateLimit.MaxClients is refused: a bounded limiter forgets clients in
// the map's random order, and the same seed gave 10 different counts of
// refusals in 10 runs.
func TestRateLimitMaxClientsRefused(t *testing.T) {
	cfg := Config{Workload: smallTenants(t, 100, 100, TenantsConfig{Tenants: 3}), Replicas: 1, Preset: smallPreset(), Seed: 1,
		Policies: []Policy{cacheAware}, RateLimit: flow.RateLimit{Rate: flow.Rate{PerSecond: 1, Burst: 1}, MaxClients: 2}}
	_, err := Run(cfg)
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "RateLimit.MaxClients 2")
}

package fleet

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
)

// TestPrefillHostPortAcrossReload: a reload that keeps the routing options
// keeps the prefill pool's gateway, so a request planned with the model's
// state from before the reload (held by flow control, say) may be routed
// to a prefill replica the reload added, or moved; the sidecar must still
// be given that replica's host:port, not nothing or the old one.
func TestPrefillHostPortAcrossReload(t *testing.T) {
	s, err := New(Options{Logger: quietLogger(), ScrapeInterval: time.Hour, ProbeInterval: time.Hour, DiscoverInterval: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	zero := 0
	model := func(prefill ...config.Replica) *config.File {
		return &config.File{Version: 1, Models: map[string]config.Model{testModel: {
			Mode: gateway.ModeCacheAware, Disaggregate: true, PrefillPool: "prefill", DecodePool: "decode", PDMode: config.PDModeSidecar, PDMinUncachedTokens: &zero,
			Pools: map[string][]config.Replica{"prefill": prefill, "decode": {{Name: "d0", Address: "http://10.0.2.1:8000"}}},
		}}}
	}
	require.NoError(t, s.Apply(model(config.Replica{Name: "p0", Address: "10.0.1.1:8000"}, config.Replica{Name: "p1", Address: "http://10.0.1.2:8000"})))
	old := s.state.Load().Models[testModel]
	require.Equal(t, "10.0.1.1:8000", old.PD.PrefillHostPort(&gateway.Decision{Replica: "prefill/p0", Address: "http://10.0.1.1:8000"}))

	// p1 moves, p2 comes.
	require.NoError(t, s.Apply(model(config.Replica{Name: "p0", Address: "10.0.1.1:8000"}, config.Replica{Name: "p1", Address: "http://10.0.1.12:8000"},
		config.Replica{Name: "p2", Address: "http://p2.prefill.svc:8001"})))
	require.Same(t, old.PD.Plan.Prefill, s.state.Load().Models[testModel].PD.Plan.Prefill, "the prefill pool's gateway is kept")
	key := gateway.Key{1, 2, 3}
	for _, c := range []struct{ name, want string }{{"prefill/p1", "10.0.1.12:8000"}, {"prefill/p2", "p2.prefill.svc:8001"}} {
		name := c.name
		plan, err := old.PD.Plan.Route(key, 16, gateway.Target{}, gateway.Target{Allow: func(n string) bool { return n == name }})
		require.NoError(t, err)
		require.True(t, plan.Split)
		require.Equal(t, name, plan.Prefill.Replica)
		assert.Equal(t, c.want, old.PD.PrefillHostPort(&plan.Prefill), "the plan's state is older than %s's address", name)
		plan.Prefill.Done(gateway.DoneInfo{})
		plan.Decode.Done(gateway.DoneInfo{})
	}
}

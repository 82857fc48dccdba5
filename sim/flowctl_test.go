package sim

import (
	"fmt"
	"io"
	"math"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/flow"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// smallTenants is a small multi-tenant workload for the tests.
func smallTenants(t testing.TB, n int, rate float64, c TenantsConfig) Workload {
	t.Helper()
	base, err := SharedPrefix(SharedPrefixConfig{Requests: n, Rate: rate, Groups: 8, SystemTokens: 512, QuestionTokens: 128, OutputTokens: 64})
	require.NoError(t, err)
	c.Base = base
	w, err := Tenants(c)
	require.NoError(t, err)
	return w
}

// flowEngine runs one policy on cfg and returns its engine.
func flowEngine(t testing.TB, cfg Config, pol Policy) *engine {
	t.Helper()
	e, st := openEngine(t, cfg, pol)
	defer st.Close()
	require.NoError(t, e.run(st, func() {}))
	return e
}

// openEngine returns the engine of one policy on cfg, filled in, and its
// workload's stream, not yet run.
func openEngine(t testing.TB, cfg Config, pol Policy) (*engine, Stream) {
	t.Helper()
	require.NoError(t, cfg.fill())
	e, err := newEngine(&cfg, pol)
	require.NoError(t, err)
	st, err := cfg.Workload.Open(cfg.Seed)
	require.NoError(t, err)
	return e, st
}

var cacheAware = Policy{Name: "cache_aware", Mode: gateway.ModeCacheAware}

// Every request ends completed, shed, expired or failed (none lost, none
// left held, no cache block left pinned or reserved, with either engine
// rule, Config.CacheAtSchedule); nothing is answered after its deadline, nor dispatched
// past it; an expired request is never routed; the tenant and class
// tables add up; and the same seed gives the same report.
func TestFlowControlProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		tenants := rapid.IntRange(0, 3).Draw(rt, "tenants")
		var classes []Class
		if rapid.Bool().Draw(rt, "classes") {
			classes = []Class{InteractiveClass, BatchClass}
		}
		w := smallTenants(t, rapid.IntRange(20, 120).Draw(rt, "requests"), rapid.Float64Range(5, 400).Draw(rt, "rate"),
			TenantsConfig{Tenants: tenants, Noisy: rapid.Float64Range(1, 6).Draw(rt, "noisy"), Classes: classes, VaryOutput: rapid.Bool().Draw(rt, "vary")})
		ttl := time.Duration(rapid.IntRange(1, 3000).Draw(rt, "ttl_ms")) * time.Millisecond
		q := flow.Config{TTL: ttl, Total: flow.Limits{MaxRequests: rapid.IntRange(1, 40).Draw(rt, "max_requests")},
			Fairness: flow.Fairness(rapid.IntRange(0, 1).Draw(rt, "fairness")), Order: flow.Order(rapid.IntRange(0, 1).Draw(rt, "order"))}
		adm := gateway.Admission{Outstanding: rapid.IntRange(1, 6).Draw(rt, "outstanding"), QueueDepth: rapid.IntRange(0, 2).Draw(rt, "queue_depth"),
			PendingPrefill: rapid.IntRange(0, 40).Draw(rt, "pending_prefill")}
		var limits map[int]float64
		if rapid.Bool().Draw(rt, "usage_limit") {
			limits = map[int]float64{0: rapid.Float64Range(0.1, 1).Draw(rt, "batch_limit")}
		}
		cfg := Config{Workload: w, Replicas: rapid.IntRange(1, 3).Draw(rt, "replicas"), Preset: smallPreset(), Seed: rapid.Uint64Range(1, 9).Draw(rt, "seed"),
			Gateways: rapid.IntRange(1, 2).Draw(rt, "gateways"), Admission: adm, FlowControl: FlowControl{Enabled: true, Queue: q, UsageLimits: limits},
			CacheAtSchedule: rapid.Bool().Draw(rt, "cache_at_schedule")}
		for _, pol := range []Policy{cacheAware, GIEFlowPolicy()} {
			e := flowEngine(t, cfg, pol)
			r := e.result()
			assert.Zero(rt, e.queued, "%s: requests left held", pol.Name)
			assert.Zero(rt, e.inflight, "%s: requests left in flight", pol.Name)
			for _, rep := range e.reps {
				assert.Zero(rt, rep.cache.pinned, "%s: %s: blocks left pinned", pol.Name, rep.name)
				assert.Zero(rt, rep.cache.reserved, "%s: %s: blocks left reserved", pol.Name, rep.name)
			}
			assert.Equal(rt, r.Requests, r.Completed+r.Dropped+r.Failed+r.Expired, "%s: every request has an outcome", pol.Name)
			sum := 0
			for _, v := range r.ShedReasons {
				sum += v
			}
			assert.Equal(rt, r.Shed, sum, "%s: every shed request has its reason", pol.Name)
			assert.EqualValues(rt, r.Completed, r.Router.Routed, "%s: only dispatched requests are routed", pol.Name)
			if pol.GIEFlowControl {
				assert.Zero(rt, r.Expired+r.Shed, "GIE holds without a TTL or a request bound")
			} else {
				assert.LessOrEqual(rt, r.QueueTime.Max, ttl.Seconds()+1e-9, "dispatched after its deadline")
				assert.Zero(rt, r.Late, "answered past its deadline")
				if r.Expired > 0 {
					assert.Zero(rt, e.lateMax, "answered after its deadline")
					assert.Zero(rt, e.lateMin, "answered before its deadline")
				}
			}
			for _, gs := range [][]Group{r.Tenants, r.Classes} {
				n := 0
				for _, g := range gs {
					n += g.Requests
					assert.LessOrEqual(rt, g.Completed+g.Shed+g.Expired, g.Requests)
					assert.LessOrEqual(rt, g.Queue.Max, r.QueueTime.Max)
				}
				if len(gs) > 0 {
					assert.Equal(rt, r.Requests, n, "%s: the groups hold every request", pol.Name)
				}
			}
		}
	})
}

func TestFlowControlDeterministic(t *testing.T) {
	w := smallTenants(t, 150, 300, TenantsConfig{Tenants: 2, Noisy: 5, Classes: []Class{InteractiveClass, BatchClass}, VaryOutput: true})
	cfg := Config{Workload: w, Replicas: 2, Preset: smallPreset(), Seed: 3, Policies: []Policy{cacheAware, GIEFlowPolicy()},
		Admission: gateway.Admission{Outstanding: 3}, FlowControl: FlowControl{Enabled: true, Queue: flow.Config{TTL: time.Second, Total: flow.Limits{MaxRequests: 20}}}}
	a, err := Run(cfg)
	require.NoError(t, err)
	b, err := Run(cfg)
	require.NoError(t, err)
	assert.Equal(t, reportJSON(t, a), reportJSON(t, b))
	var ta, tb stringsWriter
	require.NoError(t, a.WriteTable(&ta))
	require.NoError(t, b.WriteTable(&tb))
	assert.Equal(t, ta.String(), tb.String())
	assert.Contains(t, ta.String(), "per tenant")
	assert.Contains(t, ta.String(), "per class")
	assert.Contains(t, ta.String(), "flow control (")
	ca, _ := a.Result("cache_aware")
	assert.Positive(t, ca.Expired+ca.Shed, "the overload is answered by expiry or shedding")
}

type stringsWriter struct{ b []byte }

func (w *stringsWriter) Write(p []byte) (int, error) { w.b = append(w.b, p...); return len(p), nil }
func (w *stringsWriter) String() string              { return string(w.b) }

// Off, nothing changes: a workload with tenants and classes but no flow
// control sheds and routes as before (its tables aside), and the report
// of a workload without them has no new field.
func TestFlowControlOffUnchanged(t *testing.T) {
	cfg := Config{Workload: fixture(t, TraceOptions{}), Replicas: 3, Preset: smallPreset(), Seed: 5, Policies: []Policy{cacheAware}}
	a, err := Run(cfg)
	require.NoError(t, err)
	js := reportJSON(t, a)
	for _, f := range []string{"tenants", "classes", "expired", "queue_time", "shed_reasons"} {
		assert.NotContains(t, js, `"`+f+`"`)
	}
	var tab stringsWriter
	require.NoError(t, a.WriteTable(&tab))
	assert.NotContains(t, tab.String(), "per tenant")
	assert.NotContains(t, tab.String(), "flow control")
}

func TestFlowControlConfig(t *testing.T) {
	w := smallTenants(t, 10, 10, TenantsConfig{Tenants: 2})
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no admission", Config{FlowControl: FlowControl{Enabled: true}}, "FlowControl needs Admission"},
		{"bad queue", Config{Admission: gateway.Admission{Outstanding: 1}, FlowControl: FlowControl{Enabled: true, Queue: flow.Config{TTL: -1}}}, "FlowControl.Queue: flow: invalid argument: TTL -1ns is negative"},
		{"bad usage limit", Config{Admission: gateway.Admission{Outstanding: 1}, FlowControl: FlowControl{Enabled: true, UsageLimits: map[int]float64{2: 1.5}}}, "FlowControl.UsageLimits[2] 1.5, want (0, 1]"},
		{"negative pending prefill", Config{Admission: gateway.Admission{PendingPrefill: -1}}, "Admission.PendingPrefill -1 is negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Workload, tc.cfg.Preset = w, smallPreset()
			_, err := Run(tc.cfg)
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// The queue's refusals and displacements are shed with their reason.
func TestFlowControlShedReasons(t *testing.T) {
	w := smallTenants(t, 200, 2000, TenantsConfig{Tenants: 3, Noisy: 6})
	cfg := Config{Workload: w, Replicas: 1, Preset: smallPreset(), Seed: 1, Admission: gateway.Admission{Outstanding: 1},
		FlowControl: FlowControl{Enabled: true, Queue: flow.Config{TTL: time.Minute, Total: flow.Limits{MaxRequests: 8}}}}
	r := flowEngine(t, cfg, cacheAware).result()
	assert.Positive(t, r.ShedReasons["displaced"], "the noisy flow's newest make room for the others: %v", r.ShedReasons)
	assert.Positive(t, r.ShedReasons["full: total requests"], "%v", r.ShedReasons)
	assert.Zero(t, r.Expired)
	var noisy, quiet Group
	for _, g := range r.Tenants {
		if g.Name == "noisy" {
			noisy = g
		} else {
			quiet.Shed += g.Shed
			quiet.Requests += g.Requests
		}
	}
	assert.Greater(t, float64(noisy.Shed)/float64(noisy.Requests), float64(quiet.Shed)/float64(quiet.Requests),
		"the flood is shed more than the others")
}

// GIE v1.5.0's saturation is the mean over the pool: one idle replica
// beside a saturated one does not open its gate, where the library's
// Admission (some replica has room) would.
func TestGIESaturationIsPoolMean(t *testing.T) {
	for _, tc := range []struct {
		name    string
		waiting []int
		want    float64
	}{
		{"idle", []int{0, 0}, 0},
		{"one saturated, one idle", []int{10, 0}, 1},
		{"both half", []int{2, 3}, 0.5},
		{"both at threshold", []int{5, 5}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Workload: smallTenants(t, 1, 1, TenantsConfig{}), Replicas: len(tc.waiting), Preset: smallPreset()}
			require.NoError(t, cfg.fill())
			e, err := newEngine(&cfg, GIEFlowPolicy())
			require.NoError(t, err)
			for i, n := range tc.waiting {
				for range n {
					e.reps[i].waiting.push(&seq{})
				}
			}
			assert.InDelta(t, tc.want, e.gieSaturation(), 1e-12)
		})
	}
}

// The tenants draw their own stream: the base workload's requests are
// unchanged, the noisy tenant sends about Noisy times each other's, and a
// tenant alone keeps its requests and arrivals.
func TestTenantsWorkload(t *testing.T) {
	const n = 4000
	base, err := SharedPrefix(SharedPrefixConfig{Requests: n, Rate: 100, Groups: 8, SystemTokens: 256, QuestionTokens: 128, OutputTokens: 64})
	require.NoError(t, err)
	w, err := Tenants(TenantsConfig{Base: base, Tenants: 3, Noisy: 5, Classes: []Class{InteractiveClass, BatchClass}})
	require.NoError(t, err)
	only, err := Tenants(TenantsConfig{Base: base, Tenants: 3, Noisy: 5, Classes: []Class{InteractiveClass, BatchClass}, Only: "quiet2"})
	require.NoError(t, err)
	bs, _ := base.Open(7)
	ws, _ := w.Open(7)
	os, _ := only.Open(7)
	count := map[string]int{}
	var b, r, o Request
	for {
		errB, errW := bs.Next(&b), ws.Next(&r)
		if errB == io.EOF {
			require.Equal(t, io.EOF, errW)
			break
		}
		require.NoError(t, errW)
		require.Equal(t, b.Arrival, r.Arrival)
		require.Equal(t, b.Blocks, r.Blocks)
		require.Equal(t, b.OutputTokens, r.OutputTokens)
		count[r.Tenant]++
		count[r.Class]++
		if r.Class == "interactive" {
			assert.Equal(t, 1, r.Priority)
			assert.Equal(t, time.Second, r.SLO)
		}
		if r.Tenant == "quiet2" {
			require.NoError(t, os.Next(&o))
			assert.Equal(t, r.Arrival, o.Arrival)
			assert.Equal(t, r.Blocks, o.Blocks)
		}
	}
	assert.Equal(t, io.EOF, os.Next(&o), "alone: only that tenant's requests")
	assert.InDelta(t, 5.0/7, float64(count["noisy"])/n, 0.03, "%v", count)
	assert.InDelta(t, 1.0/7, float64(count["quiet1"])/n, 0.03, "%v", count)
	assert.InDelta(t, 0.25, float64(count["interactive"])/n, 0.03, "%v", count)
	for _, c := range []TenantsConfig{{Tenants: -1}, {Tenants: MaxGroups + 1}, {Noisy: -1}, {Classes: []Class{{Name: "a", Share: 0}}},
		{Classes: []Class{{Name: "a", Share: 1}, {Name: "a", Share: 1}}}, {Tenants: 2, Only: "nobody"}} {
		c.Base = base
		_, err := Tenants(c)
		assert.ErrorIs(t, err, ErrInvalidConfig, fmt.Sprintf("%+v", c))
	}
}

// TestFlowUsageLimitsErrorDeterministic: of several invalid usage limits
// the error names the lowest priority's, the same every run (it named
// whichever the map's random order gave first).
func TestFlowUsageLimitsErrorDeterministic(t *testing.T) {
	fc := FlowControl{Enabled: true, UsageLimits: map[int]float64{3: 2, -1: 0, 7: math.NaN(), 5: 1.5}}
	for range 32 {
		_, err := Run(Config{Workload: mustShared(t), Replicas: 1, Admission: gateway.Admission{QueueDepth: 1}, FlowControl: fc})
		require.ErrorIs(t, err, ErrInvalidConfig)
		require.Contains(t, err.Error(), "FlowControl.UsageLimits[-1] 0,")
	}
}

package sim

import (
	"bytes"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/examlops/gateway"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// One gateway given explicitly is the default, to the byte; the cmd/exa
// golden files hold the output from before Config.Gateways existed.
func TestGatewaysOneIsDefault(t *testing.T) {
	for _, idx := range []IndexMode{IndexApproximate, IndexExact} {
		cfg := Config{Workload: fixture(t, TraceOptions{}), Replicas: 3, Preset: smallPreset(), Seed: 5, Index: idx}
		a, err := Run(cfg)
		require.NoError(t, err)
		cfg.Gateways = 1
		b, err := Run(cfg)
		require.NoError(t, err)
		ja, jb := reportJSON(t, a), reportJSON(t, b)
		assert.Equal(t, ja, jb)
		assert.NotContains(t, ja, `"gateways"`)
	}
}

// Several gateways: the same seed gives the same report, every policy
// (the reference ones too) runs, the report says how many gateways, and
// another seed draws another split.
func TestGatewaysDeterministic(t *testing.T) {
	for _, idx := range []IndexMode{IndexApproximate, IndexExact} {
		cfg := Config{Workload: fixture(t, TraceOptions{}), Replicas: 3, Preset: smallPreset(), Seed: 5, Index: idx, Gateways: 3}
		a, err := Run(cfg)
		require.NoError(t, err)
		b, err := Run(cfg)
		require.NoError(t, err)
		assert.Equal(t, reportJSON(t, a), reportJSON(t, b))
		assert.Equal(t, 3, a.Gateways)
		var tab bytes.Buffer
		require.NoError(t, a.WriteTable(&tab))
		assert.Contains(t, tab.String(), "3 gateways")
		for _, r := range a.Results {
			assert.Equal(t, r.Requests, r.Completed+r.Dropped+r.Failed, r.Policy)
			assert.EqualValues(t, r.Completed+r.Dropped, r.Router.Routed, "%s: every gateway's decisions are counted", r.Policy)
			var inFlight int
			for _, x := range r.RouterReplicas {
				inFlight += x.InFlight
			}
			assert.Zero(t, inFlight, "%s: every gateway heard of every completion", r.Policy)
		}
	}
}

// Each request goes to one gateway drawn uniformly, the same for every
// seed's policies, and each gateway's share is close to 1/G.
func TestGatewayOfSpread(t *testing.T) {
	const n = 40_000
	for _, g := range []int{1, 2, 4, 7, MaxGateways} {
		counts := make([]int, g)
		for id := uint64(1); id <= n; id++ {
			gi := gatewayOf(9, id, g)
			require.True(t, gi >= 0 && gi < g)
			counts[gi]++
		}
		mean := float64(n) / float64(g)
		sd := math.Sqrt(mean * (1 - 1/float64(g)))
		for i, c := range counts {
			assert.InDelta(t, mean, float64(c), 5*sd+1e-9, "G=%d gateway %d", g, i)
		}
	}
	differ := 0
	for id := uint64(1); id <= 100; id++ {
		if gatewayOf(1, id, 4) != gatewayOf(2, id, 4) {
			differ++
		}
	}
	assert.Greater(t, differ, 50, "another seed draws another split")
	assert.Equal(t, uint64(3), policySeed(3, 0), "the first gateway's policy keeps Config.Seed")
	assert.NotEqual(t, policySeed(3, 1), policySeed(3, 2))
}

// Each gateway routes its own share of a run's requests.
func TestGatewaysShareTraffic(t *testing.T) {
	w, err := NewWorkload("default", 2000, 0)
	require.NoError(t, err)
	cfg := Config{Workload: w, Gateways: 4, Seed: 1, Policies: DefaultPolicies()[2:3]}
	e, st := openEngine(t, cfg, cfg.Policies[0])
	defer st.Close()
	require.NoError(t, e.run(st, func() {}))
	require.Len(t, e.gws, 4)
	for i := range e.gws {
		routed := e.gws[i].g.Stats().Routed
		assert.InDelta(t, 500, float64(routed), 5*math.Sqrt(2000*0.25*0.75), "gateway %d", i)
	}
}

// Two requests for the same prompt, ten seconds apart, through different
// gateways: on the exact index the second gateway knows where the prompt
// is cached (the engine's events reached it), on the approximate index it
// does not (only the first gateway routed it); with one gateway both know.
func TestGatewaysIndexKnowledge(t *testing.T) {
	seed := uint64(1)
	for gatewayOf(seed, 1, 2) == gatewayOf(seed, 2, 2) {
		seed++
	}
	trace := "{\"timestamp\": 0, \"input_length\": 2048, \"output_length\": 4, \"hash_ids\": [1, 2, 3, 4]}\n" +
		"{\"timestamp\": 10000, \"input_length\": 2048, \"output_length\": 4, \"hash_ids\": [1, 2, 3, 4]}\n"
	w, err := TraceBytes("two", []byte(trace), TraceOptions{})
	require.NoError(t, err)
	says := func(g int, idx IndexMode) float64 {
		rep, err := Run(Config{Workload: w, Replicas: 2, Seed: seed, Gateways: g, Index: idx, Policies: DefaultPolicies()[2:3]})
		require.NoError(t, err)
		r := rep.Results[0]
		require.Equal(t, 2, r.Completed)
		assert.InDelta(t, 0.5*2047/2048, r.TokenHitRate, 1e-9, "G=%d %s: the second request finds the prompt cached", g, indexName(idx))
		return r.RouterTokenHitRate
	}
	want := 0.5 * 2047 / 2048
	assert.InDelta(t, want, says(1, IndexApproximate), 1e-9)
	assert.InDelta(t, want, says(2, IndexExact), 1e-9)
	assert.Zero(t, says(2, IndexApproximate), "the second gateway never saw the first request")
}

// On a generated workload whose prompts do not all fit in every replica's
// cache, several gateways on the exact index keep one gateway's hit rate
// (within half a point; measured: within 0.3 over seeds 1..3), while on
// the approximate index each gateway must learn every prefix for itself
// and sends requests where its own index, blind to the others' routing,
// expects a hit that is not there: measured 88.6% at G=1, 81% at G=2 and
// 69% at G=4 (seeds 1..3), so a drop of over 3 points at G=2 and over 10
// at G=4 is asserted.
func TestGatewaysHitRate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 6 simulations of 3000 requests")
	}
	w, err := NewWorkload("default", 3000, 0)
	require.NoError(t, err)
	hit := map[string]float64{}
	for _, idx := range []IndexMode{IndexApproximate, IndexExact} {
		for _, g := range []int{1, 2, 4} {
			rep, err := Run(Config{Workload: w, Seed: 1, Gateways: g, Index: idx, Policies: DefaultPolicies()[2:3]})
			require.NoError(t, err)
			r := rep.Results[0]
			require.Equal(t, 3000, r.Completed)
			k := fmt.Sprintf("%s/%d", indexName(idx), g)
			hit[k] = r.TokenHitRate
			t.Logf("%s: hit %.2f%%, index says %.2f%%, TTFT mean %.0f ms, imbalance %.2f", k, 100*r.TokenHitRate, 100*r.RouterTokenHitRate, 1e3*r.TTFT.Mean, r.Imbalance)
		}
	}
	for _, g := range []string{"2", "4"} {
		assert.InDelta(t, hit["exact/1"], hit["exact/"+g], 0.005, "exact index, %s gateways", g)
	}
	assert.Greater(t, hit["approximate/1"]-hit["approximate/2"], 0.03)
	assert.Greater(t, hit["approximate/1"]-hit["approximate/4"], 0.10)
}

func TestGatewaysConfigErrors(t *testing.T) {
	for _, g := range []int{-1, MaxGateways + 1} {
		_, err := Run(Config{Gateways: g})
		require.ErrorIs(t, err, ErrInvalidConfig)
		assert.Contains(t, err.Error(), fmt.Sprintf("Gateways %d, want 1..%d", g, MaxGateways))
	}
}

func reportJSON(t *testing.T, r *Report) string {
	t.Helper()
	var b strings.Builder
	require.NoError(t, r.WriteJSON(&b))
	return b.String()
}

// Result.Router sums every gateway's Stats, the objective counts too:
// with every request carrying its objectives, each routed request is an
// objective request and each completed one is counted met or missed
// (its TPOT when it has more than one output token).
func TestGatewaysRouterStatsSumObjectives(t *testing.T) {
	w, err := SLOClasses(300, 40, nil)
	require.NoError(t, err)
	cfg := Config{Workload: w, Replicas: 3, Preset: smallPreset(), Seed: 5, Gateways: 3, ObjectiveHeaders: true,
		UpstreamStream: true, Policies: []Policy{{Name: "cache_aware", Mode: gateway.ModeCacheAware}}}
	rep, err := Run(cfg)
	require.NoError(t, err)
	r := rep.Results[0]
	st := r.Router
	require.Positive(t, r.Completed)
	assert.Equal(t, st.Routed, st.ObjectiveRequests, "every routed request asked with its objectives, at every gateway")
	assert.EqualValues(t, r.Completed, st.TTFTMet+st.TTFTMissed, "every completion's TTFT counted, at every gateway")
	st0, err := w.Open(cfg.Seed)
	require.NoError(t, err)
	multi := 0 // completions with a TPOT to measure
	for req := (Request{}); st0.Next(&req) == nil; {
		if req.OutputTokens > 1 {
			multi++
		}
	}
	assert.EqualValues(t, multi, st.TPOTMet+st.TPOTMissed, "every completion's TPOT counted, at every gateway")
	assert.LessOrEqual(t, st.ObjectiveBestEffort, st.ObjectiveRequests)
}

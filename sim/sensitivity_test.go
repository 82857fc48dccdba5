package sim

import (
	"fmt"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/examlops/gateway"
	"github.com/stretchr/testify/require"
)

// TestCacheAwareSensitivity runs cache_aware beside variants on every
// setting of the issue 9 checklist (one gateway, approximate index, seed
// 1): half and twice its Externality and DecodeWeight, and +gauge, which
// replaces its own pending-prefill count with what the engine really has
// queued or running, as of the last refresh (a gauge no engine exports;
// see sharedload_test.go). It logs each setting's mean and p99 TTFT and
// the geometric mean of each variant's ratios to cache_aware: how far the
// loaded-cluster target ("10% below the best peer") is from a change of
// parameter or a better estimate of the queue. Slow: it runs only when
// EXA_TARGETS is set.
//
//	EXA_TARGETS=1 go test ./sim -run TestCacheAwareSensitivity -v -timeout 1h
func TestCacheAwareSensitivity(t *testing.T) {
	if os.Getenv("EXA_TARGETS") == "" {
		t.Skip("set EXA_TARGETS=1 to run")
	}
	old := checkInvariants
	checkInvariants = false
	defer func() { checkInvariants = old }()
	variant := func(name string, p gateway.CacheAware) Policy {
		return Policy{Name: name, New: func(uint64) gateway.Policy { q := p; return &q }}
	}
	pols := []Policy{
		{Name: "cache_aware", Mode: gateway.ModeCacheAware},
		variant("ext 0.5", gateway.CacheAware{Externality: 0.5}),
		variant("ext 2", gateway.CacheAware{Externality: 2}),
		variant("dw 2", gateway.CacheAware{DecodeWeight: 2}),
		variant("dw 8", gateway.CacheAware{DecodeWeight: 8}),
		{Name: "+gauge", New: func(uint64) gateway.Policy { return &sharedLoad{mode: sharedGauge} }},
	}
	var b strings.Builder
	b.WriteString("| workload | replicas | preset |")
	for _, p := range pols {
		fmt.Fprintf(&b, " %s |", p.Name)
	}
	b.WriteString("\n|---|--:|---|" + strings.Repeat("--:|", len(pols)) + "\n")
	logMean, logP99 := make([]float64, len(pols)), make([]float64, len(pols))
	n := 0
	for _, c := range targetCases(t) {
		rep, err := Run(Config{Workload: c.w, Replicas: c.replicas, Preset: MustPreset(c.preset), Seed: 1, Policies: pols})
		require.NoError(t, err)
		base := rep.Results[0]
		fmt.Fprintf(&b, "| %s | %d | %s |", c.name, c.replicas, c.preset)
		for i, r := range rep.Results {
			fmt.Fprintf(&b, " %s / %s |", ms(r.TTFT.Mean), sec(r.TTFT.P99))
			logMean[i] += math.Log(r.TTFT.Mean / base.TTFT.Mean)
			logP99[i] += math.Log(r.TTFT.P99 / base.TTFT.P99)
		}
		b.WriteString("\n")
		n++
	}
	b.WriteString("| geometric mean of the ratios to cache_aware, mean / p99 | | |")
	for i := range pols {
		fmt.Fprintf(&b, " %.3f / %.3f |", math.Exp(logMean[i]/float64(n)), math.Exp(logP99[i]/float64(n)))
	}
	t.Logf("mean / p99 TTFT, one gateway, seed 1\n%s", b.String())
}

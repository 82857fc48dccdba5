package sim

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkMooncake8 replays the whole Mooncake trace through 8 replicas,
// every default policy plus the bounds (target: under 2 s).
//
//	go test ./sim -run '^$' -bench Mooncake8 -benchtime 3x
func BenchmarkMooncake8(b *testing.B) {
	w := mooncake(b)
	fast(b)
	for b.Loop() {
		_, err := Run(Config{Workload: w, Replicas: 8, Seed: 1})
		require.NoError(b, err)
	}
}

// BenchmarkMooncake8Single is BenchmarkMooncake8 for cache_aware alone.
func BenchmarkMooncake8Single(b *testing.B) {
	w := mooncake(b)
	fast(b)
	for b.Loop() {
		_, err := Run(Config{Workload: w, Replicas: 8, Seed: 1, Policies: DefaultPolicies()[2:3]})
		require.NoError(b, err)
	}
}

// BenchmarkMillion simulates one million generated requests (the default
// workload's shape, 8 replicas) through cache_aware alone and through every
// default policy plus the bounds (target: under 60 s).
//
//	go test ./sim -run '^$' -bench Million -benchtime 1x
func BenchmarkMillion(b *testing.B) {
	fast(b)
	w, err := NewWorkload("default", 1_000_000, 40)
	require.NoError(b, err)
	for _, tc := range []struct {
		name string
		pols []Policy
	}{{"cache_aware", DefaultPolicies()[2:3]}, {"all", nil}} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				start := time.Now()
				rep, err := Run(Config{Workload: w, Seed: 1, Policies: tc.pols})
				require.NoError(b, err)
				for _, r := range rep.Results {
					require.Equal(b, 1_000_000, r.Completed+r.Dropped+r.Failed)
				}
				b.ReportMetric(time.Since(start).Seconds(), "s/run")
			}
		})
	}
}

// fast turns off the per-step invariant checks TestMain turns on.
func fast(b *testing.B) {
	checkInvariants = false
	b.Cleanup(func() { checkInvariants = true })
}

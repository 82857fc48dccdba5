package sim

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkMooncake8 replays the whole Mooncake trace through 8 replicas,
// every default policy plus the bounds (target: under 2 s).
func BenchmarkMooncake8(b *testing.B) {
	w := mooncake(b)
	for b.Loop() {
		_, err := Run(Config{Workload: w, Replicas: 8, Seed: 1})
		require.NoError(b, err)
	}
}

// TestMillionRequests simulates one million generated requests (the
// default workload's shape) with every default policy, and reports the wall
// time (target: under 60 s). Skipped with -short.
func TestMillionRequests(t *testing.T) {
	if testing.Short() {
		t.Skip("one million requests")
	}
	checkInvariants = false
	defer func() { checkInvariants = true }()
	w, err := NewWorkload("default", 1_000_000, 40)
	require.NoError(t, err)
	start := time.Now()
	rep, err := Run(Config{Workload: w, Seed: 1})
	require.NoError(t, err)
	t.Logf("1M requests, %d policies + bounds: %v", len(rep.Results), time.Since(start))
	for _, r := range rep.Results {
		require.Equal(t, 1_000_000, r.Completed+r.Dropped+r.Failed)
	}
}

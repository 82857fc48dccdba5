package sim

import (
	"fmt"
	"testing"
)

// manyStats sums up a policy's spread over many replicas: the replicas that
// got no request, the prefill imbalance, and the token hit rate as a share
// of the pooled-LRU bound.
func manyStats(rep *Report, name string) string {
	r, _ := rep.Result(name)
	idle := 0
	for _, x := range r.RequestsPerReplica {
		if x == 0 {
			idle++
		}
	}
	return fmt.Sprintf("%-12s %3d replicas: %2d without requests, imbalance %.2f, token hit %.1f%% = %.1f%% of pooled %.1f%%, TTFT mean %.3fs p99 %.2fs",
		name, len(r.RequestsPerReplica), idle, r.Imbalance, 100*r.TokenHitRate, 100*r.TokenHitRate/rep.PooledLRU.TokenHitRate,
		100*rep.PooledLRU.TokenHitRate, r.TTFT.Mean, r.TTFT.P99)
}

// TestManyReplicasTrace logs, for the shared trace as recorded and with one
// block shared by every request, cache_aware's spread at 32 and 64
// replicas (go test ./sim -run TestManyReplicasTrace -v). Skipped with
// -short or without the trace.
func TestManyReplicasTrace(t *testing.T) {
	if testing.Short() {
		t.Skip("full trace at 32 and 64 replicas")
	}
	w := mooncake(t)
	ls, err := LowSharing(LowSharingConfig{Requests: 1000, Rate: 10})
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := PolicyByName("cache_aware")
	for _, wl := range []Workload{w, sharedFirst{w}, sharedFirst{ls}} {
		for _, n := range []int{32, 64} {
			rep, err := Run(Config{Workload: wl, Replicas: n, Seed: 1, Policies: []Policy{ca}})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %s", wl.Name(), manyStats(rep, "cache_aware"))
		}
	}
}

// TestCHWBLTrace logs CHWBL's figures on the shared trace, as recorded and
// with one block shared by every request, at 8 replicas: keyed on the
// user message the trace decoder infers (go test ./sim -run
// TestCHWBLTrace -v). Skipped with -short or without the trace.
func TestCHWBLTrace(t *testing.T) {
	if testing.Short() {
		t.Skip("full trace")
	}
	w := mooncake(t)
	ch, _ := PolicyByName("chwbl")
	for _, wl := range []Workload{w, sharedFirst{w}} {
		rep, err := Run(Config{Workload: wl, Replicas: 8, Seed: 1, Policies: []Policy{ch}})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s", wl.Name(), manyStats(rep, "chwbl"))
	}
}

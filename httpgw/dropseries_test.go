package httpgw

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/internal/fronttest"
)

// TestReloadDropsRemovedReplicaSeries: a reload that removes a replica
// (a pod gone) deletes its exa_gateway_replica_requests_total series, so
// replicas that come and go do not grow /metrics; a kept replica keeps
// its count.
func TestReloadDropsRemovedReplicaSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, err := New(Options{Registerer: reg, Gatherer: reg, Logger: quietLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	apply := func(names ...string) {
		var reps []config.Replica
		for i, n := range names {
			reps = append(reps, config.Replica{Name: n, Address: "127.0.0.1:" + string(rune('1'+i))})
		}
		require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {Mode: gateway.ModeRoundRobin, Replicas: reps}}}))
	}
	apply("kept", "gone")
	s.metrics.ReplicaReqs.WithLabelValues(testModel, "kept").Add(3)
	s.metrics.ReplicaReqs.WithLabelValues(testModel, "gone").Add(2)
	count := func(replica string) float64 {
		return fronttest.Counter(t, reg, "exa_gateway_replica_requests_total", map[string]string{"model": testModel, "replica": replica})
	}
	require.Equal(t, 2.0, count("gone"))
	apply("kept")
	assert.Zero(t, count("gone"), "the removed replica's series")
	assert.Equal(t, 3.0, count("kept"), "the kept replica's count")
	n, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range n {
		if mf.GetName() == "exa_gateway_replica_requests_total" {
			assert.Len(t, mf.GetMetric(), 1, "one series left")
		}
	}
}

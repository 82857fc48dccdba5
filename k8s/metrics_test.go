package k8s

import (
	"strings"
	"testing"
	"time"

	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

func TestPoolCollector(t *testing.T) {
	now := time.Unix(1000, 0)
	st := fleet.Stats{StatsDocument: config.StatsDocument{Models: map[string]config.RoutingStats{
		"m": {Requests: 7, Replicas: []config.ReplicaStats{{Name: "a", InFlight: 2}, {Name: "b", InFlight: 1}}},
	}}, Engines: []fleet.EngineStats{
		{Address: "http://10.0.0.1:8000", Load: &fleet.EngineLoad{Waiting: 4, Running: 2, KVUtilization: 0.5}, LoadAt: now.Add(-2 * time.Second)},
		{Address: "http://10.0.0.2:8000", Load: &fleet.EngineLoad{Waiting: 0, Running: 4, KVUtilization: 0.25}, LoadAt: now},
		{Address: "http://10.0.0.3:8000"}, // not scraped yet: left out of the averages
		// Scraped past the staleness threshold: left out, as GIE does
		// (PodsWithFreshMetrics).
		{Address: "http://10.0.0.4:8000", Load: &fleet.EngineLoad{Waiting: 50, Running: 50, KVUtilization: 1}, LoadAt: now.Add(-2*time.Second - 1)},
		{Address: "http://10.9.9.9:8000", Load: &fleet.EngineLoad{Waiting: 100}, LoadAt: now}, // not in the pool
	}}
	c := &PoolCollector{pool: "p", stats: func() fleet.Stats { return st }, staleness: DefaultMetricsStaleness, now: func() time.Time { return now },
		reps: func() []string {
			return []string{"http://10.0.0.1:8000", "http://10.0.0.1:8001", "http://10.0.0.2:8000", "http://10.0.0.3:8000", "http://10.0.0.4:8000"}
		}}
	want := `
# HELP inference_objective_request_total Counter of inference objective requests broken out for each model and target model (GIE's metric; requests routed, no rewrite: target = model, priority 0).
# TYPE inference_objective_request_total counter
inference_objective_request_total{model_name="m",priority="0",target_model_name="m"} 7
# HELP inference_objective_running_requests Inference objective number of running requests in each model (GIE's metric; requests routed and not ended).
# TYPE inference_objective_running_requests gauge
inference_objective_running_requests{model_name="m"} 3
# HELP inference_pool_average_kv_cache_utilization The average kv cache utilization for an inference server pool (GIE's metric; over the pool's engines with fresh metrics).
# TYPE inference_pool_average_kv_cache_utilization gauge
inference_pool_average_kv_cache_utilization{name="p"} 0.375
# HELP inference_pool_average_queue_size The average number of requests pending in the model server queue (GIE's metric; vllm:num_requests_waiting).
# TYPE inference_pool_average_queue_size gauge
inference_pool_average_queue_size{name="p"} 2
# HELP inference_pool_average_running_requests The average number of running requests across model servers in the pool (GIE's metric; vllm:num_requests_running).
# TYPE inference_pool_average_running_requests gauge
inference_pool_average_running_requests{name="p"} 3
# HELP inference_pool_ready_pods The number of ready pods in the inference server pool (GIE's metric; pods discovered ready).
# TYPE inference_pool_ready_pods gauge
inference_pool_ready_pods{name="p"} 4
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want)))
	// No engine scraped: the averages are absent, the pod count is not.
	st.Engines = nil
	n, err := testutil.GatherAndCount(registryOf(t, c))
	require.NoError(t, err)
	require.Equal(t, 3, n) // ready_pods, request_total, running_requests
}

func registryOf(t *testing.T, c *PoolCollector) *prometheus.Registry {
	r := prometheus.NewRegistry()
	require.NoError(t, r.Register(c))
	return r
}

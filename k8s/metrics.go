package k8s

import (
	"net/url"
	"time"

	"github.com/examlops/gateway/fleet"
	"github.com/prometheus/client_golang/prometheus"
)

// GIE's metric names (v1.5.0 pkg/epp/metrics/metrics.go) that
// [PoolCollector] exports where this gateway knows the same quantity, so
// GIE's dashboards show data.
var (
	descReadyPods = prometheus.NewDesc("inference_pool_ready_pods",
		"The number of ready pods in the inference server pool (GIE's metric; pods discovered ready).", []string{"name"}, nil)
	descAvgKV = prometheus.NewDesc("inference_pool_average_kv_cache_utilization",
		"The average kv cache utilization for an inference server pool (GIE's metric; over the pool's engines with fresh metrics).", []string{"name"}, nil)
	descAvgQueue = prometheus.NewDesc("inference_pool_average_queue_size",
		"The average number of requests pending in the model server queue (GIE's metric; vllm:num_requests_waiting).", []string{"name"}, nil)
	descAvgRunning = prometheus.NewDesc("inference_pool_average_running_requests",
		"The average number of running requests across model servers in the pool (GIE's metric; vllm:num_requests_running).", []string{"name"}, nil)
	descObjRequests = prometheus.NewDesc("inference_objective_request_total",
		"Counter of inference objective requests broken out for each model and target model (GIE's metric; requests routed, no rewrite: target = model, priority 0).",
		[]string{"model_name", "target_model_name", "priority"}, nil)
	descObjRunning = prometheus.NewDesc("inference_objective_running_requests",
		"Inference objective number of running requests in each model (GIE's metric; requests routed and not ended).", []string{"model_name"}, nil)
)

// PoolCollector exports GIE's inference_pool_* and inference_objective_*
// series for a discovered pool, computed at scrape time from the gateway's
// statistics and the discovery's replicas: no cost on the request path.
// Pool averages are over the pool's engines whose load was scraped within
// the staleness threshold, as GIE's are (--metrics-staleness-threshold,
// v1.5.0 pkg/epp/backend/metrics/logger.go refreshPrometheusMetrics);
// with none they are not exported. Safe for concurrent use.
type PoolCollector struct {
	pool      string
	stats     func() fleet.Stats
	reps      func() []string // addresses of the discovered replicas
	staleness time.Duration
	now       func() time.Time
}

// DefaultMetricsStaleness is GIE's default --metrics-staleness-threshold
// (v1.5.0 pkg/epp/server/options.go).
const DefaultMetricsStaleness = 2 * time.Second

var _ prometheus.Collector = (*PoolCollector)(nil)

// NewPoolCollector returns the collector of pool (its name label), reading
// stats and the discovery d's replicas; its averages count the engines
// scraped within staleness (0: DefaultMetricsStaleness).
func NewPoolCollector(pool string, stats func() fleet.Stats, d *Discovery, staleness time.Duration) *PoolCollector {
	if staleness <= 0 {
		staleness = DefaultMetricsStaleness
	}
	return &PoolCollector{pool: pool, stats: stats, staleness: staleness, now: time.Now, reps: func() []string {
		var out []string
		for _, r := range d.Replicas() {
			out = append(out, r.Address)
		}
		return out
	}}
}

// Describe sends the descriptors of the series.
func (c *PoolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descReadyPods, descAvgKV, descAvgQueue, descAvgRunning, descObjRequests, descObjRunning} {
		ch <- d
	}
}

// Collect sends the series' current values.
func (c *PoolCollector) Collect(ch chan<- prometheus.Metric) {
	addrs := c.reps()
	pods := map[string]bool{} // a pod with several target ports counts once
	inPool := map[string]bool{}
	for _, a := range addrs {
		inPool[fleet.NormalizeAddress(a)] = true
		if u, err := url.Parse(a); err == nil {
			pods[u.Hostname()] = true
		}
	}
	ch <- prometheus.MustNewConstMetric(descReadyPods, prometheus.GaugeValue, float64(len(pods)), c.pool)
	st := c.stats()
	now := c.now()
	var n, kv, waiting, running float64
	for _, e := range st.Engines {
		if !inPool[e.Address] || e.Load == nil || now.Sub(e.LoadAt) > c.staleness {
			continue
		}
		n++
		kv += e.Load.KVUtilization
		waiting += float64(e.Load.Waiting)
		running += float64(e.Load.Running)
	}
	if n > 0 {
		ch <- prometheus.MustNewConstMetric(descAvgKV, prometheus.GaugeValue, kv/n, c.pool)
		ch <- prometheus.MustNewConstMetric(descAvgQueue, prometheus.GaugeValue, waiting/n, c.pool)
		ch <- prometheus.MustNewConstMetric(descAvgRunning, prometheus.GaugeValue, running/n, c.pool)
	}
	for name, m := range st.Models {
		ch <- prometheus.MustNewConstMetric(descObjRequests, prometheus.CounterValue, float64(m.Requests), name, name, "0")
		inflight := 0
		for _, r := range m.Replicas {
			inflight += r.InFlight
		}
		ch <- prometheus.MustNewConstMetric(descObjRunning, prometheus.GaugeValue, float64(inflight), name)
	}
}

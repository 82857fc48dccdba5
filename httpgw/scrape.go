package httpgw

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"

	"github.com/examlops/gateway"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Engine metric names read from each engine's /metrics (vLLM's names; the
// llm-d inference simulator uses the same).
const (
	metricWaiting    = "vllm:num_requests_waiting"
	metricRunning    = "vllm:num_requests_running"
	metricKVUsage    = "vllm:kv_cache_usage_perc"
	metricKVUsageOld = "vllm:gpu_cache_usage_perc"
)

// ErrScrape reports an engine /metrics page that could not be fetched or
// parsed.
var ErrScrape = errors.New("gateway: scrape engine metrics")

// maxMetricsBytes bounds the /metrics page read from an engine.
const maxMetricsBytes = 8 << 20

// ParseEngineMetrics parses a Prometheus text exposition, as vLLM serves
// it at /metrics, into a gateway.Load: QueueDepth is the sum of
// vllm:num_requests_waiting over its series (one per model_name),
// Running the sum of vllm:num_requests_running, KVUtilization the largest
// vllm:kv_cache_usage_perc (or, from older vLLM versions,
// vllm:gpu_cache_usage_perc), clamped to 0..1. Missing metrics read as
// zero; Latency is left zero so the gateway keeps its own measurement.
// Counts are clamped to 0..MaxLoadCount. A page that does not parse is an
// error wrapping ErrScrape.
func ParseEngineMetrics(r io.Reader) (gateway.Load, error) {
	l, err := parseEngineMetrics(r)
	if err != nil {
		return gateway.Load{}, fmt.Errorf("%w: %v", ErrScrape, err)
	}
	return l, nil
}

// MaxLoadCount is the largest request count ParseEngineMetrics reports;
// larger (or absurd) values are clamped to it, so that they cannot wrap
// around to a negative or small count and make a busy engine look idle.
const MaxLoadCount = 1 << 30

// parseEngineMetrics is ParseEngineMetrics with the parser's error as is.
func parseEngineMetrics(r io.Reader) (gateway.Load, error) {
	l, _, err := parseEngineScrape(r)
	return l, err
}

// parseEngineScrape parses an engine's /metrics page into its load and,
// when it exposes vllm:lora_requests_info, its adapter report (else nil;
// see parseLoRAInfo).
func parseEngineScrape(r io.Reader) (gateway.Load, *gateway.AdapterReport, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return gateway.Load{}, nil, err
	}
	var rep *gateway.AdapterReport
	if a, ok := parseLoRAInfo(fams[metricLoRAInfo]); ok {
		rep = &a
	}
	var l gateway.Load
	l.QueueDepth = loadCount(sumFamily(fams[metricWaiting]))
	l.Running = loadCount(sumFamily(fams[metricRunning]))
	kv, ok := maxFamily(fams[metricKVUsage])
	if !ok {
		kv, _ = maxFamily(fams[metricKVUsageOld])
	}
	l.KVUtilization = min(max(kv, 0), 1)
	return l, rep, nil
}

// loadCount rounds a scraped count and clamps it to 0..MaxLoadCount
// before converting it, so no float is out of int's range.
func loadCount(v float64) int {
	return int(math.Round(min(max(v, 0), MaxLoadCount)))
}

// sampleValue returns the value of a gauge, counter or untyped sample; NaN
// and infinities read as zero.
func sampleValue(m *dto.Metric) float64 {
	var v float64
	switch {
	case m.GetGauge() != nil:
		v = m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		v = m.GetCounter().GetValue()
	case m.GetUntyped() != nil:
		v = m.GetUntyped().GetValue()
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}

func sumFamily(f *dto.MetricFamily) float64 {
	var s float64
	for _, m := range f.GetMetric() {
		s += sampleValue(m)
	}
	return s
}

func maxFamily(f *dto.MetricFamily) (float64, bool) {
	if len(f.GetMetric()) == 0 {
		return 0, false
	}
	best := math.Inf(-1)
	for _, m := range f.GetMetric() {
		best = max(best, sampleValue(m))
	}
	return best, true
}

// scrape fetches and parses one engine's /metrics: its load and its
// adapter report (nil when it exposes none).
func scrape(ctx context.Context, client *http.Client, base string) (gateway.Load, *gateway.AdapterReport, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return gateway.Load{}, nil, fmt.Errorf("%w: %s: %v", ErrScrape, base, err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := client.Do(req)
	if err != nil {
		return gateway.Load{}, nil, fmt.Errorf("%w: %s: %v", ErrScrape, base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return gateway.Load{}, nil, fmt.Errorf("%w: %s: status %d", ErrScrape, base, resp.StatusCode)
	}
	l, rep, err := parseEngineScrape(io.LimitReader(resp.Body, maxMetricsBytes))
	if err != nil {
		return gateway.Load{}, nil, fmt.Errorf("%w: %s: parse: %v", ErrScrape, base, err)
	}
	return l, rep, nil
}

package fleet

import (
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
)

// series selects the samples of one metric family, those that carry
// every label given with its value; as in a Prometheus selector, a label
// given with the value "" selects the samples without it too.
type series struct {
	family string
	labels []labelValue
}

// labelValue is one label a selected sample must carry, with its value.
type labelValue struct{ name, value string }

// String writes the series as a Prometheus selector, family{l="v",...}.
func (s series) String() string {
	if len(s.labels) == 0 {
		return s.family
	}
	var b strings.Builder
	b.WriteString(s.family + "{")
	for i, l := range s.labels {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(l.name + "=" + strconv.Quote(l.value))
	}
	b.WriteString("}")
	return b.String()
}

// engineSeries are the load series of one engine type: names from GIE's
// model-server protocol table (gateway-api-inference-extension,
// docs/proposals/003-model-server-protocol/README.md, the "vLLM",
// "Triton TensorRT-LLM" and "SGLang" columns).
type engineSeries struct {
	engine           string
	waiting, running series
	// kv lists KV-cache usage series, the first present used.
	kv []series
}

// engineNames lists the engine types in autodetection order (vLLM, the
// default, first).
var engineNames = []engineSeries{
	{engine: config.EngineVLLM,
		waiting: series{family: "vllm:num_requests_waiting"},
		running: series{family: "vllm:num_requests_running"},
		kv:      []series{{family: "vllm:kv_cache_usage_perc"}, {family: "vllm:gpu_cache_usage_perc"}}},
	// SGLang with priority scheduling writes each count as a total,
	// priority="", and its breakdown by priority="N" (sglang
	// python/sglang/srt/observability/metrics_collector.py,
	// _log_gauge_queue_count): the totals are read.
	{engine: config.EngineSGLang,
		waiting: series{family: "sglang:num_queue_reqs", labels: []labelValue{{"priority", ""}}},
		running: series{family: "sglang:num_running_reqs", labels: []labelValue{{"priority", ""}}},
		kv:      []series{{family: "sglang:token_usage"}}},
	{engine: config.EngineTRTLLM,
		waiting: series{family: "nv_trt_llm_request_metrics", labels: []labelValue{{"request_type", "waiting"}}},
		running: series{family: "nv_trt_llm_request_metrics", labels: []labelValue{{"request_type", "scheduled"}}},
		kv:      []series{{family: "nv_trt_llm_kv_cache_block_metrics", labels: []labelValue{{"kv_cache_block_type", "fraction"}}}}},
}

// present reports whether the page has any of the type's load series.
func (n *engineSeries) present(fams map[string]*dto.MetricFamily) bool {
	if n.waiting.has(fams) || n.running.has(fams) {
		return true
	}
	for _, k := range n.kv {
		if k.has(fams) {
			return true
		}
	}
	return false
}

// load reads the type's load from the page.
func (n *engineSeries) load(fams map[string]*dto.MetricFamily) gateway.Load {
	var l gateway.Load
	l.QueueDepth = loadCount(n.waiting.sum(fams))
	l.Running = loadCount(n.running.sum(fams))
	for _, k := range n.kv {
		if v, ok := k.max(fams); ok {
			l.KVUtilization = min(max(v, 0), 1)
			break
		}
	}
	return l
}

// match reports whether sample m is one of the selected series.
func (s series) match(m *dto.Metric) bool {
	for _, want := range s.labels {
		found := want.value == "" // absent reads as ""
		for _, lp := range m.GetLabel() {
			if lp.GetName() == want.name {
				found = lp.GetValue() == want.value
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// only returns f with only the selected samples (f itself when the
// series selects every sample); nil when f is nil.
func (s series) only(f *dto.MetricFamily) *dto.MetricFamily {
	if f == nil || len(s.labels) == 0 {
		return f
	}
	g := &dto.MetricFamily{Name: f.Name, Type: f.Type}
	for _, m := range f.GetMetric() {
		if s.match(m) {
			g.Metric = append(g.Metric, m)
		}
	}
	return g
}

func (s series) has(fams map[string]*dto.MetricFamily) bool {
	for _, m := range fams[s.family].GetMetric() {
		if s.match(m) {
			return true
		}
	}
	return false
}

func (s series) sum(fams map[string]*dto.MetricFamily) float64 {
	var t float64
	for _, m := range fams[s.family].GetMetric() {
		if s.match(m) {
			t += sampleValue(m)
		}
	}
	return t
}

// max returns the largest selected sample, false with none.
func (s series) max(fams map[string]*dto.MetricFamily) (float64, bool) {
	best, ok := 0.0, false
	for _, m := range fams[s.family].GetMetric() {
		if s.match(m) {
			v := sampleValue(m)
			if !ok || v > best {
				best = v
			}
			ok = true
		}
	}
	return best, ok
}

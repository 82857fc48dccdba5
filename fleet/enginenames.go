package fleet

import (
	dto "github.com/prometheus/client_model/go"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
)

// series selects the samples of one metric family, those whose label
// (when not "") has the value given.
type series struct {
	family, label, value string
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
	{engine: config.EngineSGLang,
		waiting: series{family: "sglang:num_queue_reqs"},
		running: series{family: "sglang:num_running_reqs"},
		kv:      []series{{family: "sglang:token_usage"}}},
	{engine: config.EngineTRTLLM,
		waiting: series{family: "nv_trt_llm_request_metrics", label: "request_type", value: "waiting"},
		running: series{family: "nv_trt_llm_request_metrics", label: "request_type", value: "scheduled"},
		kv:      []series{{family: "nv_trt_llm_kv_cache_block_metrics", label: "kv_cache_block_type", value: "fraction"}}},
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
	if s.label == "" {
		return true
	}
	for _, lp := range m.GetLabel() {
		if lp.GetName() == s.label {
			return lp.GetValue() == s.value
		}
	}
	return false
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

package fleet

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/examlops/gateway/config"
)

// EngineCustom is the engine type /stats shows for an engine read with
// Options.EngineMetrics' names.
const EngineCustom = "custom"

// EngineMetrics names what the fleet reads from the engines' metrics
// pages in place of autodetection: the metric flags of GIE's endpoint
// picker (v1.5.0 pkg/epp/server/options.go: --total-queued-requests-metric,
// --total-running-requests-metric, --kv-cache-usage-percentage-metric,
// --lora-info-metric, --cache-info-metric, --model-server-metrics-path,
// --model-server-metrics-port), which GIE's InferencePool chart sets for
// SGLang and trtllm-serve pools. The zero value reads nothing; see
// DefaultEngineMetrics for GIE's defaults (vLLM's names).
type EngineMetrics struct {
	// Queued, Running and KVUsage are the waiting-request count, the
	// running-request count and the KV-cache usage (0..1), each a metric
	// spec in GIE's form: "name" or "name{label=value,...}" (see
	// ParseMetricSpec). The samples matching a spec are summed (counts)
	// or the largest taken (usage); "" reads zero. SGLang's count
	// families named without labels read their totals, not their
	// breakdown by priority (as ParseEngineMetricsFor does).
	Queued, Running, KVUsage string
	// LoRAInfo is the series of vLLM's LoRA info form (labels
	// max_lora, running_lora_adapters, waiting_lora_adapters); "" reads
	// no adapter report from the page (GET /v1/models still lists them).
	LoRAInfo string
	// CacheInfo is the info series whose labels give the KV-cache size:
	// num_pages and page_size for sglang:cache_config_info, else vLLM's
	// num_gpu_blocks and block_size (as GIE's picker reads any name); ""
	// reads no size (the capacity then comes from the configuration).
	CacheInfo string
	// Path is the metrics page's path; "" means "/metrics".
	Path string
	// Port, when not 0, is the port scraped instead of the engine's own.
	Port int
}

// DefaultEngineMetrics returns GIE's defaults of its metric flags: vLLM's
// names, at /metrics on the engine's port.
func DefaultEngineMetrics() EngineMetrics {
	return EngineMetrics{Queued: "vllm:num_requests_waiting", Running: "vllm:num_requests_running",
		KVUsage: "vllm:kv_cache_usage_perc", LoRAInfo: metricLoRAInfo, CacheInfo: "vllm:cache_config_info", Path: "/metrics"}
}

// customNames is EngineMetrics parsed.
type customNames struct {
	load      engineSeries
	lora      *series    // nil: none read
	cache     *cacheInfo // nil: none read
	path      string
	port      int
	described string
	// fams: the families a scrape keeps of its page (pageFamilies).
	fams familySet
}

// compile parses m; the error names the field and its value.
func (m EngineMetrics) compile() (*customNames, error) {
	c := &customNames{load: engineSeries{engine: EngineCustom}, path: m.Path, port: m.Port}
	if c.path == "" {
		c.path = "/metrics"
	}
	if !strings.HasPrefix(c.path, "/") || strings.ContainsAny(c.path, "?# \t\r\n") {
		return nil, fmt.Errorf("invalid metrics path %q: want an absolute path, no query", m.Path)
	}
	if m.Port < 0 || m.Port > 65535 {
		return nil, fmt.Errorf("invalid metrics port %d: want 0-65535", m.Port)
	}
	var specs [5]MetricSpec
	for i, f := range [...]struct{ name, spec string }{{"queued", m.Queued}, {"running", m.Running},
		{"kv usage", m.KVUsage}, {"lora info", m.LoRAInfo}, {"cache info", m.CacheInfo}} {
		s, err := ParseMetricSpec(f.spec)
		if err != nil {
			return nil, fmt.Errorf("%s metric: %w", f.name, err)
		}
		specs[i] = s
	}
	c.load.waiting, c.load.running = totalsOf(specs[0].series()), totalsOf(specs[1].series())
	if specs[2].Family != "" {
		c.load.kv = []series{specs[2].series()}
	}
	if specs[3].Family != "" {
		ls := specs[3].series()
		c.lora = &ls
	}
	if ci := specs[4]; ci.Family != "" {
		c.cache = &cacheInfo{family: ci.Family, blocks: "num_gpu_blocks", blockSize: "block_size", labels: ci.series().labels}
		for _, known := range cacheInfos {
			if known.family == ci.Family {
				c.cache.blocks, c.cache.blockSize = known.blocks, known.blockSize
			}
		}
	}
	c.described = fmt.Sprintf("queued %s, running %s, kv %s at %s", describe(c.load.waiting), describe(c.load.running), describeKV(c.load.kv), c.path)
	names := append(defaultFamilyNames(), c.load.waiting.family, c.load.running.family)
	for _, k := range c.load.kv {
		names = append(names, k.family)
	}
	if c.lora != nil {
		names = append(names, c.lora.family)
	}
	if c.cache != nil {
		names = append(names, c.cache.family)
	}
	c.fams = newFamilySet(names...)
	return c, nil
}

func describe(s series) string {
	if s.family == "" {
		return "none"
	}
	return s.String()
}

func describeKV(kv []series) string {
	if len(kv) == 0 {
		return "none"
	}
	return kv[0].String()
}

// metricsURL returns the URL of the metrics page of the engine at base
// (scheme://host:port).
func (c *customNames) metricsURL(base string) string {
	if c == nil {
		return base + "/metrics"
	}
	if c.port != 0 {
		if u, err := url.Parse(base); err == nil && u.Host != "" {
			u.Host = net.JoinHostPort(u.Hostname(), strconv.Itoa(c.port))
			base = u.String()
		}
	}
	return base + c.path
}

// MetricSpec is one metric specification of GIE's endpoint picker: a
// family name and the labels a sample must carry.
type MetricSpec struct {
	// Family is the metric family's name; "" for the empty spec.
	Family string
	// Labels are name=value pairs, in the order written.
	Labels [][2]string
}

// maxSpecBytes bounds a metric spec's length.
const maxSpecBytes = 1024

// ParseMetricSpec parses a metric specification as GIE's endpoint picker
// writes it (v1.5.0 pkg/epp/backend/metrics/metrics_spec.go): "name",
// "name{label=value}" or "name{l1=v1,l2=v2}", spaces around the parts
// ignored, label values unquoted. One pair of double quotes around the
// whole spec, or around a label value, is removed: GIE's chart writes
// --total-queued-requests-metric="sglang:num_queue_reqs" as a YAML plain
// scalar, so the quotes reach the program. "" (or "\"\"") is the empty
// spec: nothing read. Anything else (an unclosed brace, text after it, a
// pair without "=", an empty name or value, a spec over 1,024 bytes) is
// an error naming the spec.
func ParseMetricSpec(spec string) (MetricSpec, error) {
	if len(spec) > maxSpecBytes {
		return MetricSpec{}, fmt.Errorf("invalid metric spec %.40q...: longer than %d bytes", spec, maxSpecBytes)
	}
	s := unquote(strings.TrimSpace(spec))
	if s == "" {
		return MetricSpec{}, nil
	}
	var ms MetricSpec
	name := s
	if open, close := strings.IndexByte(s, '{'), strings.IndexByte(s, '}'); open >= 0 || close >= 0 {
		if open < 0 || close < open+2 {
			return MetricSpec{}, fmt.Errorf("invalid metric spec %q: missing or malformed label block", spec)
		}
		if close != len(s)-1 {
			return MetricSpec{}, fmt.Errorf("invalid metric spec %q: text after the label block", spec)
		}
		name = s[:open]
		for _, pair := range strings.Split(s[open+1:close], ",") {
			k, v, ok := strings.Cut(pair, "=")
			k, v = strings.TrimSpace(k), unquote(strings.TrimSpace(v))
			if !ok || strings.Contains(v, "=") || k == "" || v == "" {
				return MetricSpec{}, fmt.Errorf("invalid metric spec %q: label pair %q: want name=value", spec, strings.TrimSpace(pair))
			}
			ms.Labels = append(ms.Labels, [2]string{k, v})
		}
	}
	ms.Family = strings.TrimSpace(name)
	if ms.Family == "" || strings.ContainsAny(ms.Family, " \t\r\n\"") {
		return MetricSpec{}, fmt.Errorf("invalid metric spec %q: want a metric name", spec)
	}
	return ms, nil
}

// unquote removes one pair of double quotes around s.
func unquote(s string) string {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		return s[1 : len(s)-1]
	}
	return s
}

// totalsOf returns s, selecting the totals only (engineNames' labels)
// when it names, with no label of its own, a count family that also
// holds a breakdown of them: SGLang's, by priority.
func totalsOf(s series) series {
	for _, n := range engineNames {
		if n.engine != config.EngineSGLang || len(s.labels) > 0 {
			continue
		}
		for _, known := range []series{n.waiting, n.running} {
			if s.family == known.family {
				s.labels = known.labels
			}
		}
	}
	return s
}

// series returns the selection the spec makes.
func (m MetricSpec) series() series {
	s := series{family: m.Family}
	for _, l := range m.Labels {
		s.labels = append(s.labels, labelValue{l[0], l[1]})
	}
	return s
}

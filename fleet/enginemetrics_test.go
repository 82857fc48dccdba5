package fleet

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/internal/budget"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// GIE's metric specs parse as its picker parses them, with the quotes
// GIE's chart leaves in (a YAML plain scalar --flag="name") removed; bad
// specs are errors naming the spec.
func TestParseMetricSpec(t *testing.T) {
	for _, tt := range []struct {
		spec string
		want MetricSpec
		err  string
	}{
		{spec: "", want: MetricSpec{}},
		{spec: `""`, want: MetricSpec{}},
		{spec: "vllm:num_requests_waiting", want: MetricSpec{Family: "vllm:num_requests_waiting"}},
		{spec: `"sglang:num_queue_reqs"`, want: MetricSpec{Family: "sglang:num_queue_reqs"}},
		{spec: "nv_trt_llm_request_metrics{request_type=waiting}", want: MetricSpec{Family: "nv_trt_llm_request_metrics", Labels: [][2]string{{"request_type", "waiting"}}}},
		{spec: ` m { a = "1" , b=2 } `, want: MetricSpec{Family: "m", Labels: [][2]string{{"a", "1"}, {"b", "2"}}}},
		{spec: "m{a=1", err: `invalid metric spec "m{a=1": missing or malformed label block`},
		{spec: "m{}", err: `missing or malformed label block`},
		{spec: "m{a=1}x", err: `invalid metric spec "m{a=1}x": text after the label block`},
		{spec: "m{a}", err: `label pair "a": want name=value`},
		{spec: "m{a=}", err: `label pair "a=": want name=value`},
		{spec: "m{a=1=2}", err: `label pair "a=1=2": want name=value`},
		{spec: "{a=1}", err: `invalid metric spec "{a=1}": want a metric name`},
		{spec: `"a" b`, err: `want a metric name`},
		{spec: strings.Repeat("m", 1025), err: `longer than 1024 bytes`},
	} {
		t.Run(tt.spec, func(t *testing.T) {
			got, err := ParseMetricSpec(tt.spec)
			if tt.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// FuzzParseMetricSpec: any spec parses or fails without panicking; a
// parsed one names a family (or is empty) and its series, written back
// in GIE's form, parses to the same spec.
func FuzzParseMetricSpec(f *testing.F) {
	for _, s := range []string{"", `"sglang:num_queue_reqs"`, "nv_trt_llm_request_metrics{request_type=waiting}", "m{a=1,b=2}", "m{", "}{", `"`, "m{a=\"\"}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		ms, err := ParseMetricSpec(spec)
		if err != nil {
			return
		}
		if ms.Family == "" {
			if len(ms.Labels) != 0 {
				t.Fatalf("%q: labels without a family", spec)
			}
			return
		}
		var b strings.Builder
		b.WriteString(ms.Family)
		if len(ms.Labels) > 0 {
			b.WriteByte('{')
			for i, l := range ms.Labels {
				if i > 0 {
					b.WriteByte(',')
				}
				b.WriteString(l[0] + "=" + l[1])
			}
			b.WriteByte('}')
		}
		again, err := ParseMetricSpec(b.String())
		if err == nil && again.Family != ms.Family {
			t.Fatalf("%q: family %q, written %q, reparsed %q", spec, ms.Family, b.String(), again.Family)
		}
	})
}

// GIE's chart (v1.5.0) sets these for sglang and trtllm-serve pools.
var (
	sglangFlags = EngineMetrics{Queued: `"sglang:num_queue_reqs"`, Running: `"sglang:num_running_reqs"`,
		KVUsage: `"sglang:token_usage"`, CacheInfo: `"sglang:cache_config_info"`, LoRAInfo: "vllm:lora_requests_info"}
	trtllmServeFlags = EngineMetrics{Queued: `"trtllm_num_requests_waiting"`, Running: `"trtllm_num_requests_running"`,
		KVUsage: `"trtllm_kv_cache_utilization"`, CacheInfo: `"trtllm_cache_config_info"`, Path: `/prometheus/metrics`}
	tritonFlags = EngineMetrics{Queued: "nv_trt_llm_request_metrics{request_type=waiting}",
		Running: "nv_trt_llm_request_metrics{request_type=scheduled}", KVUsage: "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}"}
)

// trtllmServePage is written from the names GIE's chart and extractor
// (v1.5.0) give trtllm-serve, not captured from a running engine.
const trtllmServePage = `# TYPE trtllm_num_requests_waiting gauge
trtllm_num_requests_waiting{model_name="m"} 5
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{model_name="m"} 2
# TYPE trtllm_kv_cache_utilization gauge
trtllm_kv_cache_utilization{model_name="m"} 0.25
# TYPE trtllm_cache_config_info gauge
trtllm_cache_config_info{block_size="32",num_gpu_blocks="1000"} 1
`

// With EngineMetrics, an engine's page is read with the names given, at
// the path and port given: SGLang's and trtllm-serve's as GIE's chart
// names them, Triton's with labels. Autodetection does not know
// trtllm-serve's names (the load would read as zero).
func TestEngineMetricsScrape(t *testing.T) {
	sglang, err := os.ReadFile("testdata/metrics/sglang-style.txt")
	require.NoError(t, err)
	trtllm, err := os.ReadFile("testdata/metrics/trtllm-style.txt")
	require.NoError(t, err)
	for _, tt := range []struct {
		name, path, page string
		names            EngineMetrics
		want             gateway.Load
		kvTokens         int64
	}{
		{"sglang", "/metrics", string(sglang), sglangFlags, gateway.Load{QueueDepth: 4, Running: 14, KVUtilization: 0.42}, 0},
		{"trtllm-serve", "/prometheus/metrics", trtllmServePage, trtllmServeFlags, gateway.Load{QueueDepth: 5, Running: 2, KVUtilization: 0.25}, 32000},
		{"triton", "/metrics", string(trtllm), tritonFlags, mustParse(t, string(trtllm)), 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var asked []string
			srv := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				asked = append(asked, r.URL.Path)
				_, _ = w.Write([]byte(tt.page))
			}))
			c, err := tt.names.compile()
			require.NoError(t, err)
			// The engine's serving port is elsewhere; the page is scraped on
			// EngineMetrics.Port.
			u, _ := url.Parse(srv.URL)
			_, port, _ := net.SplitHostPort(u.Host)
			c.port = atoi(t, port)
			res, err := scrape(context.Background(), srv.Client(), "http://127.0.0.1:1", config.EngineAuto, c, budget.New(scrapeBudgetBytes))
			require.NoError(t, err)
			assert.Equal(t, []string{tt.path}, asked)
			assert.Equal(t, tt.want, res.load)
			assert.Equal(t, EngineCustom, res.engine)
			assert.Equal(t, tt.kvTokens, res.kvTokens)
			if tt.name == "trtllm-serve" {
				auto, err := parseEngineScrapeAs(strings.NewReader(tt.page), config.EngineAuto, nil)
				require.NoError(t, err)
				assert.Equal(t, "", auto.engine, "autodetection knows no trtllm-serve names")
			}
		})
	}
}

// GIE's SGLang flags name SGLang's count families with no labels; with
// priority scheduling those hold the totals and their breakdown by
// priority, and the totals are read, as with the built-in names.
func TestEngineMetricsSGLangPriority(t *testing.T) {
	c, err := sglangFlags.compile()
	require.NoError(t, err)
	res, err := parseEngineScrapeAs(strings.NewReader(sglangPriorityPage), config.EngineAuto, c)
	require.NoError(t, err)
	assert.Equal(t, EngineCustom, res.engine)
	assert.Equal(t, gateway.Load{QueueDepth: 5, Running: 7, KVUtilization: 0.5}, res.load)
	// A spec naming the label reads what it names.
	c, err = EngineMetrics{Queued: "sglang:num_queue_reqs{priority=None}", Running: "sglang:num_running_reqs{priority=0}"}.compile()
	require.NoError(t, err)
	res, err = parseEngineScrapeAs(strings.NewReader(sglangPriorityPage), config.EngineAuto, c)
	require.NoError(t, err)
	assert.Equal(t, gateway.Load{QueueDepth: 5, Running: 4}, res.load)
}

func mustParse(t *testing.T, page string) gateway.Load {
	l, found, err := ParseEngineMetricsFor(strings.NewReader(page), config.EngineTRTLLM)
	require.NoError(t, err)
	require.Equal(t, config.EngineTRTLLM, found)
	return l
}

func atoi(t *testing.T, s string) int {
	var n int
	for _, c := range s {
		require.True(t, c >= '0' && c <= '9', s)
		n = n*10 + int(c-'0')
	}
	return n
}

// An empty LoRA spec reads no adapter report from the page (trtllm-serve
// in GIE's chart); the default reads vLLM's. A model naming an engine
// type keeps that type's names. Bad specs fail New, naming the field.
func TestEngineMetricsOptions(t *testing.T) {
	lora, err := os.ReadFile("testdata/metrics/llm-d-inference-sim-v0.10.2-lora-busy.txt")
	require.NoError(t, err)
	def := DefaultEngineMetrics()
	c, err := def.compile()
	require.NoError(t, err)
	res, err := parseEngineScrapeAs(strings.NewReader(string(lora)), config.EngineAuto, c)
	require.NoError(t, err)
	require.NotNil(t, res.adapters)
	withAuto, err := parseEngineScrapeAs(strings.NewReader(string(lora)), config.EngineAuto, nil)
	require.NoError(t, err)
	assert.Equal(t, withAuto.load, res.load)

	noLoRA := def
	noLoRA.LoRAInfo = `""`
	c, err = noLoRA.compile()
	require.NoError(t, err)
	res, err = parseEngineScrapeAs(strings.NewReader(string(lora)), config.EngineAuto, c)
	require.NoError(t, err)
	assert.Nil(t, res.adapters)

	res, err = parseEngineScrapeAs(strings.NewReader(trtllmServePage), config.EngineVLLM, c)
	require.NoError(t, err)
	assert.Equal(t, "", res.engine, "a configured type keeps its names")

	for _, tt := range []struct {
		m    EngineMetrics
		want string
	}{
		{EngineMetrics{Queued: "m{"}, `EngineMetrics: queued metric: invalid metric spec "m{"`},
		{EngineMetrics{CacheInfo: "x}"}, `cache info metric: invalid metric spec "x}"`},
		{EngineMetrics{Path: "metrics"}, `invalid metrics path "metrics"`},
		{EngineMetrics{Port: 70000}, `invalid metrics port 70000`},
	} {
		_, err := New(Options{EngineMetrics: &tt.m, Logger: quietLogger()})
		require.ErrorIs(t, err, ErrInvalidOptions)
		assert.Contains(t, err.Error(), tt.want)
	}
}

// The fleet scrapes with Options.EngineMetrics: /stats shows the engine
// read as "custom" with its load.
func TestEngineMetricsFleet(t *testing.T) {
	srv := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/prometheus/metrics" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(trtllmServePage))
	}))
	names := trtllmServeFlags
	s, err := New(Options{EngineMetrics: &names, Logger: quietLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	cfg := config.Model{Mode: gateway.ModeLoadAware, Replicas: []config.Replica{{Name: "e0", Address: srv.URL}}}
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: cfg}}))
	s.ScrapeAll(context.Background())
	e0 := s.Stats().Engines[0]
	assert.Equal(t, EngineCustom, e0.Engine)
	assert.Empty(t, e0.LoadWarning)
	require.NotNil(t, e0.Load)
	assert.Equal(t, EngineLoad{Waiting: 5, Running: 2, KVUtilization: 0.25}, *e0.Load)
}

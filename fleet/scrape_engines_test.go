package fleet

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Pages of each engine type are read with that type's names, chosen or
// detected; a type that is not on the page reads as zero with no type
// found. The SGLang and TensorRT-LLM pages in testdata/metrics are written
// from the names in GIE's model-server protocol table and the labels the
// engines add (not captured from running engines).
func TestParseEngineMetricsFor(t *testing.T) {
	pages := map[string]string{}
	for _, f := range []string{"vllm-style.txt", "sglang-style.txt", "trtllm-style.txt"} {
		b, err := os.ReadFile(filepath.Join("testdata", "metrics", f))
		require.NoError(t, err)
		pages[strings.TrimSuffix(f, "-style.txt")] = string(b)
	}
	loads := map[string]gateway.Load{
		"vllm":   {QueueDepth: 2, Running: 12, KVUtilization: 0.6015625},
		"sglang": {QueueDepth: 4, Running: 14, KVUtilization: 0.42},
		"trtllm": {QueueDepth: 3, Running: 6, KVUtilization: 0.3},
	}
	for page, text := range pages {
		for _, engine := range append([]string{config.EngineAuto}, config.Engines...) {
			t.Run(page+"/"+engine, func(t *testing.T) {
				l, found, err := ParseEngineMetricsFor(strings.NewReader(text), engine)
				require.NoError(t, err)
				if engine == config.EngineAuto || engine == page {
					assert.Equal(t, page, found)
					assert.Equal(t, loads[page], l)
					return
				}
				assert.Equal(t, "", found)
				assert.Equal(t, gateway.Load{}, l)
			})
		}
	}
	// vLLM's names win when a page has several types' (the default).
	l, found, err := ParseEngineMetricsFor(strings.NewReader(pages["sglang"]+pages["vllm"]), config.EngineAuto)
	require.NoError(t, err)
	assert.Equal(t, config.EngineVLLM, found)
	assert.Equal(t, loads["vllm"], l)
	// A page with none of the series: no type, zero load, no error.
	l, found, err = ParseEngineMetricsFor(strings.NewReader("other_metric 1\n"), config.EngineAuto)
	require.NoError(t, err)
	assert.Equal(t, "", found)
	assert.Equal(t, gateway.Load{}, l)
	// TensorRT-LLM's family without the selected label value is not its load.
	_, found, err = ParseEngineMetricsFor(strings.NewReader(`nv_trt_llm_request_metrics{request_type="max"} 64`+"\n"), config.EngineAuto)
	require.NoError(t, err)
	assert.Equal(t, "", found)
	// An unknown type is an error naming it.
	_, _, err = ParseEngineMetricsFor(strings.NewReader(""), "tgi")
	require.ErrorIs(t, err, ErrScrape)
	assert.Contains(t, err.Error(), `"tgi"`)
}

// sglangPriorityPage is an SGLang page with priority scheduling: running
// 7 (4 + 3 by priority), waiting 5 (5 under priority "None").
const sglangPriorityPage = `# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 7.0
sglang:num_running_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",priority="0",tp_rank="0"} 4.0
sglang:num_running_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",priority="1",tp_rank="0"} 3.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 5.0
sglang:num_queue_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",priority="None",tp_rank="0"} 5.0
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 0.5
`

// SGLang with --enable-priority-scheduling writes each count twice: the
// total with priority="" and a breakdown by priority="N"
// (python/sglang/srt/observability/metrics_collector.py,
// _log_gauge_queue_count). The load is the total, not total and
// breakdown summed; a page without the label (the default) is summed as
// before, over ranks.
func TestParseEngineMetricsSGLangPriority(t *testing.T) {
	for _, engine := range []string{config.EngineAuto, config.EngineSGLang} {
		l, found, err := ParseEngineMetricsFor(strings.NewReader(sglangPriorityPage), engine)
		require.NoError(t, err)
		assert.Equal(t, config.EngineSGLang, found)
		assert.Equal(t, gateway.Load{QueueDepth: 5, Running: 7, KVUtilization: 0.5}, l, engine)
	}
	// Without priority scheduling: no priority label, every rank's
	// series summed.
	l, _, err := ParseEngineMetricsFor(strings.NewReader("sglang:num_queue_reqs{dp_rank=\"0\"} 2\nsglang:num_queue_reqs{dp_rank=\"1\"} 3\n"), config.EngineAuto)
	require.NoError(t, err)
	assert.Equal(t, 5, l.QueueDepth)
}

// FuzzParseEngineMetricsFor feeds mutated pages to each engine type's
// parser: no panic, errors wrap ErrScrape, loads in range, and the type
// found is the one asked for (or, for auto, a known one) or none.
func FuzzParseEngineMetricsFor(f *testing.F) {
	for i, b := range recordedPages(f) {
		f.Add(b, uint8(i))
	}
	f.Add([]byte("sglang:num_queue_reqs 1e300\nsglang:token_usage -1\n"), uint8(2))
	f.Add([]byte("nv_trt_llm_request_metrics{request_type=\"waiting\"} NaN\n"), uint8(3))
	types := append([]string{config.EngineAuto}, config.Engines...)
	f.Fuzz(func(t *testing.T, page []byte, which uint8) {
		engine := types[int(which)%len(types)]
		l, found, err := ParseEngineMetricsFor(bytes.NewReader(page), engine)
		if err != nil {
			if !assert.ErrorIs(t, err, ErrScrape) || l != (gateway.Load{}) || found != "" {
				t.Fatalf("error %v with load %+v, type %q", err, l, found)
			}
			return
		}
		if l.QueueDepth < 0 || l.QueueDepth > MaxLoadCount || l.Running < 0 || l.Running > MaxLoadCount ||
			!(l.KVUtilization >= 0 && l.KVUtilization <= 1) || l.Latency != 0 {
			t.Fatalf("load out of range: %+v", l)
		}
		if found != "" && engine != config.EngineAuto && found != engine {
			t.Fatalf("asked for %q, found %q", engine, found)
		}
		if found == "" && l != (gateway.Load{}) {
			t.Fatalf("no type found but load %+v", l)
		}
	})
}

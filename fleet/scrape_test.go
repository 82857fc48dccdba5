package fleet

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/internal/budget"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseEngineMetrics(t *testing.T) {
	tests := []struct {
		name string
		text string
		want gateway.Load
		err  bool
	}{
		{name: "vllm current names", text: `# HELP vllm:num_requests_waiting Waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 3
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 5
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.25
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits{model_name="m"} 100
`, want: gateway.Load{QueueDepth: 3, Running: 5, KVUtilization: 0.25}},
		{name: "older gpu_cache name", text: `vllm:num_requests_waiting{model_name="m"} 1
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
`, want: gateway.Load{QueueDepth: 1, KVUtilization: 0.5}},
		{name: "new name wins over old", text: `vllm:kv_cache_usage_perc 0.1
vllm:gpu_cache_usage_perc 0.9
`, want: gateway.Load{KVUtilization: 0.1}},
		{name: "series summed per model, kv max", text: `vllm:num_requests_waiting{model_name="a"} 1
vllm:num_requests_waiting{model_name="b"} 2
vllm:num_requests_running{model_name="a"} 4
vllm:num_requests_running{model_name="b"} 4
vllm:kv_cache_usage_perc{model_name="a"} 0.2
vllm:kv_cache_usage_perc{model_name="b"} 0.7
`, want: gateway.Load{QueueDepth: 3, Running: 8, KVUtilization: 0.7}},
		{name: "missing metrics are zero", text: "other_metric 7\n", want: gateway.Load{}},
		{name: "empty page", text: "", want: gateway.Load{}},
		{name: "out of range clamped", text: "vllm:kv_cache_usage_perc 1.5\nvllm:num_requests_waiting -2\n", want: gateway.Load{KVUtilization: 1}},
		{name: "absurd counts clamped, not wrapped", text: "vllm:num_requests_waiting 1e30\nvllm:num_requests_running 1e300\n",
			want: gateway.Load{QueueDepth: MaxLoadCount, Running: MaxLoadCount}},
		{name: "NaN reads as zero", text: "vllm:kv_cache_usage_perc NaN\n", want: gateway.Load{}},
		{name: "a name prefix is not the metric", text: "vllm:num_requests_waiting_total 9\n", want: gateway.Load{}},
		{name: "malformed", text: "vllm:num_requests_waiting{model_name=\"m\" 3\n", err: true},
		{name: "bad value", text: "vllm:num_requests_waiting three\n", err: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseEngineMetrics(strings.NewReader(tt.text))
			if tt.err {
				require.Error(t, err)
				assert.True(t, errors.Is(err, ErrScrape), "error %v should wrap ErrScrape", err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// A page that does not parse gives the same error form as a failed fetch:
// "gateway: scrape engine metrics: <address>: ...", wrapping ErrScrape.
func TestScrapeErrorForm(t *testing.T) {
	tests := []struct {
		name string
		page func(http.ResponseWriter)
	}{
		{"parse error", func(w http.ResponseWriter) { _, _ = io.WriteString(w, "vllm:num_requests_waiting three\n") }},
		{"bad status", func(w http.ResponseWriter) { w.WriteHeader(http.StatusInternalServerError) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { tt.page(w) }))
			_, err := scrape(context.Background(), srv.Client(), srv.URL, "", nil, budget.New(scrapeBudgetBytes))
			require.ErrorIs(t, err, ErrScrape)
			assert.True(t, strings.HasPrefix(err.Error(), "gateway: scrape engine metrics: "+srv.URL+": "), err.Error())
			assert.Equal(t, 1, strings.Count(err.Error(), "gateway:"), err.Error())
		})
	}
}

// A page's parse error quotes the token the parser fails on, which may
// be most of a kept line (up to maxKeptBytes): the error keeps at most
// maxErrorBytes of it, since it is kept per engine (/stats shows it) and
// per peer, and logged.
func TestScrapeErrorBounded(t *testing.T) {
	long := strings.Repeat("y", 900<<10)
	srv := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "vllm:num_requests_waiting 1 "+long+"\n"+MetricPendingPrefill+"{model=\"m\",replica=\"r\"} 1 "+long+"\n")
	}))
	_, err := scrape(context.Background(), srv.Client(), srv.URL, "", nil, budget.New(scrapeBudgetBytes))
	require.ErrorIs(t, err, ErrScrape)
	assert.Contains(t, err.Error(), "expected integer as timestamp")
	assert.LessOrEqual(t, len(err.Error()), len(srv.URL)+maxErrorBytes+100, "%.200s", err)
	_, _, err = scrapePeer(context.Background(), srv.Client(), srv.URL, nil, budget.New(scrapeBudgetBytes), nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "expected integer as timestamp")
	assert.LessOrEqual(t, len(err.Error()), maxErrorBytes+100, "%.200s", err)
}

// Real pages: the llm-d inference simulator's (v0.10.2, the e2e engine,
// captured idle after one request and busy with 2 running and 3 waiting)
// and a vLLM-style page (several engines per server, float values, other
// families around).
func TestParseEngineMetricsRealPages(t *testing.T) {
	tests := []struct {
		file string
		want gateway.Load
	}{
		{"llm-d-inference-sim-v0.10.2-after-one-request.txt", gateway.Load{}},
		{"llm-d-inference-sim-v0.10.2-busy.txt", gateway.Load{QueueDepth: 3, Running: 2}},
		{"vllm-style.txt", gateway.Load{QueueDepth: 2, Running: 12, KVUtilization: 0.6015625}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("testdata", "metrics", tt.file))
			require.NoError(t, err)
			got, err := ParseEngineMetrics(bytes.NewReader(b))
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// FuzzParseEngineMetrics feeds mutated metrics pages to ParseEngineMetrics:
// it never panics, an error wraps ErrScrape, and a load is always in range
// (counts within 0..MaxLoadCount, KV utilisation within 0..1, no
// latency). Its seeds are the pages in testdata/metrics and
// TestParseEngineMetrics's texts.
func FuzzParseEngineMetrics(f *testing.F) {
	for _, b := range recordedPages(f) {
		f.Add(b)
	}
	for _, s := range []string{
		"vllm:num_requests_waiting{model_name=\"a\"} 1\nvllm:num_requests_waiting{model_name=\"b\"} 2\n",
		"vllm:kv_cache_usage_perc 1.5\nvllm:num_requests_waiting -2\n",
		"vllm:num_requests_waiting 1e30\nvllm:num_requests_running 1e300\n",
		"vllm:kv_cache_usage_perc NaN\nvllm:gpu_cache_usage_perc +Inf\n",
		"# TYPE vllm:num_requests_waiting histogram\nvllm:num_requests_waiting_bucket{le=\"+Inf\"} 3\n",
		"vllm:num_requests_waiting{model_name=\"m\" 3\n",
		"vllm:num_requests_waiting three\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, page []byte) {
		l, err := ParseEngineMetrics(bytes.NewReader(page))
		if err != nil {
			if !errors.Is(err, ErrScrape) {
				t.Fatalf("error %v does not wrap ErrScrape", err)
			}
			if l != (gateway.Load{}) {
				t.Fatalf("error %v with a load %+v", err, l)
			}
			return
		}
		if l.QueueDepth < 0 || l.QueueDepth > MaxLoadCount || l.Running < 0 || l.Running > MaxLoadCount ||
			!(l.KVUtilization >= 0 && l.KVUtilization <= 1) || l.Latency != 0 {
			t.Fatalf("load out of range: %+v", l)
		}
	})
}

package httpgw

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/examlops/gateway"
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
			_, err := scrape(context.Background(), srv.Client(), srv.URL)
			require.ErrorIs(t, err, ErrScrape)
			assert.True(t, strings.HasPrefix(err.Error(), "gateway: scrape engine metrics: "+srv.URL+": "), err.Error())
			assert.Equal(t, 1, strings.Count(err.Error(), "gateway:"), err.Error())
		})
	}
}

package httpgw

import (
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/httpgw/enginetest"
)

// The per-request series, cached per model, count every request once, by
// endpoint and replica, before and after a reload rebuilds the model's
// table; a series appears only once it has counted something.
func TestPerRequestMetrics(t *testing.T) {
	f := newFixture(t, 2, gateway.ModeRoundRobin, enginetest.Options{})
	send := func(path, body string) {
		t.Helper()
		resp := f.post(path, body)
		b := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", b)
	}
	chat := chatBody(testModel, false, "system prompt", "hello")
	for range 3 {
		send("/v1/chat/completions", chat)
	}
	m := map[string]string{"model": testModel}
	completions := map[string]string{"model": testModel, "endpoint": "completions"}
	assert.Equal(t, 0.0, f.counter("exa_gateway_requests_total", completions))
	assert.Equal(t, uint64(0), f.histCount("exa_gateway_request_duration_seconds", completions))

	send("/v1/completions", `{"model":"m1","prompt":"once upon a time"}`)
	// A reload that changes the routing mode builds a new table (and a new
	// cache); the counts carry on.
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {
		Mode: gateway.ModeCacheAware, Replicas: []config.Replica{
			{Name: "e0", Address: f.engines[0].URL()}, {Name: "e1", Address: f.engines[1].URL()}}}}}))
	send("/v1/chat/completions", chat)

	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"exa_gateway_requests_total", map[string]string{"model": testModel, "endpoint": "chat", "code": "200"}, 4},
		{"exa_gateway_requests_total", map[string]string{"model": testModel, "endpoint": "completions", "code": "200"}, 1},
		{"exa_gateway_routed_total", m, 5},
		{"exa_gateway_decisions_total", map[string]string{"model": testModel, "kind": "round_robin"}, 4},
		{"exa_gateway_replica_requests_total", m, 5},
		{"exa_gateway_replica_requests_total", map[string]string{"model": testModel, "replica": "e0"}, float64(f.engines[0].Requests())},
		{"exa_gateway_replica_requests_total", map[string]string{"model": testModel, "replica": "e1"}, float64(f.engines[1].Requests())},
	} {
		assert.Equal(t, tc.want, f.counter(tc.name, tc.labels), "%s %v", tc.name, tc.labels)
	}
	assert.Equal(t, 1.0, f.counter("exa_gateway_decisions_total", map[string]string{"model": testModel, "kind": "affinity"})+
		f.counter("exa_gateway_decisions_total", map[string]string{"model": testModel, "kind": "load_aware"}))
	assert.Equal(t, uint64(4), f.histCount("exa_gateway_request_duration_seconds", map[string]string{"model": testModel, "endpoint": "chat"}))
	assert.Equal(t, uint64(1), f.histCount("exa_gateway_request_duration_seconds", completions))
	assert.Equal(t, uint64(5), f.histCount("exa_gateway_time_to_first_byte_seconds", m))
}

// /metrics of a Server with its own registry carries the Go runtime's and
// the process's metrics too (issue 13, finding 7); a Registerer given is
// left as it is. The gateway's mux serves no pprof.
func TestRuntimeAndProcessMetrics(t *testing.T) {
	s, err := New(Options{Logger: quietLogger()})
	require.NoError(t, err)
	srv := newHTTPTestServer(t, s)
	resp, err := http.Get(srv.URL + "/metrics")
	require.NoError(t, err)
	text := string(readAll(t, resp))
	for _, name := range []string{"go_goroutines", "go_memstats_heap_alloc_bytes", "go_gc_duration_seconds",
		"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds", "exa_gateway_in_flight_requests"} {
		assert.Contains(t, text, "\n"+name, "metric %s", name)
	}

	reg := prometheus.NewRegistry()
	_, err = New(Options{Registerer: reg, Gatherer: reg, Logger: quietLogger()})
	require.NoError(t, err)
	fams, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		assert.False(t, strings.HasPrefix(f.GetName(), "go_") || strings.HasPrefix(f.GetName(), "process_"), f.GetName())
	}

	resp, err = http.Get(srv.URL + "/debug/pprof/")
	require.NoError(t, err)
	readAll(t, resp)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "pprof is opt-in, on its own address")
}

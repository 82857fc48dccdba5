package front_test

import (
	"strings"
	"testing"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/internal/fronttest"
	"github.com/examlops/gateway/keys"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A model table built without cached series (nil) still counts.
func TestNilModelMetricsLooksUp(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := front.NewMetrics(reg)
	require.NoError(t, err)
	var mm *front.ModelMetrics
	m.CountDecision(&fleet.Model{Name: "x"}, &gateway.Decision{Kind: gateway.KindLoadAware})
	m.ReplicaRequests(&fleet.Model{Name: "x"}, "r").Inc()
	mm.RequestsC(m, "x", keys.Chat, "200").Inc()
	mm.DurationO(m, "x", keys.Chat).Observe(0.1)
	assert.Equal(t, 1.0, fronttest.Counter(t, reg, "exa_gateway_routed_total", map[string]string{"model": "x"}))
	assert.Equal(t, 1.0, fronttest.Counter(t, reg, "exa_gateway_replica_requests_total", map[string]string{"model": "x", "replica": "r"}))
	assert.Equal(t, 1.0, fronttest.Counter(t, reg, "exa_gateway_requests_total", map[string]string{"model": "x", "code": "200"}))
	assert.Equal(t, uint64(1), fronttest.HistCount(t, reg, "exa_gateway_request_duration_seconds", map[string]string{"model": "x"}))
}

// exa_gateway_requests_total's help names every endpoint label value a
// front counts under (docs/metrics.md), the Responses API's included.
func TestRequestsHelpNamesEndpoints(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := front.NewMetrics(reg)
	require.NoError(t, err)
	m.Requests.WithLabelValues("x", "chat", "200").Inc()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "exa_gateway_requests_total" {
			continue
		}
		for _, e := range []string{keys.Chat.String(), keys.Completions.String(), keys.Responses.String(), "embeddings", "tokenize", "detokenize", "models", "other"} {
			h := mf.GetHelp()
			assert.True(t, strings.Contains(h, " "+e+",") || strings.Contains(h, " "+e+")") || strings.Contains(h, "("+e+","), "%s not in %q", e, h)
		}
		return
	}
	t.Fatal("no exa_gateway_requests_total")
}

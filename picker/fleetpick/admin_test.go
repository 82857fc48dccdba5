package fleetpick

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/front"
)

// The admin handler serves the fleet's /stats, the metrics of the fleet
// and the Router (/metrics) and /healthz, and nothing else.
func TestAdmin(t *testing.T) {
	reg := prometheus.NewRegistry()
	fl := newFleet(t, reg, fleet.Options{})
	_, err := New(fl, Options{Registerer: reg})
	require.NoError(t, err)
	srv := httptest.NewServer(Admin(fl, reg))
	defer srv.Close()
	for _, tt := range []struct {
		path   string
		status int
		want   string
	}{
		{"/metrics", 200, "exa_gateway_in_flight_requests 0"},
		{"/stats", 200, `"models"`},
		{"/stats?model=nope", 404, "model not found"},
		{"/healthz", 200, ""},
		{"/v1/chat/completions", 404, "requests go through Envoy"},
		{"/v1/models", 404, "no endpoint /v1/models"},
	} {
		resp, err := http.Get(srv.URL + tt.path)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		assert.Equal(t, tt.status, resp.StatusCode, tt.path)
		assert.Contains(t, string(b), tt.want, tt.path)
	}
}

// New refuses options out of range, naming the field.
func TestNewOptions(t *testing.T) {
	fl := pickServer(t, gateway.ModeCacheAware, "http://10.0.0.1:8000")
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Fallbacks: -1}, "Fallbacks -1"},
		{Options{ShedAbove: -1}, "ShedAbove -1"},
		{Options{TokenizeTimeout: -1}, "TokenizeTimeout -1ns"},
		{Options{Admission: gateway.Admission{KVUtilization: 2}}, "Admission.KVUtilization 2"},
		{Options{Objectives: front.Objectives{Defaults: map[string]front.SLO{"m": {TTFT: -1}}}}, `Objectives.Defaults["m"]: objective TTFT -1ns`},
		{Options{Objectives: front.Objectives{Unattainable: 7}}, "Objectives.Unattainable 7 is not a mode"},
	} {
		_, err := New(fl, tc.o)
		require.Error(t, err)
		assert.True(t, errors.Is(err, ErrInvalidOptions), "%v", err)
		assert.Contains(t, err.Error(), tc.want)
	}
	_, err := New(nil, Options{})
	assert.ErrorIs(t, err, ErrInvalidOptions)
	// The staleness default follows the fleet's scrape interval, and
	// ShedAbove is the outstanding threshold.
	r, err := New(fl, Options{Admission: gateway.Admission{QueueDepth: 5}, ShedAbove: 3})
	require.NoError(t, err)
	assert.Equal(t, gateway.Admission{QueueDepth: 5, Outstanding: 3, Staleness: 3 * fleet.DefaultScrapeInterval}, r.opts.Admission)
}

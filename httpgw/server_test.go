package httpgw

import (
	"bufio"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/httpgw/enginetest"
)

func TestOptionsValidation(t *testing.T) {
	tests := []struct {
		name  string
		opts  Options
		field string
	}{
		{"negative reload interval", Options{Fleet: fleet.Options{ReloadInterval: -time.Second}}, "ReloadInterval"},
		{"negative probe interval", Options{Fleet: fleet.Options{ProbeInterval: -1}}, "ProbeInterval"},
		{"negative probe timeout", Options{Fleet: fleet.Options{ProbeTimeout: -1}}, "ProbeTimeout"},
		{"negative scrape interval", Options{Fleet: fleet.Options{ScrapeInterval: -1}}, "ScrapeInterval"},
		{"negative eject threshold", Options{Fleet: fleet.Options{EjectAfter: -1}}, "EjectAfter"},
		{"negative readmit threshold", Options{Fleet: fleet.Options{ReadmitAfter: -2}}, "ReadmitAfter"},
		{"negative block size", Options{BlockSize: -64}, "BlockSize"},
		{"negative body limit", Options{MaxBodyBytes: -1}, "MaxBodyBytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.opts)
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrInvalidOptions))
			assert.Contains(t, err.Error(), tt.field)
			assert.True(t, strings.HasPrefix(err.Error(), "gateway:"), err.Error())
		})
	}
	t.Run("zero value is usable", func(t *testing.T) {
		s, err := New(Options{Registerer: prometheus.NewRegistry(), Logger: quietLogger()})
		require.NoError(t, err)
		assert.Equal(t, fleet.DefaultEjectAfter, s.Fleet.Options().EjectAfter)
		assert.Equal(t, int64(DefaultMaxBodyBytes), s.opts.MaxBodyBytes)
		assert.Equal(t, DefaultFirstByteTimeout, s.opts.FirstByteTimeout)
	})
}

func TestNormalizeAddress(t *testing.T) {
	tests := []struct{ in, want string }{
		{"127.0.0.1:8000", "http://127.0.0.1:8000"},
		{"http://127.0.0.1:8000/", "http://127.0.0.1:8000"},
		{" https://engine.internal ", "https://engine.internal"},
		{"http://h:1/prefix/", "http://h:1/prefix"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			assert.Equal(t, tt.want, fleet.NormalizeAddress(tt.in))
		})
	}
}

// Repeated 5xx answers eject an engine passively, without any probe.
func TestPassiveEjectionOn5xx(t *testing.T) {
	f := newFixture(t, 2, gateway.ModeRoundRobin, enginetest.Options{})
	f.engines[0].FailNext(100)
	for range 6 {
		resp := f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "hi"))
		readAll(t, resp)
		assert.Equal(t, http.StatusOK, resp.StatusCode, "failures before any byte are retried on the healthy engine")
	}
	assert.Equal(t, 1.0, f.counter("exa_gateway_ejections_total", map[string]string{"address": f.engines[0].URL()}))
	assert.Equal(t, float64(fleet.DefaultEjectAfter), f.counter("exa_gateway_retries_total", nil), "retries stop once the engine is ejected")
}

func TestStreamedCompletionsAndCustomTransport(t *testing.T) {
	e := enginetest.New(enginetest.Options{Model: testModel, Chunks: 2})
	t.Cleanup(e.Close)
	reg := prometheus.NewRegistry()
	s, err := New(Options{Registerer: reg, Gatherer: reg, Logger: quietLogger(), Transport: http.DefaultTransport})
	require.NoError(t, err)
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {Replicas: []config.Replica{{Name: "e0", Address: e.URL()}}}}}))
	f := &fixture{t: t, srv: s, reg: reg}
	f.http = newHTTPTestServer(t, s)
	resp := f.post("/v1/completions", `{"model":"m1","prompt":"once upon a time","stream":true}`)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	sc := bufio.NewScanner(resp.Body)
	var events []string
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "data: ") {
			events = append(events, line)
		}
	}
	require.Len(t, events, 3)
	assert.Contains(t, events[0], `"text":"tok0 "`)
	assert.Equal(t, "data: [DONE]", events[2])
}

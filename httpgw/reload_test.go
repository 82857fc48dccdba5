package httpgw

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/keys"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func setModel(t *testing.T, path, model string, m config.Model) {
	t.Helper()
	require.NoError(t, config.Update(path, func(f *config.File) error {
		if f.Models == nil {
			f.Models = map[string]config.Model{}
		}
		f.Models[model] = m
		return nil
	}))
}

// A configuration change takes effect on Reload while a stream started
// before it completes on the old table.
func TestReloadWithoutDroppingTraffic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "routing.json")
	e0 := enginetest.New(enginetest.Options{Name: "e0"})
	e1 := enginetest.New(enginetest.Options{Name: "e1"})
	t.Cleanup(e0.Close)
	t.Cleanup(e1.Close)
	setModel(t, path, "a", config.Model{Mode: gateway.ModeCacheAware, Replicas: []config.Replica{{Name: "r0", Address: e0.URL()}}})

	reg := prometheus.NewRegistry()
	s, err := New(Options{Registerer: reg, Gatherer: reg, Logger: quietLogger(), Fleet: fleet.Options{ConfigPath: path}})
	require.NoError(t, err)
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	post := func(model string, stream bool) *http.Response {
		resp, err := http.Post(hs.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(model, stream, "sys", "hi")))
		require.NoError(t, err)
		return resp
	}

	changed, err := s.Reload()
	require.NoError(t, err)
	assert.False(t, changed, "an unchanged file is not reloaded")

	release := e0.Gate()
	defer release()
	inflight := post("a", true)
	defer inflight.Body.Close()
	<-e0.Gated()

	// Model b appears; model a moves to engine e1 with the same routing options.
	setModel(t, path, "b", config.Model{Replicas: []config.Replica{{Name: "r0", Address: e1.URL()}}})
	setModel(t, path, "a", config.Model{Mode: gateway.ModeCacheAware, Replicas: []config.Replica{{Name: "r1", Address: e1.URL()}}})
	changed, err = s.Reload()
	require.NoError(t, err)
	assert.True(t, changed)

	resp := post("b", false)
	readAll(t, resp)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	resp = post("a", false)
	readAll(t, resp)
	assert.Equal(t, "r1", resp.Header.Get(HeaderReplica))

	release()
	rest, err := io.ReadAll(bufio.NewReader(inflight.Body))
	require.NoError(t, err)
	assert.Contains(t, string(rest), "[DONE]", "the stream begun before the reload completes")

	// A corrupt file is refused and the running configuration stays.
	require.NoError(t, os.WriteFile(path, []byte("{not json"), 0o644))
	changed, err = s.Reload()
	assert.Error(t, err)
	assert.False(t, changed)
	resp = post("b", false)
	readAll(t, resp)
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	// An invalid value is refused too.
	require.NoError(t, os.WriteFile(path, []byte(`{"version":1,"models":{"a":{"mode":"fastest"}}}`), 0o644))
	_, err = s.Reload()
	assert.ErrorIs(t, err, config.ErrInvalid)
	assert.Len(t, s.Stats().Models, 2)
}

// A model whose routing options are unchanged keeps its gateway (and its
// cache index) across a reload; one whose mode changed gets a new one.
func TestApplyKeepsGatewayWhenRoutingUnchanged(t *testing.T) {
	f := newFixture(t, 2, gateway.ModeCacheAware, enginetest.Options{})
	before := f.srv.Snapshot().Models[testModel].Gateway
	reps := []config.Replica{{Name: "e0", Address: f.engines[0].URL()}, {Name: "e1", Address: f.engines[1].URL()}, {Name: "e2", Address: "127.0.0.1:1"}}
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {Mode: gateway.ModeCacheAware, Replicas: reps}}}))
	after := f.srv.Snapshot().Models[testModel].Gateway
	assert.Same(t, before, after)
	assert.Len(t, after.Replicas(), 3)
	assert.Equal(t, "http://127.0.0.1:1", f.stats().Engines[0].Address)

	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {Mode: gateway.ModeRoundRobin, Replicas: reps[:1]}}}))
	again := f.srv.Snapshot().Models[testModel].Gateway
	assert.NotSame(t, after, again)
	assert.Len(t, again.Replicas(), 1)
	assert.Len(t, f.stats().Engines, 1, "engines no model uses are dropped")
}

// A configuration file that does not exist yet is an empty configuration;
// the gateway picks the file up once it appears.
func TestReloadFileAppears(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routing.json")
	reg := prometheus.NewRegistry()
	s, err := New(Options{Registerer: reg, Gatherer: reg, Logger: quietLogger(), Fleet: fleet.Options{ConfigPath: path}})
	require.NoError(t, err)
	assert.Empty(t, s.Stats().Models)
	for range 3 {
		changed, err := s.Reload()
		require.NoError(t, err)
		assert.False(t, changed)
	}
	f := &fixture{t: t, reg: reg}
	assert.Equal(t, 1.0, f.counter("exa_gateway_config_reloads_total", map[string]string{"result": "ok"}), "the missing file is applied once")
	setModel(t, path, "a", config.Model{Replicas: []config.Replica{{Name: "r0", Address: "127.0.0.1:1"}}})
	changed, err := s.Reload()
	require.NoError(t, err)
	assert.True(t, changed)
	assert.Contains(t, s.Stats().Models, "a")
}

// applyModels applies a configuration of round-robin models with the given
// replicas.
func applyModels(t *testing.T, s *Server, models map[string][]config.Replica) error {
	t.Helper()
	f := &config.File{Version: config.Version, Models: map[string]config.Model{}}
	for name, reps := range models {
		f.Models[name] = config.Model{Replicas: reps}
	}
	return s.Apply(f)
}

// A request that took its snapshot before a reload is routed by the
// model's shared gateway, which may choose a replica (or an address) the
// old snapshot does not know. It is served by that replica's engine, not
// dropped with a panic.
func TestInFlightSnapshotAcrossReload(t *testing.T) {
	e0 := enginetest.New(enginetest.Options{Name: "e0", Model: testModel})
	e1 := enginetest.New(enginetest.Options{Name: "e1", Model: testModel})
	t.Cleanup(e0.Close)
	t.Cleanup(e1.Close)
	tests := []struct {
		name    string
		before  []config.Replica
		after   []config.Replica
		replica string
	}{
		{"replica renamed", []config.Replica{{Name: "r0", Address: e0.URL()}}, []config.Replica{{Name: "r1", Address: e1.URL()}}, "r1"},
		{"replica moved", []config.Replica{{Name: "r0", Address: e0.URL()}}, []config.Replica{{Name: "r0", Address: e1.URL()}}, "r0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			s, err := New(Options{Registerer: reg, Gatherer: reg, Logger: quietLogger()})
			require.NoError(t, err)
			require.NoError(t, applyModels(t, s, map[string][]config.Replica{testModel: tt.before}))
			stale := s.Snapshot().Models[testModel]
			e0Before, e1Before := e0.Requests(), e1.Requests()
			require.NoError(t, applyModels(t, s, map[string][]config.Replica{testModel: tt.after}))
			require.Same(t, stale.Gateway, s.Snapshot().Models[testModel].Gateway, "the gateway is shared across the snapshots")

			body := chatBody(testModel, false, "sys", "hi")
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
			w := httptest.NewRecorder()
			c := &call{w: w, r: r, start: time.Now(), body: []byte(body), req: &keys.Request{Model: testModel}, ms: stale, key: keys.AppendHashes(nil, []uint64{1})}
			require.NotPanics(t, func() { s.proxy(c) })
			assert.Equal(t, http.StatusOK, w.Code, w.Body.String())
			assert.Equal(t, tt.replica, w.Header().Get(HeaderReplica))
			assert.Equal(t, int64(1), e1.Requests()-e1Before, "served by the engine the replica has now")
			assert.Equal(t, e0Before, e0.Requests())
			for _, r := range stale.Gateway.Replicas() {
				assert.Zero(t, r.InFlight, "replica %s: the decision was released", r.Name)
			}
		})
	}
}

// A decision for an engine no snapshot knows is released and the request
// answered with 502, never a panic.
func TestDecisionForUnknownEngine(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, err := New(Options{Registerer: reg, Gatherer: reg, Logger: quietLogger()})
	require.NoError(t, err)
	gw, err := gateway.New([]gateway.Replica{{Name: "ghost", Address: "http://127.0.0.1:1"}})
	require.NoError(t, err)
	ms := &fleet.Model{Name: testModel, Gateway: gw, ByName: map[string]*fleet.Endpoint{}}
	body := chatBody(testModel, false, "sys", "hi")
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
	w := httptest.NewRecorder()
	c := &call{w: w, r: r, start: time.Now(), body: []byte(body), req: &keys.Request{Model: testModel}, ms: ms, key: keys.AppendHashes(nil, []uint64{1})}
	require.NotPanics(t, func() { s.proxy(c) })
	assert.Equal(t, http.StatusBadGateway, w.Code)
	assert.Equal(t, "502", c.oc.code)
	msg := decodeError(t, w.Body.Bytes()).Message
	assert.True(t, strings.HasPrefix(msg, "gateway: upstream failure: "), msg)
	assert.Equal(t, 1, strings.Count(msg, "gateway:"), msg)
	assert.Zero(t, gw.Replicas()[0].InFlight, "the decision was released")
}

// Gauges of engines and models a reload removes leave /metrics.
func TestReloadDropsStaleGauges(t *testing.T) {
	f := newFixture(t, 2, gateway.ModeRoundRobin, enginetest.Options{})
	series := func(name, label string) map[string]bool {
		f.srv.RefreshGauges()
		fams, err := f.reg.Gather()
		require.NoError(t, err)
		out := map[string]bool{}
		for _, fam := range fams {
			if fam.GetName() != name {
				continue
			}
			for _, m := range fam.GetMetric() {
				for _, lp := range m.GetLabel() {
					if lp.GetName() == label {
						out[lp.GetValue()] = true
					}
				}
			}
		}
		return out
	}
	e0, e1 := f.engines[0].URL(), f.engines[1].URL()
	require.Equal(t, map[string]bool{e0: true, e1: true}, series("exa_gateway_endpoint_healthy", "address"))

	require.NoError(t, applyModels(t, f.srv, map[string][]config.Replica{"other": {{Name: "e0", Address: e0}}}))
	assert.Equal(t, map[string]bool{e0: true}, series("exa_gateway_endpoint_healthy", "address"))
}

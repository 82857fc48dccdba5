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

	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/httpgw/enginetest"
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
	setModel(t, path, "a", config.Model{Mode: config.ModeCacheAware, Replicas: []config.Replica{{Name: "r0", Address: e0.URL()}}})

	reg := prometheus.NewRegistry()
	s, err := New(Options{ConfigPath: path, Registerer: reg, Gatherer: reg, Logger: quietLogger()})
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
	setModel(t, path, "a", config.Model{Mode: config.ModeCacheAware, Replicas: []config.Replica{{Name: "r1", Address: e1.URL()}}})
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
	f := newFixture(t, 2, config.ModeCacheAware, enginetest.Options{})
	before := f.srv.state.Load().models[testModel].gw
	reps := []config.Replica{{Name: "e0", Address: f.engines[0].URL()}, {Name: "e1", Address: f.engines[1].URL()}, {Name: "e2", Address: "127.0.0.1:1"}}
	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {Mode: config.ModeCacheAware, Replicas: reps}}}))
	after := f.srv.state.Load().models[testModel].gw
	assert.Same(t, before, after)
	assert.Len(t, after.Replicas(), 3)
	assert.Equal(t, "http://127.0.0.1:1", f.srv.Stats().Engines[0].Address)

	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {Mode: config.ModeRoundRobin, Replicas: reps[:1]}}}))
	again := f.srv.state.Load().models[testModel].gw
	assert.NotSame(t, after, again)
	assert.Len(t, again.Replicas(), 1)
	assert.Len(t, f.srv.Stats().Engines, 1, "engines no model uses are dropped")
}

// A configuration file that does not exist yet is an empty configuration;
// the gateway picks the file up once it appears.
func TestReloadFileAppears(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routing.json")
	reg := prometheus.NewRegistry()
	s, err := New(Options{ConfigPath: path, Registerer: reg, Gatherer: reg, Logger: quietLogger()})
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

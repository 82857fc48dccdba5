package fleet

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A configuration that fails part way changes nothing: not the published
// tables and not the gateways they share.
func TestFailedApplyChangesNothing(t *testing.T) {
	e0 := enginetest.New(enginetest.Options{Name: "e0", Model: "a"})
	t.Cleanup(e0.Close)
	r0 := config.Replica{Name: "r0", Address: e0.URL()}
	r1 := config.Replica{Name: "r1", Address: "127.0.0.1:1"}
	tooMany := make([]config.Replica, gateway.MaxReplicas+1)
	for i := range tooMany {
		tooMany[i] = config.Replica{Name: fmt.Sprintf("x%d", i), Address: fmt.Sprintf("10.0.0.1:%d", 1000+i)}
	}
	failB := func(s *Fleet) {
		s.newGateway = func(reps []gateway.Replica, opts ...gateway.Option) (*gateway.Gateway, error) {
			if reps[0].Name == "b0" {
				return nil, fmt.Errorf("%w: injected", gateway.ErrInvalid)
			}
			return gateway.New(reps, opts...)
		}
	}
	tests := []struct {
		name   string
		inject func(*Fleet)
		b      []config.Replica
	}{
		{"more than MaxReplicas", func(*Fleet) {}, tooMany},
		{"gateway.New fails for a later model", failB, []config.Replica{{Name: "b0", Address: "127.0.0.1:2"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			s, err := New(Options{Registerer: reg, Logger: quietLogger()})
			require.NoError(t, err)
			require.NoError(t, applyModels(t, s, map[string][]config.Replica{"a": {r0}}))
			before := s.Snapshot()
			tt.inject(s)
			err = applyModels(t, s, map[string][]config.Replica{"a": {r0, r1}, "b": tt.b})
			require.Error(t, err)
			assert.NotContains(t, err.Error(), "gateway: model", "one gateway: prefix")
			assert.Same(t, before, s.Snapshot())
			reps := before.Models["a"].Gateway.Replicas()
			require.Len(t, reps, 1, "the running gateway of model a is untouched")
			assert.Equal(t, "r0", reps[0].Name)
		})
	}
}
func applyModels(t *testing.T, s *Fleet, models map[string][]config.Replica) error {
	t.Helper()
	f := &config.File{Version: config.Version, Models: map[string]config.Model{}}
	for name, reps := range models {
		f.Models[name] = config.Model{Replicas: reps}
	}
	return s.Apply(f)
}

// A reload that unsets a replica's cache_blocks gives it the default
// capacity (its engine reports none), as a fresh replica gets, rather than
// keeping the capacity the old configuration set.
func TestReloadUnsetCacheBlocksTakesDefault(t *testing.T) {
	s, err := New(Options{Registerer: prometheus.NewRegistry(), Logger: quietLogger()})
	require.NoError(t, err)
	capacity := func() map[string]int {
		out := map[string]int{}
		for _, r := range s.Snapshot().Models[testModel].Gateway.Replicas() {
			out[r.Name] = r.CacheBlocks
		}
		return out
	}
	require.NoError(t, applyModels(t, s, map[string][]config.Replica{testModel: {{Name: "fresh", Address: "127.0.0.1:1"}}}))
	def := capacity()["fresh"]
	require.Positive(t, def)
	require.NoError(t, applyModels(t, s, map[string][]config.Replica{testModel: {
		{Name: "fresh", Address: "127.0.0.1:1"}, {Name: "a", Address: "127.0.0.1:2", CacheBlocks: 100}}}))
	require.Equal(t, 100, capacity()["a"])
	require.NoError(t, applyModels(t, s, map[string][]config.Replica{testModel: {
		{Name: "fresh", Address: "127.0.0.1:1"}, {Name: "a", Address: "127.0.0.1:2"}}}))
	assert.Equal(t, map[string]int{"fresh": def, "a": def}, capacity(), "cache_blocks unset: the default, as for a new replica")
}

// TestReloadDropsRemovedEnginesSeries: an engine removed by a reload
// leaves no series of its address (health, ejections, readmissions, probe
// failures, scrape errors), so engines that come and go do not grow
// /metrics; an engine kept keeps its counts.
func TestReloadDropsRemovedEnginesSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, err := New(Options{Registerer: reg, Logger: quietLogger()})
	require.NoError(t, err)
	gone, kept := "http://127.0.0.1:1", "http://127.0.0.1:2"
	require.NoError(t, applyModels(t, s, map[string][]config.Replica{testModel: {{Name: "g", Address: gone}, {Name: "k", Address: kept}}}))
	for _, addr := range []string{gone, kept} {
		s.metrics.healthy.WithLabelValues(addr).Set(1)
		s.metrics.readmissions.WithLabelValues(addr).Inc()
		s.metrics.probeFails.WithLabelValues(addr).Inc()
		s.metrics.scrapeErrors.WithLabelValues(addr).Inc()
		s.metrics.ejections.WithLabelValues(addr, "probe", "timeout").Inc()
		s.metrics.ejections.WithLabelValues(addr, "traffic", "status").Inc()
	}
	series := func(addr string) int {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		n := 0
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "address" && l.GetValue() == addr {
						n++
					}
				}
			}
		}
		return n
	}
	require.Equal(t, 6, series(gone))
	require.NoError(t, applyModels(t, s, map[string][]config.Replica{testModel: {{Name: "k", Address: kept}}}))
	assert.Zero(t, series(gone), "the removed engine's series")
	assert.Equal(t, 6, series(kept), "the kept engine's series")
}

// addressSeries counts the series of reg labelled with address addr.
func addressSeries(t *testing.T, reg *prometheus.Registry, addr string) int {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	n := 0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "address" && l.GetValue() == addr {
					n++
				}
			}
		}
	}
	return n
}

// TestRemovedEngineInFlightLeavesNoSeries: a scrape and a probe in flight
// when a reload removes their engine, and a failure a request to it
// reports after, count nothing: dropStaleSeries ran at the reload, and a
// series created after it would stay for good (pods that come and go
// would grow /metrics without bound).
func TestRemovedEngineInFlightLeavesNoSeries(t *testing.T) {
	arrived, release := make(chan struct{}, 2), make(chan struct{})
	srv := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		arrived <- struct{}{}
		<-release
		w.WriteHeader(http.StatusInternalServerError)
	}))
	reg := prometheus.NewRegistry()
	s, err := New(Options{Registerer: reg, Logger: quietLogger(), ProbeTimeout: time.Minute, EjectAfter: 1, MaxEjectionPercent: 100})
	require.NoError(t, err)
	kept := "http://127.0.0.1:2"
	require.NoError(t, applyModels(t, s, map[string][]config.Replica{testModel: {{Name: "g", Address: srv.URL}, {Name: "k", Address: kept}}}))
	gone := s.Snapshot().Endpoints[srv.URL]
	require.NotNil(t, gone)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.scrapeEngines(context.Background()) }()
	go func() { defer wg.Done(); s.ProbeAll(context.Background()) }()
	<-arrived
	<-arrived
	require.NoError(t, applyModels(t, s, map[string][]config.Replica{testModel: {{Name: "k", Address: kept}}}))
	close(release)
	wg.Wait()
	s.Observe(gone, gone.Health.Failure(true)) // a request's answer, after
	assert.Zero(t, addressSeries(t, reg, srv.URL), "series of the removed engine")
}

// A configuration file that is gone between Reload's look at it and its
// read (a writer that removes it before writing it again, or an operator
// removing it) keeps the running configuration, as a file found missing
// after a load does: it is not read as the empty configuration, which
// would drop every model.
func TestReloadFileGoneMidway(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routing.json")
	write := func(models map[string][]config.Replica) {
		f := &config.File{Version: config.Version, Models: map[string]config.Model{}}
		for name, reps := range models {
			f.Models[name] = config.Model{Replicas: reps}
		}
		b, err := config.Encode(f)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, b, 0o600))
	}
	write(map[string][]config.Replica{testModel: {{Name: "a", Address: "127.0.0.1:1"}}})
	s, err := New(Options{ConfigPath: path, Registerer: prometheus.NewRegistry(), Logger: quietLogger()})
	require.NoError(t, err)
	require.Contains(t, s.Snapshot().Models, testModel)

	write(map[string][]config.Replica{testModel: {{Name: "a", Address: "127.0.0.1:1"}, {Name: "b", Address: "127.0.0.1:2"}}})
	s.readConfig = func(p string) ([]byte, error) {
		require.NoError(t, os.Remove(p)) // after Reload's stat
		return os.ReadFile(p)
	}
	changed, err := s.Reload()
	require.NoError(t, err)
	assert.False(t, changed)
	require.Contains(t, s.Snapshot().Models, testModel, "the running configuration stays")

	// Written again, it is read.
	s.readConfig = os.ReadFile
	write(map[string][]config.Replica{testModel: {{Name: "a", Address: "127.0.0.1:1"}, {Name: "b", Address: "127.0.0.1:2"}}})
	changed, err = s.Reload()
	require.NoError(t, err)
	assert.True(t, changed)
	assert.Len(t, s.Snapshot().Models[testModel].Order, 2)
}

// A rewrite in place that leaves the file's size and modification time
// as they were (two writes in one tick of the file system's clock, the
// first loaded between them) is still loaded: a file loaded within
// racyWindow of its modification time is read again at the next Reload,
// and applied when its contents differ. Contents that do not differ are
// not applied again.
func TestReloadRacyRewrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routing.json")
	write := func(addr string, mod time.Time) {
		f := &config.File{Version: config.Version, Models: map[string]config.Model{testModel: {Replicas: []config.Replica{{Name: "a", Address: addr}}}}}
		b, err := config.Encode(f)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, b, 0o600))
		require.NoError(t, os.Chtimes(path, mod, mod))
	}
	// An hour ahead: within racyWindow however long the test takes (a
	// time in the future is as racy as one just past).
	mod := time.Now().Add(time.Hour).Truncate(time.Second)
	write("127.0.0.1:1", mod)
	loads := 0
	s, err := New(Options{ConfigPath: path, Registerer: prometheus.NewRegistry(), Logger: quietLogger(), OnReload: func(ReloadResult) { loads++ }})
	require.NoError(t, err)
	addr := func() string { return s.Snapshot().Models[testModel].ByName["a"].Base }
	require.Equal(t, "http://127.0.0.1:1", addr())

	write("127.0.0.1:2", mod) // same size, same time
	changed, err := s.Reload()
	require.NoError(t, err)
	assert.True(t, changed, "the rewrite is read")
	assert.Equal(t, "http://127.0.0.1:2", addr())
	assert.Equal(t, 2, loads)

	changed, err = s.Reload() // read again (still racy), the same contents
	require.NoError(t, err)
	assert.False(t, changed)
	assert.Equal(t, 2, loads, "the same contents are not applied again")
}

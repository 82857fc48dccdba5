package fleet

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/internal/memtest"
)

// hostilePage returns a page of about size bytes, every line a series of
// family (one the scrapes read), each with its own labels.
func hostilePage(family string, size int) []byte {
	var b bytes.Buffer
	for i := 0; ; i++ {
		l := fmt.Sprintf("%s{model=%q,replica=\"r%d\",a=\"1\",b=\"1\",c=\"1\"} 1\n", family, testModel, i)
		if b.Len()+len(l) > size {
			return b.Bytes()
		}
		b.WriteString(l)
	}
}

// TestScrapeMemory measures the heap a round of scrapes takes when every
// engine and every peer sends a full page (8 MiB) of the series the
// scrapes read: n engines and n peers. Run with EXA_MEASURE=1; EXA_N sets
// n (16).
func TestScrapeMemory(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("a measurement: EXA_MEASURE=1")
	}
	n := envInt("EXA_N", 16)
	size := envInt("EXA_PAGE", maxMetricsBytes)
	engine := hostilePage("vllm:num_requests_running", size)
	peer := hostilePage(MetricPendingPrefill, size)
	serve := func(page []byte) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(page) })
	}
	var reps []config.Replica
	var peers []string
	for i := range n {
		e := newHTTPTestServer(t, serve(engine))
		reps = append(reps, config.Replica{Name: "e" + strconv.Itoa(i), Address: e.URL, CacheBlocks: 100})
		peers = append(peers, newHTTPTestServer(t, serve(peer)).URL)
	}
	s, err := New(Options{Logger: quietLogger(), ScrapeInterval: time.Hour, ProbeInterval: time.Hour,
		DiscoverInterval: time.Hour, PeerScrapeInterval: time.Minute, ProbeTimeout: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	cfg := config.Model{Mode: gateway.ModeCacheAware, Replicas: reps, Peers: peers}
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: cfg}}))
	for round := range 3 {
		var held uint64
		var p uint64
		rss := memtest.PeakRSS(func() { p = memtest.PeakHeap(func() { s.ScrapeAll(context.Background()) }) })
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		held = m.HeapAlloc
		errs := 0
		for _, ep := range s.state.Load().Endpoints {
			if _, _, ok, _ := ep.SnapshotLoad(); !ok {
				errs++
			}
		}
		t.Logf("round %d: %d engines and %d peers, each a %d KiB page: peak heap +%.0f MiB (RSS +%.0f MiB), heap after %0.f MiB, peers' counts kept %d, engines with a failed scrape %d",
			round, n, n, size>>10, float64(p)/(1<<20), float64(rss)/(1<<20), float64(held)/(1<<20), s.peerCountsKept(), errs)
	}
}

// peerCountsKept returns how many replica counts the peers' table holds.
func (s *Fleet) peerCountsKept() int {
	s.peers.mu.Lock()
	defer s.peers.mu.Unlock()
	n := 0
	for _, p := range s.peers.peers {
		for _, c := range p.counts {
			n += len(c)
		}
	}
	return n
}

// A peer's counts are kept only at this gateway's own replicas of models
// with peers, and a peer whose page holds more than maxKeptBytes of the
// series read fails its scrape alone: another peer is still heard.
func TestPeerPagesBounded(t *testing.T) {
	honest := "# TYPE exa_gateway_pending_prefill_blocks gauge\n" +
		"exa_gateway_pending_prefill_blocks{model=\"m1\",replica=\"e0\"} 5\n" +
		"exa_gateway_pending_prefill_blocks{model=\"m1\",replica=\"elsewhere\"} 7\n" +
		"exa_gateway_pending_prefill_blocks{model=\"other\",replica=\"e0\"} 9\n" +
		"junk_series 1\n"
	big := hostilePage(MetricPendingPrefill, 2*maxKeptBytes)
	serve := func(page []byte) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(page) })
	}
	good := newHTTPTestServer(t, serve([]byte(honest)))
	bad := newHTTPTestServer(t, serve(big))
	e0 := newHTTPTestServer(t, serve([]byte("vllm:num_requests_waiting 0\n")))
	s, err := New(Options{Logger: quietLogger(), ScrapeInterval: time.Hour, ProbeInterval: time.Hour,
		DiscoverInterval: time.Hour, PeerScrapeInterval: time.Minute, ProbeTimeout: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	cfg := config.Model{Mode: gateway.ModeCacheAware, Replicas: []config.Replica{{Name: "e0", Address: e0.URL, CacheBlocks: 100}},
		Peers: []string{good.URL, bad.URL}}
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: cfg}}))
	s.ScrapeAll(context.Background())
	s.peers.mu.Lock()
	g, b := s.peers.peers[good.URL], s.peers.peers[bad.URL]
	require.NotNil(t, g)
	require.NotNil(t, b)
	assert.Equal(t, map[string]map[string]int{testModel: {"e0": 5}}, g.counts, "only this gateway's own replica of a model with peers")
	assert.True(t, g.up)
	assert.False(t, b.up, "a page past the bound fails its scrape")
	assert.Nil(t, b.counts)
	s.peers.mu.Unlock()
	assert.Zero(t, s.scrapeBudget.Used(), "every page's share returned")
}

// TestDiscoverMemory measures the heap a round of model-list discovery
// (DiscoverAll and DiscoverModelInfo, as Run calls them) takes when every
// engine sends a full list (4 MiB, 16,384 adapters): n engines (EXA_N,
// 16). Run with EXA_MEASURE=1.
func TestDiscoverMemory(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("a measurement: EXA_MEASURE=1")
	}
	n := envInt("EXA_N", 16)
	var b bytes.Buffer
	b.WriteString(`{"object":"list","data":[`)
	for i := 0; i < maxServedModels; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":"adapter-%08d-%0130d","object":"model","root":"/adapters/%0030d","parent":"m1"}`, i, i, i)
	}
	b.WriteString(`]}`)
	list := b.Bytes()
	require.LessOrEqual(t, len(list), maxModelsBytes)
	var reps []config.Replica
	for i := range n {
		e := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(list) }))
		reps = append(reps, config.Replica{Name: "e" + strconv.Itoa(i), Address: e.URL, CacheBlocks: 100})
	}
	s, err := New(Options{Logger: quietLogger(), ScrapeInterval: time.Hour, ProbeInterval: time.Hour,
		DiscoverInterval: time.Hour, ProbeTimeout: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {Mode: gateway.ModeCacheAware, Replicas: reps}}}))
	rounds := envInt("EXA_ROUNDS", 3)
	for round := range rounds {
		var p uint64
		rss := memtest.PeakRSS(func() {
			p = memtest.PeakHeap(func() {
				var wg sync.WaitGroup
				wg.Add(2)
				go func() { defer wg.Done(); s.DiscoverAll(context.Background()) }()
				go func() { defer wg.Done(); s.DiscoverModelInfo(context.Background()) }()
				wg.Wait()
			})
		})
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		failed := 0
		for _, ep := range s.state.Load().Endpoints {
			if a := ep.lora.served.Load(); a == nil || a.err != "" {
				failed++
			}
		}
		adapters := 0
		for _, ep := range s.state.Load().Endpoints {
			if a := ep.lora.served.Load(); a != nil {
				adapters += len(a.parents)
			}
		}
		t.Logf("round %d: %d engines, each a %.1f MiB list: peak heap +%.0f MiB (RSS +%.0f MiB), heap after %.0f MiB, engines whose adapter discovery failed %d, adapters kept %d",
			round, n, float64(len(list))/(1<<20), float64(p)/(1<<20), float64(rss)/(1<<20), float64(m.HeapAlloc)/(1<<20), failed, adapters)
	}
}

// The entries kept of all engines' model lists are bounded together: a
// list that would take a table past maxDiscoveredEntries is refused and
// the engine's last list kept.
func TestDiscoveredEntriesBounded(t *testing.T) {
	old := maxDiscoveredEntries
	maxDiscoveredEntries = 5
	t.Cleanup(func() { maxDiscoveredEntries = old })
	list := func(prefix string) []byte {
		return []byte(`{"object":"list","data":[{"id":"` + prefix + `-base","root":"/w"},{"id":"` + prefix + `-a","parent":"` + prefix + `-base"},{"id":"` + prefix + `-b","parent":"` + prefix + `-base"},{"id":"` + prefix + `-c","parent":"` + prefix + `-base"}]}`)
	}
	var reps []config.Replica
	for i := range 3 {
		body := list("e" + strconv.Itoa(i))
		e := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(body) }))
		reps = append(reps, config.Replica{Name: "e" + strconv.Itoa(i), Address: e.URL, CacheBlocks: 100})
	}
	s, err := New(Options{Logger: quietLogger(), ScrapeInterval: time.Hour, ProbeInterval: time.Hour, DiscoverInterval: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {Mode: gateway.ModeCacheAware, Replicas: reps}}}))
	for range 3 {
		s.DiscoverAll(context.Background())
		s.DiscoverModelInfo(context.Background())
	}
	adapters, refused := 0, 0
	for _, ep := range s.state.Load().Endpoints {
		a := ep.lora.served.Load()
		require.NotNil(t, a)
		adapters += len(a.parents)
		if a.err != "" {
			refused++
			assert.Contains(t, a.err, "past 5")
		}
	}
	assert.Equal(t, 3, adapters, "one engine's 3 adapters; a second's would make 6")
	assert.Equal(t, 2, refused)
	s.modelInfo.mu.Lock()
	models := 0
	for _, m := range s.modelInfo.m {
		models += len(m)
	}
	s.modelInfo.mu.Unlock()
	assert.Equal(t, 3, models, "one base model an engine, 3 within 5")
	maxDiscoveredEntries = 2
	s.DiscoverModelInfo(context.Background())
	s.modelInfo.mu.Lock()
	models = 0
	for _, m := range s.modelInfo.m {
		models += len(m)
	}
	s.modelInfo.mu.Unlock()
	assert.Equal(t, 3, models, "a bound lowered later refuses new lists but keeps the last ones")
}

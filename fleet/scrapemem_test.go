package fleet

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime"
	rtmetrics "runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
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

// peakHeap runs f while sampling the live heap every 100µs, and returns
// the largest sample above the heap live before f.
func peakHeap(f func()) uint64 {
	runtime.GC()
	s := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	rtmetrics.Read(s)
	base := s[0].Value.Uint64()
	var peak atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		for {
			rtmetrics.Read(s)
			if v := s[0].Value.Uint64(); v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Microsecond):
			}
		}
	}()
	f()
	close(stop)
	wg.Wait()
	if peak.Load() < base {
		return 0
	}
	return peak.Load() - base
}

// TestScrapeMemory measures the heap a round of scrapes takes when every
// engine and every peer sends a full page (8 MiB) of the series the
// scrapes read: n engines and n peers. Run with EXA_MEASURE=1; EXA_N sets
// n (16).
func TestScrapeMemory(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("a measurement: EXA_MEASURE=1")
	}
	n := 16
	if v, err := strconv.Atoi(os.Getenv("EXA_N")); err == nil {
		n = v
	}
	size := maxMetricsBytes
	if v, err := strconv.Atoi(os.Getenv("EXA_PAGE")); err == nil {
		size = v
	}
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
		p := peakHeap(func() { s.ScrapeAll(context.Background()) })
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
		t.Logf("round %d: %d engines and %d peers, each a %d KiB page: peak heap +%.0f MiB, heap after %0.f MiB, peers' counts kept %d, engines with a failed scrape %d",
			round, n, n, size>>10, float64(p)/(1<<20), float64(held)/(1<<20), s.peerCountsKept(), errs)
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

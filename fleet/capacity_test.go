package fleet

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/keys"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseKVTokens(t *testing.T) {
	tests := []struct {
		name, text string
		want       int64
	}{
		{"vllm", `vllm:cache_config_info{block_size="16",num_gpu_blocks="64",enable_prefix_caching="True"} 1` + "\n", 1024},
		{"sglang pages", `sglang:cache_config_info{page_size="1",num_pages="5000"} 1` + "\n", 5000},
		{"vllm first", `vllm:cache_config_info{block_size="16",num_gpu_blocks="10"} 1` + "\n" +
			`sglang:cache_config_info{page_size="1",num_pages="5000"} 1` + "\n", 160},
		{"largest sample", `vllm:cache_config_info{block_size="16",num_gpu_blocks="10",engine="0"} 1` + "\n" +
			`vllm:cache_config_info{block_size="16",num_gpu_blocks="20",engine="1"} 1` + "\n", 320},
		{"none", "vllm:num_requests_waiting 3\n", 0},
		{"no block size", `vllm:cache_config_info{num_gpu_blocks="64"} 1` + "\n", 0},
		{"not a number", `vllm:cache_config_info{block_size="16",num_gpu_blocks="many"} 1` + "\n", 0},
		{"zero", `vllm:cache_config_info{block_size="16",num_gpu_blocks="0"} 1` + "\n", 0},
		{"negative", `vllm:cache_config_info{block_size="16",num_gpu_blocks="-64"} 1` + "\n", 0},
		{"overflowing product", `vllm:cache_config_info{block_size="1099511627776",num_gpu_blocks="1099511627776"} 1` + "\n", 0},
		{"beyond int64", `vllm:cache_config_info{block_size="16",num_gpu_blocks="99999999999999999999"} 1` + "\n", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := expfmt.NewTextParser(model.UTF8Validation)
			fams, err := p.TextToMetricFamilies(strings.NewReader(tt.text))
			require.NoError(t, err)
			assert.Equal(t, tt.want, parseKVTokens(fams, cacheInfos))
		})
	}
}

func TestCacheBlocksFor(t *testing.T) {
	assert.Equal(t, 0, cacheBlocksFor(0, false, 16, 64))
	assert.Equal(t, 64, cacheBlocksFor(1024, false, 16, 64), "1024 tokens of ~4 bytes in 64-byte blocks")
	assert.Equal(t, 64, cacheBlocksFor(1024, true, 16, 64), "exact: 16 tokens a block")
	assert.Equal(t, 1, cacheBlocksFor(3, true, 16, 64), "at least one block")
	assert.Equal(t, MaxReportedCacheBlocks, cacheBlocksFor(maxKVTokens, false, 16, 1), "clamped")
	assert.Equal(t, 262144, MaxReportedCacheBlocks)
	assert.Equal(t, MaxReportedCacheBlocks, cacheBlocksFor(1<<22, true, 16, 64), "4,194,304 tokens: the cap")
	assert.Equal(t, MaxReportedCacheBlocks, cacheBlocksFor(1<<22+16, true, 16, 64), "one block more: capped")
}

// metricsPage serves a /metrics page that the test can change.
type metricsPage struct {
	mu   sync.Mutex
	text string
	n    atomic.Int64 // scrapes served
}

func (p *metricsPage) set(s string) { p.mu.Lock(); p.text = s; p.mu.Unlock() }

func (p *metricsPage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r.URL.Path == "/metrics" {
		p.n.Add(1)
		_, _ = io.WriteString(w, p.text)
	}
}

// A replica whose configuration leaves cache_blocks unset takes its
// engine's KV-cache size (vllm:cache_config_info) once a scrape reports
// it, in the model's index blocks, and follows a change of it; a replica
// configured with cache_blocks keeps them; a scrape that reports the same
// size again replaces nothing (the index is kept); an engine added by a
// configuration is scraped for its size at once, without waiting for the
// next scrape.
func TestCacheBlocksFromEngine(t *testing.T) {
	var p0, p1, p2 metricsPage
	info := func(blocks string) string {
		return "vllm:num_requests_waiting 0\n" + `vllm:cache_config_info{block_size="16",num_gpu_blocks="` + blocks + `"} 1` + "\n"
	}
	p0.set("vllm:num_requests_waiting 0\n") // no size reported yet
	p1.set(info("64"))
	p2.set(info("32"))
	e0, e1, e2 := newHTTPTestServer(t, &p0), newHTTPTestServer(t, &p1), newHTTPTestServer(t, &p2)
	s, err := New(Options{Logger: quietLogger(), ScrapeInterval: time.Hour, ProbeInterval: time.Hour, DiscoverInterval: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	cfg := config.Model{Mode: gateway.ModeCacheAware, Replicas: []config.Replica{
		{Name: "e0", Address: e0.URL}, {Name: "e1", Address: e1.URL, CacheBlocks: 100}}}
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: cfg}}))
	capacity := func() map[string]int {
		out := map[string]int{}
		for _, r := range s.Snapshot().Models[testModel].Gateway.Replicas() {
			out[r.Name] = r.CacheBlocks
		}
		return out
	}
	s.ScrapeAll(context.Background())
	assert.Equal(t, map[string]int{"e0": 16384, "e1": 100}, capacity(), "no size reported: the default; configured: kept")

	p0.set(info("64"))
	s.ScrapeAll(context.Background())
	assert.Equal(t, map[string]int{"e0": 64, "e1": 100}, capacity(), "64 blocks of 16 tokens, 64-byte key blocks")

	gw := s.Snapshot().Models[testModel].Gateway
	key := keys.PrefixKey(strings.Repeat("a shared system prompt. ", 20), "", "")
	d, err := gw.RouteWith(key, gateway.Target{})
	require.NoError(t, err)
	d.Done(gateway.DoneInfo{})
	cached := func(name string) int {
		for _, r := range gw.Replicas() {
			if r.Name == name {
				return r.CachedBlocks
			}
		}
		return -1
	}
	before := cached(d.Replica)
	require.Positive(t, before)
	s.ScrapeAll(context.Background())
	assert.Equal(t, before, cached(d.Replica), "the same size again: nothing replaced")

	p0.set(info("128"))
	s.ScrapeAll(context.Background())
	assert.Equal(t, 128, capacity()["e0"], "a new size is taken up")

	// While Run runs (its loops an hour apart), an engine added by a
	// configuration is scraped for its size at once.
	// The counts are read before Run starts, whose first scrape may end
	// before this goroutine runs again.
	n0, n1 := p0.n.Load(), p1.n.Load()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); _ = s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-ran })
	// Wait for Run's first scrape of e0 and e1, whose list of engines
	// was taken before e2 exists: its next is an hour away.
	require.Eventually(t, func() bool { return p0.n.Load() > n0 && p1.n.Load() > n1 }, 10*time.Second, time.Millisecond)
	cfg.Replicas = append(cfg.Replicas, config.Replica{Name: "e2", Address: e2.URL})
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: cfg}}))
	require.Eventually(t, func() bool { return capacity()["e2"] == 32 }, 10*time.Second, time.Millisecond,
		"an added engine's size, learnt before the loop's next scrape: %v", capacity())
	assert.Equal(t, map[string]int{"e0": 128, "e1": 100, "e2": 32}, capacity())
}

// A Fleet that is not run makes no request when a configuration adds an
// engine (an engine's handler may answer every path).
func TestApplyWithoutRunScrapesNothing(t *testing.T) {
	var hits atomic.Int64
	e := newHTTPTestServer(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	s, err := New(Options{Logger: quietLogger()})
	require.NoError(t, err)
	cfg := config.Model{Mode: gateway.ModeCacheAware, Replicas: []config.Replica{{Name: "e0", Address: e.URL}}}
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: cfg}}))
	cfg.Replicas = append(cfg.Replicas, config.Replica{Name: "e1", Address: e.URL + "/v2"})
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: cfg}}))
	// Correct code never fails this; the code before the fix scraped the
	// added engines within a millisecond or two on loopback.
	assert.Never(t, func() bool { return hits.Load() > 0 }, 300*time.Millisecond, time.Millisecond)
}

// The recorded llm-d-inference-sim page reports its size as vLLM does.
func TestParseKVTokensRecordedPage(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "metrics", "llm-d-inference-sim-v0.10.2-busy.txt"))
	require.NoError(t, err)
	res, err := parseEngineScrapeAs(bytes.NewReader(b), config.EngineAuto, nil)
	require.NoError(t, err)
	assert.Equal(t, int64(1024*16), res.kvTokens)
}

// FuzzParseKVTokens feeds mutated metrics pages to the scrape parser: it
// never panics, the size it reads is 0 or within 1..maxKVTokens, and the
// capacity made of it is at most MaxReportedCacheBlocks and one a gateway
// accepts. Seeds: the recorded pages
// in testdata/metrics and TestParseKVTokens's texts.
func FuzzParseKVTokens(f *testing.F) {
	for _, b := range recordedPages(f) {
		f.Add(b)
	}
	for _, s := range []string{
		`vllm:cache_config_info{block_size="16",num_gpu_blocks="64"} 1` + "\n",
		`sglang:cache_config_info{page_size="1",num_pages="5000"} 1` + "\n",
		`vllm:cache_config_info{block_size="1099511627776",num_gpu_blocks="1099511627776"} 1` + "\n",
		`vllm:cache_config_info{block_size="-1",num_gpu_blocks="99999999999999999999"} 1` + "\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, page []byte) {
		res, err := parseEngineScrapeAs(bytes.NewReader(page), config.EngineAuto, nil)
		if err != nil {
			return
		}
		if res.kvTokens < 0 || res.kvTokens > maxKVTokens {
			t.Fatalf("kvTokens %d out of range", res.kvTokens)
		}
		for _, exact := range []bool{false, true} {
			cb := cacheBlocksFor(res.kvTokens, exact, 16, 64)
			if res.kvTokens == 0 {
				require.Zero(t, cb)
				continue
			}
			require.LessOrEqual(t, cb, MaxReportedCacheBlocks)
			_, err := gateway.New([]gateway.Replica{{Name: "r", CacheBlocks: cb}})
			require.NoError(t, err, "capacity %d from %d tokens", cb, res.kvTokens)
		}
	})
}

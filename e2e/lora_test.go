//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// LoRA adapters end to end: two llm-d-inference-sim engines serving the
// same two adapters of simModel with one adapter slot each (--max-loras
// 1). The simulator (v0.10.2, pkg/llm-d-inference-sim/lora.go and
// simulator.go) runs a request only when its adapter is loaded or a slot
// can be freed, that is when no running request uses the loaded adapter;
// otherwise the request waits in the queue (listed in
// waiting_lora_adapters), and queued requests of loaded adapters go first.
// Loading itself takes no time there: the cost of a wrong route is the
// wait for a slot.
var loraAdapters = []string{"sql-lora", "chat-lora"}

const (
	loraEngines     = 2
	loraRequests    = 160 // per mode
	loraWorkers     = 8
	loraOutput      = 30 // tokens per answer, 5 ms each
	loraSampleEvery = 50 * time.Millisecond
)

func loraSimArgs(port int) []string {
	args := []string{"--port", fmt.Sprint(port), "--model", simModel, "--force-dummy-tokenizer",
		"--max-loras", "1", "--max-num-seqs", "8", "--time-to-first-token", "20ms", "--inter-token-latency", "5ms",
		"--max-model-len", "8192", "--zmq-endpoint=", "--seed", "1", "--v", "0", "--lora-modules"}
	for _, a := range loraAdapters {
		args = append(args, fmt.Sprintf(`{"name":%q,"path":"/adapters/%s","base_model_name":%q}`, a, a, simModel))
	}
	return args
}

// loraCluster is a cluster of loraEngines engines serving the adapters.
type loraCluster struct{ *cluster }

func newLoRACluster(t *testing.T, mode string) *loraCluster {
	c := &loraCluster{startCluster(t, mode, loraEngines, loraSimArgs)}
	c.waitReady()
	return c
}

// waitReady waits until every engine is in rotation and the gateway lists
// the adapters it discovered on them.
func (c *loraCluster) waitReady() {
	c.waitAllHealthy()
	waitFor(c.t, 20*time.Second, "gateway to list the adapters", func() bool {
		ids := map[string]string{}
		for _, m := range gatewayModels(c.t, c.gw.url) {
			ids[m.ID] = m.Parent
		}
		for _, a := range loraAdapters {
			if ids[a] != simModel {
				return false
			}
		}
		return true
	})
}

type listedModel struct {
	ID     string `json:"id"`
	Parent string `json:"parent"`
}

func gatewayModels(t *testing.T, url string) []listedModel {
	resp, err := http.Get(url + "/v1/models")
	require.NoError(t, err)
	defer resp.Body.Close()
	var l struct {
		Data []listedModel `json:"data"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&l))
	return l.Data
}

// loraWaiting reads an engine's /metrics: the adapters of the current
// vllm:lora_requests_info series (largest value) that wait for a slot, and
// vllm:num_requests_waiting. The simulator stamps series to the second, so
// several may tie; their waiting lists are merged (an upper bound, the
// same for every mode). With at most max-num-seqs requests in flight per
// engine, as here, a request waits only for an adapter slot, so the
// waiting count is the unambiguous measure.
func loraWaiting(base string) (map[string]bool, float64, error) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, 0, err
	}
	queued := 0.0
	for _, m := range fams["vllm:num_requests_waiting"].GetMetric() {
		queued += m.GetGauge().GetValue()
	}
	best := -1.0
	waiting := map[string]bool{}
	for _, m := range fams["vllm:lora_requests_info"].GetMetric() {
		v := m.GetGauge().GetValue()
		if v < best {
			continue
		}
		if v > best {
			best, waiting = v, map[string]bool{}
		}
		for _, l := range m.GetLabel() {
			if l.GetName() == "waiting_lora_adapters" {
				for _, a := range strings.Split(l.GetValue(), ",") {
					if a = strings.TrimSpace(a); a != "" {
						waiting[a] = true
					}
				}
			}
		}
	}
	return waiting, queued, nil
}

// queueSeconds sums an engine's vllm:request_queue_time_seconds: the time
// its requests spent queued before they ran.
func queueSeconds(t *testing.T, base string) float64 {
	return sumSeries(metricFamilies(t, base)["vllm:request_queue_time_seconds"], nil, func(m *dto.Metric) float64 {
		return m.GetHistogram().GetSampleSum()
	})
}

type loraPhase struct {
	mode          string
	mean, p90     time.Duration
	waitingShare  float64 // of engine samples with an adapter waiting
	queuedMean    float64 // requests waiting per engine sample
	queue         float64 // engine queue seconds
	byAdapter     map[string]map[string]int
	ok, samples   int
	waitingCounts int
}

// runLoRA sends loraRequests streamed chats, each naming one of the
// adapters at random (seeded), with loraWorkers clients, sampling every
// engine's adapter state meanwhile.
func (c *loraCluster) runLoRA(mode string) loraPhase {
	ph := loraPhase{mode: mode, byAdapter: map[string]map[string]int{}}
	rng := rand.New(rand.NewPCG(3, 5))
	models := make([]string, loraRequests)
	for i := range models {
		models[i] = loraAdapters[rng.IntN(len(loraAdapters))]
	}
	queue0 := 0.0
	for _, s := range c.sims {
		queue0 += queueSeconds(c.t, s.url())
	}
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		tick := time.NewTicker(loraSampleEvery)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for _, s := range c.sims {
				w, q, err := loraWaiting(s.url())
				if err != nil {
					continue
				}
				ph.samples++
				ph.queuedMean += q
				if len(w) > 0 {
					ph.waitingCounts++
				}
			}
		}
	}()
	results := make([]result, len(models))
	next := make(chan int)
	var wg sync.WaitGroup
	for range loraWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				results[i] = streamChatModel(ctx, c.gw.url, models[i], "You are a helpful assistant.", fmt.Sprintf("Question %d", i), loraOutput)
				cancel()
			}
		}()
	}
	for i := range models {
		next <- i
	}
	close(next)
	wg.Wait()
	close(stop)
	sampler.Wait()
	var ttfts []time.Duration
	var sum time.Duration
	for i, r := range results {
		require.True(c.t, r.status == http.StatusOK && r.done, "%s request %d (%s): status %d, error %q, net %v", mode, i, models[i], r.status, r.errText, r.netErr)
		ph.ok++
		ttfts = append(ttfts, r.ttft)
		sum += r.ttft
		if ph.byAdapter[models[i]] == nil {
			ph.byAdapter[models[i]] = map[string]int{}
		}
		ph.byAdapter[models[i]][r.replica]++
	}
	ph.mean, ph.p90 = sum/time.Duration(len(ttfts)), percentile(ttfts, 0.9)
	if ph.samples > 0 {
		ph.waitingShare = float64(ph.waitingCounts) / float64(ph.samples)
		ph.queuedMean /= float64(ph.samples)
	}
	for _, s := range c.sims {
		ph.queue += queueSeconds(c.t, s.url())
	}
	ph.queue -= queue0
	return ph
}

// TestLoRAAffinityBeatsRoundRobin: the same adapter workload through the
// real exa binary, round-robin then cache-aware, on fresh engines each
// time. Round-robin sends both adapters to both engines, whose one slot
// makes one adapter wait while the other runs; cache-aware keeps each
// adapter on an engine of its own. Measured: the share of engine samples
// with an adapter waiting, the engines' queue time, and the clients' time
// to first token.
func TestLoRAAffinityBeatsRoundRobin(t *testing.T) {
	c := newLoRACluster(t, "round_robin")
	var phases []loraPhase
	for i, mode := range []string{"round_robin", "cache_aware"} {
		if i > 0 {
			for _, s := range c.sims {
				s.kill()
			}
			for _, s := range c.sims {
				s.start()
			}
			exa(t, c.cfg, "serve", "routing", "set", simModel, "--mode", mode)
			waitFor(t, 10*time.Second, "gateway to reload mode "+mode, func() bool {
				return c.gw.stats(t).Models[simModel].Mode == mode
			})
			c.waitReady()
		}
		ph := c.runLoRA(mode)
		phases = append(phases, ph)
		t.Logf("%-11s TTFT mean %v p90 %v; %d engine samples: an adapter waiting in %.1f%%, %.2f requests waiting on average; engine queue time %.2fs; requests by adapter and engine %v",
			mode, ph.mean.Round(time.Millisecond), ph.p90.Round(time.Millisecond), ph.samples, 100*ph.waitingShare, ph.queuedMean, ph.queue, ph.byAdapter)
	}
	rr, ca := phases[0], phases[1]
	assert.Less(t, ca.waitingShare, rr.waitingShare, "fewer samples with an adapter waiting")
	assert.Less(t, ca.queuedMean, rr.queuedMean, "fewer requests waiting")
	assert.Less(t, ca.queue, rr.queue, "less engine queue time")
	assert.Less(t, ca.mean, rr.mean, "lower mean TTFT")
	// Cache-aware keeps each adapter mostly on one engine.
	for a, by := range ca.byAdapter {
		n, top := 0, 0
		for _, k := range by {
			n += k
			top = max(top, k)
		}
		assert.GreaterOrEqual(t, float64(top)/float64(n), 0.8, "adapter %s by engine: %v", a, by)
	}
	st := c.gw.stats(t)
	for _, e := range st.Engines {
		require.NotNil(t, e.Adapters, e.Address)
		assert.Equal(t, 1, e.Adapters.MaxLoras, e.Address)
		assert.ElementsMatch(t, loraAdapters, e.Adapters.Served, e.Address)
	}
}

// TestLoRAResolution: through the real binary, a request naming an
// adapter reaches an engine with its model field unchanged (the engine
// answers as the adapter), and a name that is neither a model nor an
// adapter gets 404 naming it.
func TestLoRAResolution(t *testing.T) {
	c := newLoRACluster(t, "cache_aware")
	post := func(model string) (int, map[string]any) {
		body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 3,
			"messages": []map[string]string{{"role": "user", "content": "hello"}}})
		resp, err := http.Post(c.gw.url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		var out map[string]any
		require.NoError(t, json.Unmarshal(b, &out), "%s", b)
		return resp.StatusCode, out
	}
	for _, a := range loraAdapters {
		code, out := post(a)
		require.Equal(t, http.StatusOK, code, "%v", out)
		assert.Equal(t, a, out["model"], "the engine served the adapter")
	}
	code, out := post("no-such-lora")
	require.Equal(t, http.StatusNotFound, code)
	e := out["error"].(map[string]any)
	assert.Equal(t, "model_not_found", e["code"])
	assert.Contains(t, e["message"], `"no-such-lora" is not served by this gateway`)
	ids := []string{}
	for _, m := range gatewayModels(t, c.gw.url) {
		ids = append(ids, m.ID)
	}
	slices.Sort(ids)
	want := append([]string{simModel}, loraAdapters...)
	slices.Sort(want)
	assert.Equal(t, want, ids)
}

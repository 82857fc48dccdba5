package sim

import (
	"bytes"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// listWorkload replays a fixed list of requests.
type listWorkload struct {
	bt   int
	reqs []Request
}

func (w *listWorkload) Name() string     { return "list" }
func (w *listWorkload) BlockTokens() int { return w.bt }
func (w *listWorkload) Open(uint64) (Stream, error) {
	return &listStream{reqs: w.reqs}, nil
}

type listStream struct {
	reqs []Request
	i    int
}

func (s *listStream) Next(r *Request) error {
	if s.i == len(s.reqs) {
		return io.EOF
	}
	*r = s.reqs[s.i]
	s.i++
	return nil
}
func (s *listStream) Len() int     { return len(s.reqs) }
func (s *listStream) Close() error { return nil }

// req is a request of 4 blocks of 16 tokens, content c, at ms.
func loraReq(ms int, adapter string, c uint64, out int) Request {
	return Request{Arrival: time.Duration(ms) * time.Millisecond, InputTokens: 64, OutputTokens: out,
		Blocks: []uint64{c, c + 1, c + 2, c + 3}, Adapter: adapter}
}

func runList(t *testing.T, replicas, maxLoras int, reqs ...Request) Result {
	t.Helper()
	p, err := PolicyByName("round_robin")
	require.NoError(t, err)
	rep, err := Run(Config{Workload: &listWorkload{bt: 16, reqs: reqs}, Replicas: replicas, MaxLoras: maxLoras,
		Seed: 1, Policies: []Policy{p}})
	require.NoError(t, err)
	r := rep.Results[0]
	require.Equal(t, len(reqs), r.Completed)
	return r
}

// TestLoRASlotsSerialise: on one replica with one slot, a request for b
// waits while a runs, and a later request for a passes it (vLLM skips the
// waiting request while max_loras adapters are scheduled); each switch
// loads an adapter. With two slots nothing waits.
func TestLoRASlotsSerialise(t *testing.T) {
	reqs := []Request{loraReq(0, "a", 100, 200), loraReq(1, "b", 200, 200), loraReq(2, "a", 300, 200)}
	one := runList(t, 1, 1, reqs...)
	require.NotNil(t, one.LoRA)
	assert.EqualValues(t, 3, one.LoRA.Requests)
	assert.EqualValues(t, 2, one.LoRA.Loads, "a, then b")
	assert.EqualValues(t, 1, one.LoRA.SlotWaits, "b waited")
	// b waited for both a's to finish: about 200 decode steps.
	assert.Greater(t, one.LoRA.SlotWaitMean, 0.5)
	assert.Greater(t, one.TTFT.Max, 0.5)
	assert.EqualValues(t, 2, one.LoRA.AdaptersPerReplica)

	two := runList(t, 1, 2, reqs...)
	assert.EqualValues(t, 2, two.LoRA.Loads)
	assert.Zero(t, two.LoRA.SlotWaits)
	assert.Less(t, two.TTFT.Max, 0.2)

	// The base model never waits for a slot.
	base := runList(t, 1, 1, loraReq(0, "a", 100, 200), loraReq(1, "", 200, 200))
	assert.Zero(t, base.LoRA.SlotWaits)
	assert.EqualValues(t, 1, base.LoRA.Loads)
	assert.Less(t, base.TTFT.Max, 0.2)
}

// TestLoRALoadCost: a step that loads an adapter takes AdapterLoad
// longer; one that reuses the loaded adapter does not.
func TestLoRALoadCost(t *testing.T) {
	ttft := func(load time.Duration, adapters ...string) float64 {
		var reqs []Request
		for i, a := range adapters {
			reqs = append(reqs, loraReq(1000*i, a, uint64(100*i+100), 1))
		}
		p, err := PolicyByName("round_robin")
		require.NoError(t, err)
		rep, err := Run(Config{Workload: &listWorkload{bt: 16, reqs: reqs}, Replicas: 1, AdapterLoad: load, Seed: 1, Policies: []Policy{p}})
		require.NoError(t, err)
		return rep.Results[0].TTFT.Mean
	}
	base := ttft(-1, "a", "a")
	assert.InDelta(t, base+0.05, ttft(100*time.Millisecond, "a", "a"), 0.002, "one load of 100 ms over two requests")
	assert.InDelta(t, base+0.1, ttft(100*time.Millisecond, "a", "b"), 0.002, "two loads")
	assert.InDelta(t, base, ttft(100*time.Millisecond, "", ""), 1e-9, "the base model loads nothing")
}

// TestLoRASaltedCache: the same prompt under another adapter finds
// nothing cached; under the same adapter, all but its last token.
func TestLoRASaltedCache(t *testing.T) {
	r := runList(t, 1, 1, loraReq(0, "a", 100, 1), loraReq(1000, "b", 100, 1), loraReq(2000, "a", 100, 1), loraReq(3000, "", 100, 1))
	assert.InDelta(t, 63.0/(4*64), r.TokenHitRate, 1e-9)
	assert.InDelta(t, 0.25, r.RequestHitRate, 1e-9)
}

// TestLoRAReportsToGateway: the gateway is fed each replica's adapter
// state, as a scrape of vllm:lora_requests_info would.
func TestLoRAReportsToGateway(t *testing.T) {
	r := runList(t, 2, 3, loraReq(0, "a", 100, 10), loraReq(1, "b", 200, 10))
	for _, st := range r.RouterReplicas {
		assert.Equal(t, 3, st.Adapters.MaxLoras, st.Name)
	}
	// No request named an adapter: no report, no figures.
	plain := runList(t, 1, 1, loraReq(0, "", 100, 1))
	assert.Nil(t, plain.LoRA)
	assert.Zero(t, plain.RouterReplicas[0].Adapters.MaxLoras)
}

func TestLoRAWorkloadErrors(t *testing.T) {
	for _, tc := range []struct {
		c   LoRAConfig
		msg string
	}{
		{LoRAConfig{Adapters: -1}, "Adapters -1 is negative"},
		{LoRAConfig{Adapters: MaxAdapters + 1}, "Adapters 65537, at most 65536"},
		{LoRAConfig{Zipf: 0.5}, "Zipf 0.5 must be above 1"},
		{LoRAConfig{BaseShare: 1.5}, "BaseShare 1.5 must be within 0..1"},
		{LoRAConfig{Rate: -1}, "Rate -1"},
	} {
		_, err := LoRAWorkload(tc.c)
		require.ErrorIs(t, err, ErrInvalidConfig)
		require.ErrorContains(t, err, "lora: "+tc.msg)
	}
	w, err := LoRAWorkload(LoRAConfig{Requests: 5})
	require.NoError(t, err)
	for _, tc := range []struct {
		cfg Config
		msg string
	}{
		{Config{Workload: w, MaxLoras: -1}, "MaxLoras -1, want 1..65536"},
		{Config{Workload: w, MaxLoras: 1 << 20}, "MaxLoras 1048576"},
		{Config{Workload: w, AdapterLoad: 2 * time.Hour}, "AdapterLoad 2h0m0s, at most an hour"},
	} {
		_, err := Run(tc.cfg)
		require.ErrorIs(t, err, ErrInvalidConfig)
		require.ErrorContains(t, err, tc.msg)
	}
}

// TestLoRAWorkloadShape: adapters by Zipf popularity, the base model's
// share, prompts shared across adapters.
func TestLoRAWorkloadShape(t *testing.T) {
	w, err := LoRAWorkload(LoRAConfig{Requests: 4000, Adapters: 4, BaseShare: 0.25})
	require.NoError(t, err)
	st, err := w.Open(1)
	require.NoError(t, err)
	counts := map[string]int{}
	firstBlock := map[uint64]map[string]bool{}
	var r Request
	for st.Next(&r) == nil {
		counts[r.Adapter]++
		if firstBlock[r.Blocks[0]] == nil {
			firstBlock[r.Blocks[0]] = map[string]bool{}
		}
		firstBlock[r.Blocks[0]][r.Adapter] = true
		require.Equal(t, 1280, r.InputTokens)
		require.Len(t, r.Blocks, 80)
	}
	assert.InDelta(t, 1000, counts[""], 100)
	assert.Greater(t, counts[AdapterName(0)], counts[AdapterName(1)])
	assert.Greater(t, counts[AdapterName(1)], counts[AdapterName(3)])
	assert.Len(t, firstBlock, 16, "16 system prompts")
	for _, as := range firstBlock {
		assert.Greater(t, len(as), 2, "each prompt is used with several adapters")
	}
}

// TestLoRAPolicies: on the lora workload, cache-aware routing keeps
// adapters on replicas: fewer requests wait for a slot, fewer loads, and
// a far lower time to first token than round-robin. Every policy of
// LoRAPolicies runs and says how it handles adapters. Deterministic.
func TestLoRAPolicies(t *testing.T) {
	n := 1200
	if testing.Short() {
		n = 300
	}
	w, err := LoRAWorkload(LoRAConfig{Requests: n, Rate: 24})
	require.NoError(t, err)
	cfg := Config{Workload: w, Seed: 1, Policies: LoRAPolicies()}
	rep, err := Run(cfg)
	require.NoError(t, err)
	for _, r := range rep.Results {
		require.NotNil(t, r.LoRA, r.Policy)
		require.NotEmpty(t, r.LoRA.Handling, r.Policy)
		require.Equal(t, n, r.Completed, r.Policy)
	}
	ca, _ := rep.Result("cache_aware")
	rr, _ := rep.Result("round_robin")
	t.Logf("cache_aware: TTFT %.3fs, loads %d, waited %d; round_robin: TTFT %.3fs, loads %d, waited %d",
		ca.TTFT.Mean, ca.LoRA.Loads, ca.LoRA.SlotWaits, rr.TTFT.Mean, rr.LoRA.Loads, rr.LoRA.SlotWaits)
	assert.Less(t, ca.TTFT.Mean, rr.TTFT.Mean/5)
	assert.Less(t, ca.LoRA.SlotWaits, rr.LoRA.SlotWaits/5)
	assert.Less(t, ca.LoRA.Loads, rr.LoRA.Loads/5)
	assert.Equal(t, DefaultMaxLoras, rep.MaxLoras)
	var tab bytes.Buffer
	require.NoError(t, rep.WriteTable(&tab))
	assert.Contains(t, tab.String(), "adapters: 1 slot(s) per replica (max_loras), 30ms per adapter load")
	assert.Contains(t, tab.String(), "gie_lora")

	again, err := Run(cfg)
	require.NoError(t, err)
	var a, b bytes.Buffer
	require.NoError(t, rep.WriteJSON(&a))
	require.NoError(t, again.WriteJSON(&b))
	require.Equal(t, a.String(), b.String())
}

// TestLoRAAdapterWaitDefault: why CacheAware's AdapterWait is 1,024
// blocks: on the lora workload at 48 requests/s (8 adapters, one slot per
// replica) a cheaper wait lets cache-aware send requests where they wait
// for a slot to save their prefill; 1,024 and 4,096 blocks let none wait.
// go test ./sim -run TestLoRAAdapterWaitDefault -v prints the figures.
func TestLoRAAdapterWaitDefault(t *testing.T) {
	if testing.Short() {
		t.Skip("a comparison of four runs")
	}
	w, err := LoRAWorkload(LoRAConfig{Requests: 3000, Rate: 48})
	require.NoError(t, err)
	var pols []Policy
	for _, wait := range []float64{128, 256, 0, 4096} {
		name := fmt.Sprintf("wait_%g", wait)
		if wait == 0 {
			name = "wait_default"
		}
		pols = append(pols, Policy{Name: name, New: func(uint64) gateway.Policy { return &gateway.CacheAware{AdapterWait: wait} }})
	}
	rep, err := Run(Config{Workload: w, Seed: 1, Policies: pols})
	require.NoError(t, err)
	waited := map[string]float64{}
	for _, r := range rep.Results {
		waited[r.Policy] = float64(r.LoRA.SlotWaits) / float64(r.LoRA.Requests)
		t.Logf("%-12s TTFT mean %6.0f ms, p99 %6.0f ms; %5.1f%% of the requests waited for a slot", r.Policy, 1e3*r.TTFT.Mean, 1e3*r.TTFT.P99, 100*waited[r.Policy])
	}
	assert.Zero(t, waited["wait_default"])
	assert.Zero(t, waited["wait_4096"])
	assert.Positive(t, waited["wait_256"])
	assert.Positive(t, waited["wait_128"])
}

package sim

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	checkInvariants = true
	os.Exit(m.Run())
}

func fixture(t testing.TB, o TraceOptions) Workload {
	t.Helper()
	w, err := TraceFile("testdata/mooncake_fixture.jsonl", o)
	require.NoError(t, err)
	return w
}

// smallPreset is a replica small enough that the fixture fills its cache.
func smallPreset() Preset {
	p := DefaultPreset()
	p.Name, p.KVTokens = "small", 64*512
	return p
}

func workloads(t *testing.T) map[string]Workload {
	t.Helper()
	mk := func(w Workload, err error) Workload {
		require.NoError(t, err)
		return w
	}
	return map[string]Workload{
		"fixture":       fixture(t, TraceOptions{}),
		"shared-prefix": mk(SharedPrefix(SharedPrefixConfig{Requests: 300, Rate: 40})),
		"chat":          mk(Chat(ChatConfig{Requests: 300, Rate: 30, Sessions: 20})),
		"rag":           mk(RAG(RAGConfig{Requests: 300, Rate: 30})),
		"system-prompt": mk(SystemPrompt(SystemPromptConfig{Requests: 300})),
		"low-sharing":   mk(LowSharing(LowSharingConfig{Requests: 300})),
	}
}

func TestDeterminism(t *testing.T) {
	for name, w := range workloads(t) {
		t.Run(name, func(t *testing.T) {
			cfg := Config{Workload: w, Replicas: 3, Preset: smallPreset(), Seed: 7}
			a, err := Run(cfg)
			require.NoError(t, err)
			cfg.Parallel = 1 // sequential policies give the same report
			b, err := Run(cfg)
			require.NoError(t, err)
			require.Equal(t, a, b)
			var ja, jb bytes.Buffer
			require.NoError(t, a.WriteJSON(&ja))
			require.NoError(t, b.WriteJSON(&jb))
			require.Equal(t, ja.String(), jb.String())
		})
	}
	t.Run("seed matters", func(t *testing.T) {
		w := workloads(t)["shared-prefix"]
		a, err := Run(Config{Workload: w, Seed: 1, Policies: DefaultPolicies()[:1]})
		require.NoError(t, err)
		b, err := Run(Config{Workload: w, Seed: 2, Policies: DefaultPolicies()[:1]})
		require.NoError(t, err)
		require.NotEqual(t, a.Results[0].TTFT, b.Results[0].TTFT)
	})
}

func TestConservation(t *testing.T) {
	for name, w := range workloads(t) {
		for _, q := range []int{0, 2} {
			for _, idx := range []IndexMode{IndexApproximate, IndexExact} {
				t.Run(name, func(t *testing.T) {
					// Cache at schedule with the approximate index only:
					// both engine rules are checked, at the same cost.
					rep, err := Run(Config{Workload: w, Replicas: 3, Preset: smallPreset(), MaxQueue: q, Index: idx, Seed: 3, CacheAtSchedule: idx == IndexApproximate})
					require.NoError(t, err)
					for _, r := range rep.Results {
						assert.Equal(t, rep.Requests, r.Requests, r.Policy)
						assert.Equal(t, r.Requests, r.Completed+r.Dropped+r.Failed, r.Policy)
						if q == 0 {
							assert.Zero(t, r.Dropped, r.Policy)
						}
						assert.LessOrEqual(t, r.TokenHitRate, rep.Unbounded.TokenHitRate+1e-9, r.Policy)
						assert.InDelta(t, r.Imbalance, r.Imbalance, 0, r.Policy)
						assert.GreaterOrEqual(t, r.TTFT.P99, r.TTFT.P50, r.Policy)
						assert.GreaterOrEqual(t, r.E2E.Mean, r.TTFT.Mean, r.Policy)
					}
				})
			}
		}
	}
}

func TestOversizedRequestFails(t *testing.T) {
	trace := `{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2]}
{"timestamp": 5, "input_length": 5000, "output_length": 5, "hash_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}
`
	w, err := TraceBytes("hand", []byte(trace), TraceOptions{})
	require.NoError(t, err)
	p := DefaultPreset()
	p.KVTokens = 4 * 512
	rep, err := Run(Config{Workload: w, Preset: p, Replicas: 2})
	require.NoError(t, err)
	for _, r := range rep.Results {
		assert.Equal(t, 1, r.Completed, r.Policy)
		assert.Equal(t, 1, r.Failed, r.Policy)
	}
}

func TestCacheNeverOverCapacity(t *testing.T) {
	// checkInvariants (set in TestMain) makes every step verify each
	// replica's cache, panicking when over capacity; a tiny cache and a
	// saturated cluster exercise eviction and head-of-line blocking.
	p := smallPreset()
	p.KVTokens = 40 * 512
	// With CacheAtSchedule, blocks are cached (pinned) before they are
	// computed.
	w := fixture(t, TraceOptions{Speed: 4})
	for _, at := range []bool{false, true} {
		rep, err := Run(Config{Workload: w, Preset: p, Replicas: 2, Index: IndexExact, CacheAtSchedule: at})
		require.NoError(t, err)
		for _, r := range rep.Results {
			assert.Equal(t, r.Requests, r.Completed+r.Failed, r.Policy)
			assert.Positive(t, r.Failed, r.Policy) // some prompts exceed 40 blocks
		}
	}
}

func TestSingleRequestTimes(t *testing.T) {
	// One request on an idle replica: TTFT is the preset's prefill time, and
	// E2E adds out−1 decode steps whose context grows by one each.
	p := DefaultPreset()
	trace := `{"timestamp": 0, "input_length": 3000, "output_length": 10, "hash_ids": [1, 2, 3, 4, 5, 6]}` + "\n"
	w, err := TraceBytes("one", []byte(trace), TraceOptions{})
	require.NoError(t, err)
	rep, err := Run(Config{Workload: w, Replicas: 1, Policies: DefaultPolicies()[:1]})
	require.NoError(t, err)
	r := rep.Results[0]
	ttft := p.PrefillTime(0, 3000).Seconds()
	assert.InDelta(t, ttft, r.TTFT.Max, 1e-6)
	e2e := ttft
	for k := range 9 {
		e2e += p.StepOverhead + p.DecodePerSeq + p.DecodePerContextToken*float64(3001+k)
	}
	assert.InDelta(t, e2e, r.E2E.Max, 1e-6)
}

func TestMacroStepsMatchSingleSteps(t *testing.T) {
	// Jumping over decode steps must give what stepping one at a time gives,
	// up to nanosecond rounding.
	w := fixture(t, TraceOptions{Speed: 2})
	cfg := Config{Workload: w, Replicas: 2, Preset: smallPreset(), Seed: 1}
	a, err := Run(cfg)
	require.NoError(t, err)
	noMacro = true
	defer func() { noMacro = false }()
	b, err := Run(cfg)
	require.NoError(t, err)
	for i := range a.Results {
		x, y := a.Results[i], b.Results[i]
		assert.Equal(t, x.Completed, y.Completed, x.Policy)
		assert.InEpsilon(t, y.TTFT.Mean, x.TTFT.Mean, 1e-3, x.Policy)
		assert.InEpsilon(t, y.E2E.Mean, x.E2E.Mean, 1e-3, x.Policy)
		assert.InDelta(t, y.TokenHitRate, x.TokenHitRate, 0.01, x.Policy)
	}
}

func TestBoundsHandMade(t *testing.T) {
	// Pooled cache of 3 blocks of 512 tokens (one replica); no prompt plus
	// its one output token spills into a new block:
	//   r1 [1 2]   1000 tokens: miss                     LRU {1 2}
	//   r2 [1 2 3] 1200 tokens: 2 blocks, 1024 cached    LRU {1 2 3}
	//   r3 [4]      500 tokens: miss, evicts 3           LRU {4 1 2}
	//   r4 [1 2 3] 1200 tokens: 2 blocks = 1024 cached (unbounded: 3 blocks, 1199)
	//   r5 [5 6]   1000 tokens: miss
	trace := strings.Join([]string{
		`{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1, 2]}`,
		`{"timestamp": 1000, "input_length": 1200, "output_length": 1, "hash_ids": [1, 2, 3]}`,
		`{"timestamp": 2000, "input_length": 500, "output_length": 1, "hash_ids": [4]}`,
		`{"timestamp": 3000, "input_length": 1200, "output_length": 1, "hash_ids": [1, 2, 3]}`,
		`{"timestamp": 4000, "input_length": 1000, "output_length": 1, "hash_ids": [5, 6]}`,
	}, "\n")
	w, err := TraceBytes("hand", []byte(trace), TraceOptions{})
	require.NoError(t, err)
	p := DefaultPreset()
	p.KVTokens = 3 * 512
	rep, err := Run(Config{Workload: w, Preset: p, Replicas: 1})
	require.NoError(t, err)
	assert.Equal(t, Bound{Name: "pooled-lru", CacheBlocks: 3, TokenHitRate: 2048.0 / 4900, RequestHitRate: 0.4}, rep.PooledLRU)
	assert.Equal(t, Bound{Name: "unbounded", TokenHitRate: 2223.0 / 4900, RequestHitRate: 0.4}, rep.Unbounded)
	// One replica serving one request at a time hits exactly like the pool,
	// and every request is alone on it: each policy's TTFT is the ideal.
	lone := []time.Duration{p.LoneTTFT(0, 1000), p.LoneTTFT(1024, 176), p.LoneTTFT(0, 500), p.LoneTTFT(1024, 176), p.LoneTTFT(0, 1000)}
	var sum time.Duration
	for _, d := range lone {
		sum += d
	}
	assert.InDelta(t, sum.Seconds()/5, rep.Ideal.Mean, 1e-9)
	assert.InDelta(t, p.PrefillTime(0, 1000).Seconds(), rep.Ideal.Max, 1e-9)
	for _, r := range rep.Results {
		assert.InDelta(t, 2048.0/4900, r.TokenHitRate, 1e-12, r.Policy)
		assert.InDelta(t, rep.Ideal.Mean, r.TTFT.Mean, 1e-6, r.Policy)
		assert.InDelta(t, 1, r.IdealRatio, 1e-5, r.Policy)
	}
}

// TestLoneTTFTChunks: a prompt longer than a step's token budget is
// prefilled in chunks, each paying the step overhead, the attention term
// growing with the context already computed.
func TestLoneTTFTChunks(t *testing.T) {
	p := DefaultPreset()
	n := p.MaxBatchTokens + 100
	want := p.PrefillTime(0, p.MaxBatchTokens) + p.PrefillTime(p.MaxBatchTokens, 100)
	assert.InDelta(t, want.Seconds(), p.LoneTTFT(0, n).Seconds(), 1e-8)
	assert.Equal(t, p.PrefillTime(0, 100), p.LoneTTFT(0, 100))
}

// TestIdealIsBelowPolicies: on every generated workload no policy's mean
// TTFT beats the ideal row, and every policy's per-replica shares add up to
// the requests it admitted.
func TestIdealIsBelowPolicies(t *testing.T) {
	for name, w := range workloads(t) {
		t.Run(name, func(t *testing.T) {
			rep, err := Run(Config{Workload: w, Replicas: 3, Seed: 2})
			require.NoError(t, err)
			require.Positive(t, rep.Ideal.Mean)
			for _, r := range rep.Results {
				assert.GreaterOrEqual(t, r.TTFT.Mean, rep.Ideal.Mean, r.Policy)
				assert.GreaterOrEqual(t, r.IdealRatio, 1.0, r.Policy)
				var n int64
				for _, x := range r.RequestsPerReplica {
					n += x
				}
				assert.Equal(t, int64(r.Completed), n, r.Policy)
				assert.LessOrEqual(t, r.Share.RequestsMin, 1.0, r.Policy)
				assert.GreaterOrEqual(t, r.Share.RequestsMax, 1.0, r.Policy)
				assert.InDelta(t, r.Imbalance, r.Share.PrefillMax, 1e-12, r.Policy)
			}
		})
	}
}

func TestTraceParserErrors(t *testing.T) {
	good := `{"timestamp": 10, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}`
	tests := []struct {
		name, line, want string
	}{
		{"not json", `{"timestamp": 10,`, "unexpected end"},
		{"missing timestamp", `{"input_length": 600, "output_length": 5, "hash_ids": [1, 2]}`, "missing timestamp"},
		{"missing hash_ids", `{"timestamp": 10, "input_length": 600, "output_length": 5}`, "missing hash_ids"},
		{"negative input", `{"timestamp": 10, "input_length": -1, "output_length": 5, "hash_ids": []}`, "input_length -1"},
		{"negative output", `{"timestamp": 10, "input_length": 600, "output_length": -5, "hash_ids": [1, 2]}`, "output_length -5"},
		{"wrong id count", `{"timestamp": 10, "input_length": 600, "output_length": 5, "hash_ids": [1]}`, "1 hash_ids for input_length 600"},
		{"negative id", `{"timestamp": 10, "input_length": 600, "output_length": 5, "hash_ids": [1, -2]}`, "hash_ids[1] = -2"},
		{"time goes back", `{"timestamp": 9, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}`, "before the previous"},
		{"string length", `{"timestamp": 10, "input_length": "600", "output_length": 5, "hash_ids": [1, 2]}`, "input_length"},
		{"trailing data", good + ` x`, "invalid character"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewTraceDecoder(strings.NewReader(good+"\n\n"+tt.line+"\n"+good+"\n"), 512)
			var r Request
			require.NoError(t, d.Next(&r))
			assert.Equal(t, 10*time.Millisecond, r.Arrival)
			assert.Equal(t, []uint64{1, 2}, r.Blocks)
			err := d.Next(&r)
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrMalformedTrace))
			assert.Contains(t, err.Error(), "line 3:")
			assert.Contains(t, err.Error(), tt.want)
			assert.True(t, strings.HasPrefix(err.Error(), "gateway:"))
		})
	}
	t.Run("run reports the line", func(t *testing.T) {
		w, err := TraceBytes("bad", []byte(good+"\n"+`{"timestamp": 11}`+"\n"), TraceOptions{})
		require.NoError(t, err)
		_, err = Run(Config{Workload: w, Replicas: 1})
		require.ErrorIs(t, err, ErrMalformedTrace)
		assert.Contains(t, err.Error(), "line 2")
	})
}

func FuzzTraceDecoder(f *testing.F) {
	data, err := os.ReadFile("testdata/mooncake_fixture.jsonl")
	require.NoError(f, err)
	lines := strings.SplitAfter(string(data), "\n")
	f.Add(strings.Join(lines[:3], ""))
	f.Add(`{"timestamp": 1e3, "input_length": 1, "output_length": 0, "hash_ids": [0]}`)
	f.Add("{}\n[]\nnull\n")
	f.Fuzz(func(t *testing.T, s string) {
		d := NewTraceDecoder(strings.NewReader(s), 512)
		var r Request
		last := time.Duration(0)
		for {
			err := d.Next(&r)
			if err == io.EOF {
				return
			}
			if err != nil {
				if !errors.Is(err, ErrMalformedTrace) || !strings.Contains(err.Error(), "line ") {
					t.Fatalf("error %q lacks a line number or sentinel", err)
				}
				return
			}
			if r.InputTokens < 1 || r.OutputTokens < 0 || len(r.Blocks) != (r.InputTokens+511)/512 || r.Arrival < last {
				t.Fatalf("accepted an invalid request %+v", r)
			}
			last = r.Arrival
		}
	})
}

func TestTraceOptions(t *testing.T) {
	base := fixture(t, TraceOptions{})
	fast := fixture(t, TraceOptions{Speed: 2, Limit: 50})
	pois := fixture(t, TraceOptions{Rate: 10, Limit: 50})
	read := func(w Workload) []Request {
		st, err := w.Open(1)
		require.NoError(t, err)
		defer st.Close()
		var out []Request
		for {
			var r Request
			if err := st.Next(&r); err == io.EOF {
				return out
			}
			require.NoError(t, err)
			out = append(out, r)
		}
	}
	b, f, p := read(base), read(fast), read(pois)
	require.Len(t, b, 300)
	require.Len(t, f, 50)
	require.Len(t, p, 50)
	for i := range f {
		assert.Equal(t, b[i].Arrival/2, f[i].Arrival)
		assert.Equal(t, b[i].Blocks, p[i].Blocks)
	}
	assert.NotEqual(t, b[49].Arrival, p[49].Arrival)
	for _, o := range []TraceOptions{{Speed: -1}, {Rate: math.NaN()}, {Limit: -1}, {BlockTokens: -1}} {
		_, err := TraceFile("testdata/mooncake_fixture.jsonl", o)
		require.ErrorIs(t, err, ErrInvalidConfig)
	}
	_, err := TraceFile("testdata/absent.jsonl", TraceOptions{})
	require.ErrorIs(t, err, ErrInvalidConfig)
}

func TestConfigErrors(t *testing.T) {
	bad := []Config{
		{Replicas: -1},
		{Policies: []Policy{}},
		{Policies: []Policy{{Name: "a"}, {Name: "a"}}},
		{Policies: []Policy{{}}},
		{RefreshInterval: -time.Second},
		{PeerRefreshInterval: -time.Second},
		{SLO: -1},
		{MaxQueue: -1},
		{Preset: Preset{Name: "x"}},
		{Index: 9},
	}
	for _, c := range bad {
		_, err := Run(c)
		require.ErrorIs(t, err, ErrInvalidConfig, "%+v", c)
		assert.True(t, strings.HasPrefix(err.Error(), "gateway:"))
	}
	_, err := PresetByName("nope")
	require.ErrorIs(t, err, ErrInvalidConfig)
	_, err = PolicyByName("nope")
	require.ErrorIs(t, err, ErrInvalidConfig)
	p, err := PolicyByName("prefix-affinity")
	require.NoError(t, err)
	assert.Equal(t, "prefix_affinity", p.Name)
	for _, n := range PresetNames() {
		require.NoError(t, MustPreset(n).validate())
	}
}

func TestOutputs(t *testing.T) {
	rep, err := Run(Config{Workload: fixture(t, TraceOptions{}), Replicas: 2, Preset: smallPreset()})
	require.NoError(t, err)
	var tab, js, svg bytes.Buffer
	require.NoError(t, rep.WriteTable(&tab))
	require.NoError(t, rep.WriteJSON(&js))
	require.NoError(t, rep.WriteSVG(&svg))
	for _, p := range DefaultPolicies() {
		assert.Contains(t, tab.String(), p.Name)
		assert.Contains(t, svg.String(), p.Name)
	}
	assert.Contains(t, tab.String(), "pooled-lru (bound)")
	var back Report
	require.NoError(t, jsonUnmarshal(js.Bytes(), &back))
	assert.Equal(t, rep.Results[0].TTFT, back.Results[0].TTFT)
	dec := xml.NewDecoder(&svg)
	for {
		_, err := dec.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
	}
	// Columns line up: every table row has the same width.
	rows := strings.Split(strings.TrimRight(tab.String(), "\n"), "\n")[2:]
	for _, r := range rows[1:] {
		assert.Equal(t, len([]rune(rows[0])), len([]rune(r)))
	}
}

func TestProgress(t *testing.T) {
	var calls []Progress
	_, err := Run(Config{Workload: fixture(t, TraceOptions{}), Replicas: 2, Progress: func(p Progress) { calls = append(calls, p) }})
	require.NoError(t, err)
	require.NotEmpty(t, calls)
	last := calls[len(calls)-1]
	assert.Equal(t, 300*(len(DefaultPolicies())+1), last.Total)
	assert.Equal(t, last.Total, last.Done)
	for i := 1; i < len(calls); i++ {
		assert.GreaterOrEqual(t, calls[i].Done, calls[i-1].Done)
	}
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

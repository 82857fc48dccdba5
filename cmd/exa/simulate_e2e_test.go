package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/flow"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test ./cmd/exa -run %s -update to create it", t.Name())
	assert.Equal(t, string(want), got, "if the simulator or the core changed on purpose, regenerate with: go test ./cmd/exa -run 'TestSimulate(SpecCommandGolden|MainJob)' -update")
}

// specLines checks the first three lines of simulate's text output and
// returns the two hit rates.
func specLines(t *testing.T, out string) (ca, rr float64) {
	t.Helper()
	lines := strings.Split(out, "\n")
	require.GreaterOrEqual(t, len(lines), 4, out)
	assert.True(t, strings.HasPrefix(lines[0], "workload: "), lines[0])
	re := regexp.MustCompile(`^(cache-aware|round-robin) hit rate: (\d{1,3}\.\d)%$`)
	m1, m2 := re.FindStringSubmatch(lines[1]), re.FindStringSubmatch(lines[2])
	require.NotNil(t, m1, lines[1])
	require.NotNil(t, m2, lines[2])
	assert.Equal(t, "cache-aware", m1[1])
	assert.Equal(t, "round-robin", m2[1])
	ca, _ = strconv.ParseFloat(m1[2], 64)
	rr, _ = strconv.ParseFloat(m2[2], 64)
	return ca, rr
}

func TestSimulateSpecCommandGolden(t *testing.T) {
	cfg := newConfig(t)
	args := []string{"serve", "routing", "simulate", "JPCP", "--replicas", "4", "--shared-prefix-requests", "100"}
	out := ok(t, cfg, args...)
	golden(t, "simulate_shared_prefix_100.golden", out)
	ca, rr := specLines(t, out)
	assert.Greater(t, ca, rr, "cache-aware must beat round-robin on a shared-prefix stream")
	assert.Contains(t, out, "shared-prefix: 100 requests")
	assert.Contains(t, out, "4 replicas")

	// Deterministic: a second run, in another config dir, prints the same.
	assert.Equal(t, out, ok(t, newConfig(t), args...))
	// Recording the model's policy for its statistics does not change the
	// simulation: no model, or a cache-aware model, prints the same.
	assert.Equal(t, out, ok(t, cfg, "serve", "routing", "simulate", "--replicas", "4", "--shared-prefix-requests", "100"))
	ok(t, cfg, "serve", "routing", "set", "JPCP", "--mode", "cache_aware")
	assert.Equal(t, out, ok(t, cfg, args...))
	// Without a terminal there is no progress bar on stderr; forced, it
	// goes to stderr only and leaves stdout as it was.
	r := exa(t, cfg, args...)
	assert.Empty(t, r.stderr)
	r = exa(t, cfg, append(args, "--progress", "always")...)
	assert.Equal(t, 0, r.code)
	assert.Contains(t, r.stderr, "simulating [")
	assert.Contains(t, r.stderr, "100%")
	assert.Equal(t, out, r.stdout)
}

func TestSimulateMainJob(t *testing.T) {
	if testing.Short() {
		t.Skip("the full default workload takes a while; skipped with -short")
	}
	cfg := newConfig(t)
	out := ok(t, cfg, "serve", "routing", "simulate", "JPCP")
	golden(t, "simulate_default.golden", out)
	ca, rr := specLines(t, out)
	assert.Greater(t, ca, rr)
	assert.Contains(t, out, "20000 requests")
}

func TestSimulateOptions(t *testing.T) {
	cfg := newConfig(t)
	trace := filepath.Join(t.TempDir(), "trace.jsonl")
	var b strings.Builder
	for i := range 60 {
		// Three conversations that grow turn by turn, interleaved.
		conv := i % 3
		n := 2 + i/3
		ids := make([]string, n)
		for j := range n {
			ids[j] = strconv.Itoa(conv*1000 + j)
		}
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": 20, "hash_ids": [%s]}`+"\n", 100*i, 512*n, strings.Join(ids, ", "))
	}
	require.NoError(t, os.WriteFile(trace, []byte(b.String()), 0o644))
	plot := filepath.Join(t.TempDir(), "plot.svg")

	out := ok(t, cfg, "serve", "routing", "simulate", "--trace", trace, "--policies", "p2c,load-aware", "--replicas", "3", "--seed", "7", "--plot", plot)
	specLines(t, out)
	assert.Contains(t, out, "3 replicas")
	assert.Contains(t, out, "seed 7")
	assert.Contains(t, out, "plot written to "+plot)
	for _, p := range []string{"cache_aware", "round_robin", "p2c", "load_aware"} {
		assert.Regexp(t, `(?m)^\s*`+p+`\s+\d`, out)
	}
	assert.NotRegexp(t, `(?m)^\s*sglang\s`, out)
	svg, err := os.ReadFile(plot)
	require.NoError(t, err)
	assert.Contains(t, string(svg), "<svg")

	// --json carries the same rates as the text.
	var js simOutput
	require.NoError(t, json.Unmarshal([]byte(ok(t, cfg, "serve", "routing", "simulate", "--workload", "chat", "--requests", "200", "--replicas", "2", "--json")), &js))
	require.NotNil(t, js.Report)
	assert.Equal(t, 200, js.Report.Requests)
	ca, found := js.Report.Result("cache_aware")
	require.True(t, found)
	assert.Equal(t, ca.TokenHitRate, js.CacheAwareHitRate)
	text := ok(t, cfg, "serve", "routing", "simulate", "--workload", "chat", "--requests", "200", "--replicas", "2")
	caText, _ := specLines(t, text)
	assert.InDelta(t, 100*js.CacheAwareHitRate, caText, 0.05)
}

// --share-pending has two gateways share their pending prefill: the
// report says so, and cache_aware routes differently than without it.
func TestSimulateSharePending(t *testing.T) {
	cfg := newConfig(t)
	args := []string{"serve", "routing", "simulate", "--workload", "chat", "--requests", "300", "--replicas", "2", "--gateways", "2", "--index", "exact", "--policies", "cache_aware", "--json"}
	var plain, shared simOutput
	require.NoError(t, json.Unmarshal([]byte(ok(t, cfg, args...)), &plain))
	require.NoError(t, json.Unmarshal([]byte(ok(t, cfg, append(args, "--share-pending")...)), &shared))
	require.NotNil(t, plain.Report)
	require.NotNil(t, shared.Report)
	assert.False(t, plain.Report.SharePending)
	assert.True(t, shared.Report.SharePending)
	assert.Contains(t, shared.Workload, "2 gateways sharing pending prefill")
	a, _ := plain.Report.Result("cache_aware")
	b, _ := shared.Report.Result("cache_aware")
	assert.NotEqual(t, a.TTFT, b.TTFT)
	var slow simOutput
	require.NoError(t, json.Unmarshal([]byte(ok(t, cfg, append(args, "--share-pending", "--refresh-interval", "1s")...)), &slow))
	assert.Equal(t, 1.0, slow.Report.RefreshInterval)
	assert.Equal(t, 0.05, shared.Report.RefreshInterval, "the default")
	assert.Zero(t, slow.Report.PeerRefreshInterval, "peers shared at every load refresh")
	// The peers on a clock of their own: the engines' load still every
	// second, the pending prefill every 50 ms.
	var apart simOutput
	require.NoError(t, json.Unmarshal([]byte(ok(t, cfg, append(args, "--share-pending", "--refresh-interval", "1s", "--peer-refresh-interval", "50ms")...)), &apart))
	assert.Equal(t, 1.0, apart.Report.RefreshInterval)
	assert.Equal(t, 0.05, apart.Report.PeerRefreshInterval)
	assert.Contains(t, apart.Workload, "2 gateways sharing pending prefill every 0.05s")
	c, _ := slow.Report.Result("cache_aware")
	d, _ := apart.Report.Result("cache_aware")
	assert.NotEqual(t, c.TTFT, d.TTFT)
}

// --streamed 0 has no client stream: the report says so; with the fronts
// streaming such answers from the engine (--upstream-stream, the default)
// cache_aware routes as when every client streams, and without it, its
// pending prefill freed at completion, differently; --streamed 1, the
// default, changes nothing.
func TestSimulateStreamed(t *testing.T) {
	cfg := newConfig(t)
	args := []string{"serve", "routing", "simulate", "--workload", "chat", "--requests", "300", "--replicas", "2", "--policies", "cache_aware", "--json"}
	var plain, all, none, blind simOutput
	require.NoError(t, json.Unmarshal([]byte(ok(t, cfg, args...)), &plain))
	require.NoError(t, json.Unmarshal([]byte(ok(t, cfg, append(args, "--streamed", "1")...)), &all))
	require.NoError(t, json.Unmarshal([]byte(ok(t, cfg, append(args, "--streamed", "0")...)), &none))
	require.NoError(t, json.Unmarshal([]byte(ok(t, cfg, append(args, "--streamed", "0", "--upstream-stream=false")...)), &blind))
	assert.Equal(t, plain.Report.Results, all.Report.Results)
	assert.Equal(t, 0.0, plain.Report.NonStreamed)
	assert.Equal(t, 1.0, none.Report.NonStreamed)
	assert.True(t, none.Report.UpstreamStream)
	assert.False(t, blind.Report.UpstreamStream)
	a, _ := plain.Report.Result("cache_aware")
	b, _ := none.Report.Result("cache_aware")
	c, _ := blind.Report.Result("cache_aware")
	assert.Equal(t, a.TTFT, b.TTFT)
	assert.NotEqual(t, a.TTFT, c.TTFT)
	assert.Contains(t, ok(t, cfg, "serve", "routing", "simulate", "--workload", "chat", "--requests", "50", "--replicas", "2", "--streamed", "0.25"),
		"25% of clients streaming")
}

func TestSimulateBadInput(t *testing.T) {
	cfg := newConfig(t)
	ok(t, cfg, "serve", "routing", "set", "JPCP", "--mode", "cache_aware")
	before, err := os.ReadFile(cfg)
	require.NoError(t, err)
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	empty := filepath.Join(dir, "empty.jsonl")
	require.NoError(t, os.WriteFile(empty, nil, 0o644))
	blank := filepath.Join(dir, "blank.jsonl")
	require.NoError(t, os.WriteFile(blank, []byte("\n  \n"), 0o644))
	for _, tc := range []struct {
		name string
		args []string
		msg  string
	}{
		{"zero replicas", []string{"JPCP", "--replicas", "0"}, `invalid --replicas 0`},
		{"non-numeric replicas", []string{"JPCP", "--replicas", "four"}, `invalid --replicas "four"`},
		{"zero requests", []string{"JPCP", "--requests", "0"}, `invalid --requests 0`},
		{"zero shared-prefix requests", []string{"JPCP", "--shared-prefix-requests", "0"}, `invalid --shared-prefix-requests 0`},
		{"unknown workload", []string{"JPCP", "--workload", "tweets"}, `invalid --workload "tweets"`},
		{"workload and shared-prefix", []string{"JPCP", "--workload", "chat", "--shared-prefix-requests", "5"}, `--workload and --shared-prefix-requests cannot be used together`},
		{"requests and shared-prefix", []string{"JPCP", "--requests", "9", "--shared-prefix-requests", "5"}, `--requests and --shared-prefix-requests cannot be used together`},
		{"trace and workload", []string{"JPCP", "--trace", "x", "--workload", "chat"}, `--trace and --workload cannot be used together`},
		{"unknown policy", []string{"JPCP", "--policies", "cache_aware,fastest"}, `invalid --policies "fastest"`},
		// The names it accepts beyond the default set are listed too.
		{"unknown policy lists all", []string{"JPCP", "--policies", "fastest"}, `gie_lora, gie_flow, llmd_predicted, llmd_predicted_e2e`},
		{"unknown preset", []string{"JPCP", "--preset", "tpu"}, `invalid --preset "tpu"`},
		{"unknown index", []string{"JPCP", "--index", "psychic"}, `invalid --index "psychic"`},
		{"zero gateways", []string{"JPCP", "--gateways", "0"}, `invalid --gateways 0: want 1..64`},
		{"too many gateways", []string{"JPCP", "--gateways", "65"}, `invalid --gateways 65: want 1..64`},
		{"non-numeric gateways", []string{"JPCP", "--gateways", "two"}, `invalid --gateways "two"`},
		{"zero refresh interval", []string{"JPCP", "--refresh-interval", "0s"}, `invalid --refresh-interval 0s: want 1ms..1m`},
		{"long refresh interval", []string{"JPCP", "--refresh-interval", "2m"}, `invalid --refresh-interval 2m0s: want 1ms..1m`},
		{"streamed above 1", []string{"JPCP", "--streamed", "1.5"}, `invalid --streamed 1.5: want a share 0..1 of streaming clients`},
		{"negative streamed", []string{"JPCP", "--streamed", "-0.1"}, `invalid --streamed -0.1: want a share 0..1 of streaming clients`},
		{"NaN streamed", []string{"JPCP", "--streamed", "NaN"}, `invalid --streamed NaN: want a share 0..1 of streaming clients`},
		{"infinite rate", []string{"JPCP", "--rate", "+Inf"}, `invalid --rate +Inf: want a finite rate >= 0 requests per second`},
		{"NaN rate", []string{"JPCP", "--rate", "NaN"}, `invalid --rate NaN: want a finite rate >= 0 requests per second`},
		{"infinite trace speed", []string{"JPCP", "--trace", empty, "--trace-speed", "+Inf"}, `invalid --trace-speed +Inf: want a finite positive factor`},
		{"NaN trace speed", []string{"JPCP", "--trace", empty, "--trace-speed", "NaN"}, `invalid --trace-speed NaN: want a finite positive factor`},
		{"negative admission queue", []string{"JPCP", "--admission-queue-depth", "-1"}, `invalid --admission-queue-depth -1: want 0 (off) or more`},
		{"admission kv above 1", []string{"JPCP", "--admission-kv", "1.2"}, `invalid --admission-kv 1.2: want 0..1 (0: off)`},
		{"negative admission outstanding", []string{"JPCP", "--admission-outstanding", "-3"}, `invalid --admission-outstanding -3: want 0 (off) or more`},
		{"negative admission pending prefill", []string{"JPCP", "--admission-pending-prefill", "-1"}, `invalid --admission-pending-prefill -1: want 0 (off) or more`},
		{"share-pending with one gateway", []string{"JPCP", "--share-pending"}, `invalid --share-pending with --gateways 1: sharing needs at least 2 gateways`},
		{"peer refresh without sharing", []string{"JPCP", "--gateways", "2", "--peer-refresh-interval", "50ms"}, `invalid --peer-refresh-interval 50ms without --share-pending`},
		{"peer refresh too long", []string{"JPCP", "--gateways", "2", "--share-pending", "--peer-refresh-interval", "2m"}, `invalid --peer-refresh-interval 2m0s: want 0 or 1ms..1m`},
		{"missing trace", []string{"JPCP", "--trace", "/nonexistent/trace.jsonl"}, `invalid --trace "/nonexistent/trace.jsonl"`},
		{"negative seed", []string{"JPCP", "--seed", "-1"}, `invalid --seed "-1"`},
		{"bad progress", []string{"JPCP", "--progress", "sometimes"}, `invalid --progress "sometimes"`},
		{"empty model", []string{""}, `invalid MODEL ""`},
		{"too many replicas", []string{"JPCP", "--replicas", "4096"}, `invalid --replicas 4096: want 1..512`},
		{"one replica too many", []string{"JPCP", "--replicas", "513"}, `invalid --replicas 513: want 1..512`},
		{"too many requests", []string{"JPCP", "--requests", "100001"}, `invalid --requests 100001: want 1..100000`},
		{"huge requests", []string{"JPCP", "--requests", "2000000000"}, `invalid --requests 2000000000: want 1..100000`},
		{"too many trace requests", []string{"JPCP", "--trace", empty, "--requests", "100001"}, `invalid --requests 100001: want 1..100000`},
		{"too many shared-prefix requests", []string{"JPCP", "--shared-prefix-requests", "1000000"}, `invalid --shared-prefix-requests 1000000: want 1..100000`},
		{"plot into a directory", []string{"JPCP", "--requests", "10", "--plot", dir}, fmt.Sprintf(`invalid --plot %q: is a directory; want a file name such as %s`, dir, filepath.Join(dir, "ttft.svg"))},
		{"plot path ending in a slash", []string{"JPCP", "--requests", "10", "--plot", dir + "/new/"}, `is a directory`},
		{"plot in a missing directory", []string{"JPCP", "--requests", "10", "--plot", filepath.Join(dir, "a", "b", "p.svg")}, fmt.Sprintf(`directory %q does not exist (create it first)`, filepath.Join(dir, "a", "b"))},
		{"plot under a file", []string{"JPCP", "--requests", "10", "--plot", filepath.Join(file, "p.svg")}, fmt.Sprintf(`%q is not a directory`, file)},
		{"empty plot", []string{"JPCP", "--requests", "10", "--plot", ""}, `invalid --plot "": want a file name`},
		{"empty trace", []string{"JPCP", "--trace", empty}, fmt.Sprintf(`invalid --trace %q: trace %s: no requests: the file is empty`, empty, empty)},
		{"blank trace", []string{"JPCP", "--trace", blank}, fmt.Sprintf(`invalid --trace %q: trace %s: no requests: its 2 lines are all blank`, blank, blank)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := exa(t, cfg, append([]string{"serve", "routing", "simulate"}, tc.args...)...)
			assertRejected(t, r, tc.msg, cfg, before)
			_, err := os.Stat(config.StatsPath(cfg, "JPCP"))
			assert.ErrorIs(t, err, os.ErrNotExist, "a failed simulate saves nothing")
		})
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 3, "no plot and no directory was created")

	// A model whose stored replicas outnumber the limit needs --replicas.
	var many []config.Replica
	for i := range 513 {
		many = append(many, config.Replica{Name: fmt.Sprintf("r%d", i), Address: fmt.Sprintf("http://10.0.%d.%d:8000", i/256, i%256)})
	}
	require.NoError(t, config.Update(cfg, func(f *config.File) error { f.Models["big"] = config.Model{Replicas: many}; return nil }))
	before, err = os.ReadFile(cfg)
	require.NoError(t, err)
	r := exa(t, cfg, "serve", "routing", "simulate", "big", "--requests", "10")
	assertRejected(t, r, `model "big" has 513 replicas, more than the 512 simulate takes; pass --replicas N (1..512)`, cfg, before)
	assert.Contains(t, ok(t, cfg, "serve", "routing", "simulate", "big", "--requests", "10", "--replicas", "512"), "; 512 replicas of")

	// A malformed trace line is bad input too, named by line number.
	trace := filepath.Join(t.TempDir(), "bad.jsonl")
	require.NoError(t, os.WriteFile(trace, []byte(`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}`+"\n{oops\n"), 0o644))
	r = exa(t, cfg, "serve", "routing", "simulate", "--trace", trace)
	assert.Equal(t, 2, r.code, r.stderr)
	assert.Contains(t, r.stderr, "line 2")
}

func TestStatsBeforeAndAfterSimulate(t *testing.T) {
	cfg := newConfig(t)
	ok(t, cfg, "serve", "routing", "set", "JPCP", "--mode", "cache_aware", "--slo-latency-ms", "500")

	before := ok(t, cfg, "serve", "routing", "stats", "JPCP")
	assert.Contains(t, before, "mode:         cache_aware")
	assert.Contains(t, before, "no routing statistics for JPCP")
	assert.Contains(t, before, "no simulation of JPCP yet (run: exa serve routing simulate JPCP)")
	var js statsOutput
	require.NoError(t, json.Unmarshal([]byte(ok(t, cfg, "serve", "routing", "stats", "JPCP", "--json")), &js))
	assert.Nil(t, js.Stats)
	assert.True(t, js.Configured)

	// An unconfigured model says so too.
	assert.Contains(t, ok(t, cfg, "serve", "routing", "stats", "nobody"), "model nobody has no stored routing configuration")

	sim := ok(t, cfg, "serve", "routing", "simulate", "JPCP", "--replicas", "4", "--shared-prefix-requests", "100")
	assert.Contains(t, sim, "router SLO 500ms from JPCP's configuration")
	caRate, _ := specLines(t, sim)

	after := ok(t, cfg, "serve", "routing", "stats", "JPCP")
	assert.Contains(t, after, "mode:         cache_aware")
	assert.Contains(t, after, "routing statistics (simulated")
	assert.Contains(t, after, "policy:            cache_aware")
	assert.Contains(t, after, "requests:          100\n")
	assert.Contains(t, after, fmt.Sprintf("token hit rate:    %.1f%% of prompt tokens", caRate))
	for i := range 4 {
		assert.Regexp(t, fmt.Sprintf(`(?m)^\s*r%d\s+\d+\s+\d+\.\d%%`, i), after)
	}

	require.NoError(t, json.Unmarshal([]byte(ok(t, cfg, "serve", "routing", "stats", "JPCP", "--json")), &js))
	require.NotNil(t, js.Stats)
	st := *js.Stats
	assert.Equal(t, config.SourceSimulated, st.Source)
	assert.Equal(t, "cache_aware", st.Mode)
	assert.Equal(t, uint64(100), st.Requests)
	var routed, decided uint64
	var share float64
	for _, r := range st.Replicas {
		routed += r.Routed
		share += r.Share
	}
	for _, n := range st.Decisions {
		decided += n
	}
	assert.Equal(t, st.Requests, routed)
	assert.Equal(t, st.Requests, decided)
	assert.InDelta(t, 1, share, 1e-9)
	assert.InDelta(t, caRate/100, st.TokenHitRate, 0.0005)
	assert.NotEmpty(t, st.Simulation)

	// The model's stored replicas set the simulated cluster's size.
	ok(t, cfg, "serve", "routing", "set", "three", "--replica", "a=http://a", "--replica", "b=http://b", "--replica", "c=http://c")
	assert.Contains(t, ok(t, cfg, "serve", "routing", "simulate", "three", "--shared-prefix-requests", "30"), "; 3 replicas of")
	assert.Contains(t, ok(t, cfg, "serve", "routing", "simulate", "three", "--shared-prefix-requests", "30", "--replicas", "5"), "; 5 replicas of")

	// A later simulate replaces the record.
	ok(t, cfg, "serve", "routing", "simulate", "JPCP", "--replicas", "2", "--shared-prefix-requests", "50")
	require.NoError(t, json.Unmarshal([]byte(ok(t, cfg, "serve", "routing", "stats", "JPCP", "--json")), &js))
	assert.Equal(t, uint64(50), js.Stats.Requests)
	assert.Len(t, js.Stats.Replicas, 2)
}

// Flow control and the multi-tenant workloads from the command line: the
// tables appear, the same flags give the same output, and bad flags are
// usage errors naming the flag.
func TestSimulateFlowControl(t *testing.T) {
	cfg := newConfig(t)
	args := []string{"serve", "routing", "simulate", "--replicas", "2", "--workload", "noisy-neighbour", "--requests", "300", "--rate", "200",
		"--flow-control", "on", "--admission-outstanding", "4", "--flow-ttl", "2s", "--policies", "cache_aware,gie_flow"}
	out := ok(t, cfg, args...)
	for _, want := range []string{`2 tenants, "noisy" sending 5× each other's requests`, "per tenant", "flow control (", "gie_flow", "quiet1"} {
		assert.Contains(t, out, want)
	}
	assert.Equal(t, out, ok(t, cfg, args...))
	// A rate limit per tenant: the same requests refused for every policy.
	rl := ok(t, cfg, "serve", "routing", "simulate", "--replicas", "2", "--workload", "noisy-neighbour", "--requests", "300", "--rate", "200",
		"--rate-limit", "20", "--rate-limit-burst", "2", "--policies", "cache_aware")
	assert.Regexp(t, `rate limit: 20 requests/s, burst 2, per tenant at each gateway; refused \(in drop\): round_robin (\d+) cache_aware (\d+)\n`, rl)
	var js simOutput
	require.NoError(t, json.Unmarshal([]byte(ok(t, cfg, "serve", "routing", "simulate", "--replicas", "2", "--workload", "noisy-neighbour", "--requests", "300", "--rate", "200",
		"--rate-limit", "20", "--policies", "cache_aware", "--json")), &js))
	assert.Equal(t, flow.Rate{PerSecond: 20, Burst: 20}, js.Report.RateLimit, "the burst defaults to the rate rounded up")
	for _, x := range js.Report.Results {
		assert.Positive(t, x.RateLimited, x.Policy)
		assert.Equal(t, js.Report.Results[0].RateLimited, x.RateLimited, x.Policy)
	}
	ib := ok(t, cfg, "serve", "routing", "simulate", "--replicas", "2", "--workload", "interactive-batch", "--requests", "200", "--only", "interactive", "--policies", "cache_aware")
	assert.Contains(t, ib, "per class")
	assert.Contains(t, ib, `only "interactive"'s requests`)
	assert.NotContains(t, ib, "batch  ")

	ok(t, cfg, "serve", "routing", "set", "JPCP", "--mode", "cache_aware")
	before, err := os.ReadFile(cfg)
	require.NoError(t, err)
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--flow-control", "on"}, "--flow-control on needs an admission threshold"},
		{[]string{"--flow-control", "maybe"}, `invalid --flow-control "maybe": want on or off`},
		{[]string{"--flow-ttl", "1s"}, "--flow-ttl applies to --flow-control on only"},
		{[]string{"--flow-control", "on", "--admission-outstanding", "4", "--flow-fairness", "fair"}, `invalid --flow-fairness "fair"`},
		{[]string{"--flow-control", "on", "--admission-outstanding", "4", "--flow-ttl", "0s"}, "invalid --flow-ttl 0s: want 1ms..1h"},
		{[]string{"--flow-control", "on", "--admission-outstanding", "4", "--flow-max-requests", "0"}, "invalid --flow-max-requests 0"},
		{[]string{"--flow-control", "on", "--admission-outstanding", "4", "--flow-usage-limit", "1=0"}, `invalid --flow-usage-limit "1=0"`},
		{[]string{"--flow-usage-limit", "0=0.5"}, "--flow-usage-limit applies to --flow-control on only"},
		{[]string{"--tenants", "3"}, "--tenants applies to --workload noisy-neighbour only"},
		{[]string{"--workload", "noisy-neighbour", "--tenants", "0"}, "invalid --tenants 0: want 1..64"},
		{[]string{"--workload", "noisy-neighbour", "--noisy", "-1"}, "invalid --noisy -1"},
		{[]string{"--workload", "noisy-neighbour", "--only", "nobody"}, `Only "nobody" names no tenant`},
		{[]string{"--only", "quiet1"}, "--only applies to --workload noisy-neighbour or interactive-batch only"},
		{[]string{"--rate-limit", "-1"}, `invalid --rate-limit "-1": want 0 (no limit) or a rate of at least 1e-6 requests/s`},
		{[]string{"--rate-limit", "5", "--rate-limit-burst", "-2"}, `invalid --rate-limit-burst "-2": must not be negative`},
		{[]string{"--rate-limit-burst", "3"}, `invalid --rate-limit-burst "3": needs --rate-limit, which is off`},
	} {
		r := exa(t, cfg, append([]string{"serve", "routing", "simulate", "--requests", "10"}, tc.args...)...)
		assertRejected(t, r, tc.msg, cfg, before)
	}
}

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
)

// exaBin is the exa binary built once for the package's tests. It is
// built with go test's own compile flags, so every package it links is
// already in the build cache from compiling the tests; only the link is
// extra. The version is stamped at link time as the image's build does
// (-X main.version), which TestStaticBuildVersion checks.
var exaBin string

// testVersion is the version stamped into exaBin.
const testVersion = "v9.8.7-test"

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "exa-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	exaBin = filepath.Join(dir, "exa")
	build := exec.Command("go", "build", "-ldflags", "-X main.version="+testVersion, "-o", exaBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building exa:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// result is one run of the binary.
type result struct {
	stdout, stderr string
	code           int
}

// exa runs the binary with EXA_CONFIG=cfg and returns what it printed and
// its exit status.
func exa(t testing.TB, cfg string, args ...string) result {
	t.Helper()
	cmd := exec.Command(exaBin, args...)
	cmd.Env = append(os.Environ(), config.EnvVar+"="+cfg, "EXA_GATEWAY=")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if err != nil {
		var ee *exec.ExitError
		require.True(t, errors.As(err, &ee), "running exa: %v", err)
		code = ee.ExitCode()
	}
	return result{out.String(), errb.String(), code}
}

// ok runs the binary and requires success.
func ok(t testing.TB, cfg string, args ...string) string {
	t.Helper()
	r := exa(t, cfg, args...)
	require.Equal(t, 0, r.code, "exa %v: stderr %q", args, r.stderr)
	return r.stdout
}

// assertRejected checks that r is a bad-input exit (code 2) with a one-line
// error containing msg, and that the config file at cfg still holds before.
func assertRejected(t *testing.T, r result, msg, cfg string, before []byte) {
	t.Helper()
	assert.Equal(t, 2, r.code, "stderr: %s", r.stderr)
	assert.Contains(t, r.stderr, msg)
	assert.Equal(t, 1, strings.Count(r.stderr, "\n"), "one-line error: %q", r.stderr)
	after, err := os.ReadFile(cfg)
	require.NoError(t, err)
	assert.Equal(t, string(before), string(after))
}

func newConfig(t *testing.T) string {
	return filepath.Join(t.TempDir(), "exa", "routing.json")
}

// getModel reads a model through "get --json".
func getModel(t *testing.T, cfg, model string) config.Model {
	t.Helper()
	var m config.Model
	require.NoError(t, json.Unmarshal([]byte(ok(t, cfg, "serve", "routing", "get", model, "--json")), &m))
	return m
}

func TestSetGetRoundTrip(t *testing.T) {
	cfg := newConfig(t)
	out := ok(t, cfg, "serve", "routing", "set", "JPCP", "--mode", "cache_aware", "--slo-latency-ms", "500")
	assert.Contains(t, out, "saved JPCP in "+cfg)
	out = ok(t, cfg, "serve", "routing", "set", "JPCP", "--disaggregate", "--prefill-pool", "prefill", "--decode-pool", "decode")
	assert.Contains(t, out, `disaggregate: on (prefill pool "prefill", decode pool "decode")`)
	assert.Contains(t, out, `p/d split:    gateway mode, at 512 uncached prompt tokens or more (default)`)
	ok(t, cfg, "serve", "routing", "set", "JPCP",
		"--replica", "r0=http://127.0.0.1:8000", "--replica", "r1=http://127.0.0.1:8001",
		"--pool", "prefill:p0=http://127.0.0.1:9000", "--pool", "decode:d0=http://127.0.0.1:9100",
		"--load-weights", "queue=2,kv=1,latency=0.5")
	ok(t, cfg, "serve", "routing", "set", "org/other-model", "--mode", "load-aware")

	want := config.Model{
		Mode: gateway.ModeCacheAware, SLOLatencyMS: 500,
		LoadWeights:  &config.LoadWeights{Queue: 2, KV: 1, Latency: 0.5},
		Disaggregate: true, PrefillPool: "prefill", DecodePool: "decode",
		Replicas: []config.Replica{{Name: "r0", Address: "http://127.0.0.1:8000"}, {Name: "r1", Address: "http://127.0.0.1:8001"}},
		Pools: map[string][]config.Replica{
			"prefill": {{Name: "p0", Address: "http://127.0.0.1:9000"}},
			"decode":  {{Name: "d0", Address: "http://127.0.0.1:9100"}},
		},
	}
	assert.Equal(t, want, getModel(t, cfg, "JPCP"))
	assert.Equal(t, config.Model{Mode: gateway.ModeLoadAware}, getModel(t, cfg, "org/other-model"))

	// The file is what the config package reads, and human-readable.
	f, err := config.Load(cfg)
	require.NoError(t, err)
	assert.Equal(t, want, f.Models["JPCP"])
	raw, err := os.ReadFile(cfg)
	require.NoError(t, err)
	assert.Contains(t, string(raw), "\n      \"mode\": \"cache_aware\",\n")

	human := ok(t, cfg, "serve", "routing", "get", "JPCP")
	for _, line := range []string{
		"mode:         cache_aware", "slo latency:  500ms", "load weights: queue=2 kv=1 latency=0.5",
		"replicas:     r0=http://127.0.0.1:8000, r1=http://127.0.0.1:8001", "pool prefill: p0=http://127.0.0.1:9000",
	} {
		assert.Contains(t, human, line)
	}
	list := ok(t, cfg, "serve", "routing", "list")
	assert.Regexp(t, `(?m)^JPCP\s+cache_aware\s+500ms\s+on\s+2\s+decode,prefill$`, list)
	assert.Regexp(t, `(?m)^org/other-model\s+load_aware\s+none\s+off\s+0\s+-$`, list)

	var all map[string]config.Model
	require.NoError(t, json.Unmarshal([]byte(ok(t, cfg, "serve", "routing", "list", "--json")), &all))
	assert.Len(t, all, 2)

	ok(t, cfg, "serve", "routing", "delete", "org/other-model")
	r := exa(t, cfg, "serve", "routing", "get", "org/other-model")
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, `no routing configuration for model "org/other-model"`)
}

func TestEmptyList(t *testing.T) {
	cfg := newConfig(t)
	assert.Equal(t, "no models configured in "+cfg+"\n", ok(t, cfg, "serve", "routing", "list"))
	_, err := os.Stat(cfg)
	assert.ErrorIs(t, err, os.ErrNotExist, "reading must not create the file")
}

func TestPartialUpdates(t *testing.T) {
	cfg := newConfig(t)
	ok(t, cfg, "serve", "routing", "set", "M", "--mode", "cache_aware", "--slo-latency-ms", "250", "--replica", "a=http://a:1")
	for _, tc := range []struct {
		name string
		args []string
		want func(*config.Model)
	}{
		{"no flags changes nothing", nil, func(*config.Model) {}},
		{"slo only", []string{"--slo-latency-ms", "900"}, func(m *config.Model) { m.SLOLatencyMS = 900 }},
		{"mode only", []string{"--mode", "load_aware"}, func(m *config.Model) { m.Mode = gateway.ModeLoadAware }},
		{"one weight starts from the defaults", []string{"--load-weights", "kv=2"}, func(m *config.Model) {
			m.LoadWeights = &config.LoadWeights{Queue: 1, KV: 2, Latency: 0.25}
		}},
		{"another weight keeps the first", []string{"--load-weights", "latency=0"}, func(m *config.Model) { m.LoadWeights.Latency = 0 }},
		{"disaggregate fills default pools", []string{"--disaggregate"}, func(m *config.Model) {
			m.Disaggregate, m.PrefillPool, m.DecodePool = true, "prefill", "decode"
		}},
		{"rename prefill pool of a disaggregated model", []string{"--prefill-pool", "pp"}, func(m *config.Model) { m.PrefillPool = "pp" }},
		{"p/d mode and threshold", []string{"--pd-mode", "sidecar", "--pd-min-uncached-tokens", "0"}, func(m *config.Model) {
			zero := 0
			m.PDMode, m.PDMinUncachedTokens = "sidecar", &zero
		}},
		{"switching off keeps the pool names", []string{"--disaggregate=false"}, func(m *config.Model) { m.Disaggregate = false }},
		{"pool members", []string{"--pool", "pp:x=http://x:1"}, func(m *config.Model) {
			m.Pools = map[string][]config.Replica{"pp": {{Name: "x", Address: "http://x:1"}}}
		}},
		{"replicas replaced", []string{"--replica", "b=http://b:1", "--replica", "c=http://c:1"}, func(m *config.Model) {
			m.Replicas = []config.Replica{{Name: "b", Address: "http://b:1"}, {Name: "c", Address: "http://c:1"}}
		}},
		{"remove pool", []string{"--remove-pool", "pp"}, func(m *config.Model) { m.Pools = nil }},
		{"clear replicas", []string{"--clear-replicas"}, func(m *config.Model) { m.Replicas = nil }},
		{"slo zero means none", []string{"--slo-latency-ms", "0"}, func(m *config.Model) { m.SLOLatencyMS = 0 }},
		{"engine type", []string{"--engine", "sglang"}, func(m *config.Model) { m.Engine = "sglang" }},
		{"engine auto clears it", []string{"--engine", "auto"}, func(m *config.Model) { m.Engine = "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := getModel(t, cfg, "M")
			tc.want(&want)
			ok(t, cfg, append([]string{"serve", "routing", "set", "M"}, tc.args...)...)
			assert.Equal(t, want, getModel(t, cfg, "M"))
		})
	}
}

func TestConcurrentSetsLoseNoUpdate(t *testing.T) {
	cfg := newConfig(t)
	ok(t, cfg, "serve", "routing", "set", "shared")
	const procs, each = 8, 3
	var wg sync.WaitGroup
	errs := make(chan string, procs*each)
	for p := range procs {
		wg.Go(func() {
			for i := range each {
				// Every process updates its own pool of the same model (a
				// read-modify-write of one entry) and its own model.
				for _, args := range [][]string{
					{"serve", "routing", "set", "shared", "--pool", fmt.Sprintf("pool%d:r%d=http://h%d:%d", p, i, p, 8000+i)},
					{"serve", "routing", "set", fmt.Sprintf("m%d", p), "--slo-latency-ms", fmt.Sprint(i + 1)},
				} {
					if r := exa(t, cfg, args...); r.code != 0 {
						errs <- r.stderr
					}
				}
			}
		})
	}
	// Meanwhile a reader never sees a torn or half-written file.
	stop := make(chan struct{})
	var reads int
	var readErr error
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := config.Load(cfg); err != nil && readErr == nil {
				readErr = err
			}
			reads++
		}
	}()
	wg.Wait()
	close(stop)
	<-readerDone
	require.NoError(t, readErr, "a concurrent reader saw a bad file")
	assert.Positive(t, reads)
	close(errs)
	for e := range errs {
		t.Errorf("concurrent set failed: %s", e)
	}
	f, err := config.Load(cfg)
	require.NoError(t, err)
	require.Len(t, f.Models, procs+1)
	shared := f.Models["shared"]
	require.Len(t, shared.Pools, procs, "an update was lost")
	for p := range procs {
		assert.Equal(t, []config.Replica{{Name: fmt.Sprintf("r%d", each-1), Address: fmt.Sprintf("http://h%d:%d", p, 8000+each-1)}}, shared.Pools[fmt.Sprintf("pool%d", p)])
		assert.Equal(t, int64(each), f.Models[fmt.Sprintf("m%d", p)].SLOLatencyMS)
	}
	entries, err := os.ReadDir(filepath.Dir(cfg))
	require.NoError(t, err)
	for _, e := range entries {
		assert.False(t, strings.Contains(e.Name(), ".tmp-"), "temporary file left behind: %s", e.Name())
	}
}

func TestBadInputLeavesFileUntouched(t *testing.T) {
	cfg := newConfig(t)
	ok(t, cfg, "serve", "routing", "set", "JPCP", "--mode", "cache_aware", "--slo-latency-ms", "500", "--replica", "r0=http://a:1")
	before, err := os.ReadFile(cfg)
	require.NoError(t, err)

	for _, tc := range []struct {
		name string
		args []string
		msg  string
	}{
		{"unknown mode", []string{"set", "JPCP", "--mode", "fastest"}, `invalid --mode "fastest": want round_robin, cache_aware or load_aware`},
		{"empty mode", []string{"set", "JPCP", "--mode", ""}, `invalid --mode "": want round_robin, cache_aware or load_aware`},
		{"negative slo", []string{"set", "JPCP", "--slo-latency-ms", "-5"}, `invalid --slo-latency-ms "-5": must not be negative`},
		{"non-numeric slo", []string{"set", "JPCP", "--slo-latency-ms", "fast"}, `invalid --slo-latency-ms "fast": want a whole number of milliseconds`},
		{"fractional slo", []string{"set", "JPCP", "--slo-latency-ms", "1.5"}, `invalid --slo-latency-ms "1.5"`},
		{"prefill pool without disaggregate", []string{"set", "JPCP", "--prefill-pool", "prefill"}, `--prefill-pool "prefill" requires --disaggregate`},
		{"decode pool without disaggregate", []string{"set", "JPCP", "--decode-pool", "decode"}, `--decode-pool "decode" requires --disaggregate`},
		{"prefill pool with disaggregate off", []string{"set", "JPCP", "--disaggregate=false", "--prefill-pool", "p"}, `--prefill-pool "p" requires --disaggregate`},
		{"same pools", []string{"set", "JPCP", "--disaggregate", "--prefill-pool", "x", "--decode-pool", "x"}, `invalid --decode-pool: decode_pool "x": must differ from prefill_pool`},
		{"p/d mode without disaggregate", []string{"set", "JPCP", "--pd-mode", "sidecar"}, `--pd-mode sidecar requires --disaggregate`},
		{"unknown p/d mode", []string{"set", "JPCP", "--disaggregate", "--pd-mode", "both"}, `invalid --pd-mode "both": want gateway or sidecar`},
		{"unknown engine", []string{"set", "JPCP", "--engine", "tgi"}, `invalid --engine "tgi": want vllm, sglang, trtllm or auto`},
		{"negative threshold", []string{"set", "JPCP", "--disaggregate", "--pd-min-uncached-tokens", "-1"}, `invalid --pd-min-uncached-tokens "-1": want a whole number of tokens from 0`},
		{"threshold too large", []string{"set", "JPCP", "--disaggregate", "--pd-min-uncached-tokens", "10000001"}, `invalid --pd-min-uncached-tokens "10000001"`},
		{"empty model name", []string{"set", ""}, `invalid MODEL "": must not be empty`},
		{"blank model name", []string{"set", " JPCP"}, `invalid MODEL " JPCP": must not start or end with spaces`},
		{"missing model", []string{"set"}, `exactly one MODEL argument, got 0`},
		{"two models", []string{"get", "a", "b"}, `exactly one MODEL argument, got 2`},
		{"bad weight key", []string{"set", "JPCP", "--load-weights", "speed=1"}, `invalid --load-weights "speed=1"`},
		{"negative weight", []string{"set", "JPCP", "--load-weights", "kv=-1"}, `invalid --load-weights "kv=-1"`},
		{"all weights zero", []string{"set", "JPCP", "--load-weights", "queue=0,kv=0,latency=0"}, `not all weights may be zero`},
		{"bad replica", []string{"set", "JPCP", "--replica", "noaddress"}, `invalid --replica "noaddress": want NAME=ADDRESS`},
		{"duplicate replica", []string{"set", "JPCP", "--replica", "a=http://x", "--replica", "a=http://y"}, `replicas[1].name "a": duplicate replica name`},
		{"bad pool", []string{"set", "JPCP", "--pool", "a=b"}, `invalid --pool "a=b": want POOL:NAME=ADDRESS`},
		{"remove unknown pool", []string{"set", "JPCP", "--remove-pool", "nope"}, `invalid --remove-pool "nope": model "JPCP" has no such pool`},
		{"replica and clear-replicas", []string{"set", "JPCP", "--replica", "a=b", "--clear-replicas"}, `--replica and --clear-replicas cannot be used together`},
		{"unknown flag", []string{"set", "JPCP", "--colour", "red"}, `unknown flag: --colour`},
		{"unknown subcommand", []string{"frobnicate"}, `unknown command "frobnicate" for "exa serve routing"`},
		{"bad gateway url", []string{"stats", "JPCP", "--gateway", "ftp://x"}, `invalid --gateway "ftp://x"`},
		{"ftp replica", []string{"set", "JPCP", "--replica", "r0=ftp://x"}, `invalid --replica "r0=ftp://x": address scheme "ftp", want http or https`},
		{"file replica", []string{"set", "JPCP", "--replica", "r0=file:///etc/passwd"}, `invalid --replica "r0=file:///etc/passwd": address scheme "file", want http or https`},
		{"replica port out of range", []string{"set", "JPCP", "--replica", "r0=http://h:99999"}, `invalid --replica "r0=http://h:99999": address port 99999 out of range 1..65535`},
		{"replica control character", []string{"set", "JPCP", "--replica", "r0=http://h\x01:80"}, `invalid --replica "r0=http://h\x01:80": address must not contain spaces or control characters`},
		{"replica escape sequence", []string{"set", "JPCP", "--replica", "r0=http://h\x1b[2J"}, `invalid --replica "r0=http://h\x1b[2J": address must not contain spaces or control characters`},
		{"replica credentials", []string{"set", "JPCP", "--replica", "r0=http://u:p@h"}, `address must not contain credentials`},
		{"replica control in name", []string{"set", "JPCP", "--replica", "r\x070=http://h"}, `invalid --replica "r\a0=http://h": name must not contain control characters`},
		{"long replica name", []string{"set", "JPCP", "--replica", strings.Repeat("r", 256) + "=http://h"}, `name 256 bytes, at most 255`},
		{"ftp pool member", []string{"set", "JPCP", "--pool", "prefill:p0=ftp://x"}, `invalid --pool "prefill:p0=ftp://x": address scheme "ftp", want http or https`},
		{"pool port out of range", []string{"set", "JPCP", "--pool", "prefill:p0=h:70000"}, `invalid --pool "prefill:p0=h:70000": address port 70000 out of range 1..65535`},
		{"long model name", []string{"set", strings.Repeat("m", 300)}, `: 300 bytes, at most 255`},
		{"long model name to simulate", []string{"simulate", strings.Repeat("m", 256), "--requests", "10"}, `: 256 bytes, at most 255`},
		{"invalid UTF-8 model name", []string{"set", "m\xff"}, `invalid MODEL "m\xff": must be valid UTF-8`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := exa(t, cfg, append([]string{"serve", "routing"}, tc.args...)...)
			assertRejected(t, r, tc.msg, cfg, before)
			assert.True(t, strings.HasPrefix(r.stderr, "exa: "), r.stderr)
			assert.Empty(t, r.stdout)
		})
	}
}

func TestCorruptConfig(t *testing.T) {
	for _, tc := range []struct {
		name, content, msg string
	}{
		{"syntax", "{\"version\": 1, \"models\": {\"JPCP\": {\"mode\": \"cache_aware\",}}}\n", "corrupt config file"},
		{"truncated", `{"version": 1, "models": {"JP`, "corrupt config file"},
		{"unknown field", `{"version": 1, "modelz": {}}`, `unknown field modelz; the fields of the document are models, version`},
		{"invalid value", `{"version": 1, "models": {"JPCP": {"slo_latency_ms": -3}}}`, `invalid models.JPCP.slo_latency_ms "-3"`},
		{"null", "null\n", "the document is null, want an object"},
		{"array", `[{"models": {}}]`, "the document is an array, want an object"},
		{"null model", `{"version": 1, "models": {"JPCP": null}}`, "models.JPCP is null; leave the field out instead"},
		{"duplicate model", `{"models": {"JPCP": {}, "JPCP": {"mode": "cache_aware"}}}`, "models.JPCP is given twice"},
		{"field in another case", `{"Version": 1}`, `unknown field Version (field names are case-sensitive: did you mean "version"?)`},
		{"hand-edited ftp replica", `{"models": {"JPCP": {"replicas": [{"name": "r0", "address": "ftp://x"}]}}}`, `invalid models.JPCP.replicas[0].address "ftp://x"`},
		{"hand-edited port", `{"models": {"JPCP": {"pools": {"p": [{"name": "r0", "address": "http://h:99999"}]}}}}`, `invalid models.JPCP.pools.p[0].address "http://h:99999"`},
		{"hand-edited control character", `{"models": {"JPCP": {"replicas": [{"name": "r0", "address": "http://h\u0001"}]}}}`, `invalid models.JPCP.replicas[0].address "http://h\x01"`},
		{"hand-edited long name", `{"models": {"` + strings.Repeat("m", 256) + `": {}}}`, `256 bytes, at most 255`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := newConfig(t)
			require.NoError(t, os.MkdirAll(filepath.Dir(cfg), 0o755))
			require.NoError(t, os.WriteFile(cfg, []byte(tc.content), 0o644))
			for _, args := range [][]string{
				{"set", "JPCP", "--mode", "round_robin"},
				{"get", "JPCP"},
				{"list"},
				{"stats", "JPCP"},
				{"delete", "JPCP"},
			} {
				r := exa(t, cfg, append([]string{"serve", "routing"}, args...)...)
				assert.Equal(t, 2, r.code, "%v: %s", args, r.stderr)
				assert.Contains(t, r.stderr, tc.msg)
				assert.Contains(t, r.stderr, cfg, "the error names the file")
				assert.Equal(t, 1, strings.Count(r.stderr, "\n"), "one-line error: %q", r.stderr)
				got, err := os.ReadFile(cfg)
				require.NoError(t, err)
				assert.Equal(t, tc.content, string(got))
			}
		})
	}
}

// TestEmptyObjectConfig: a file holding {} is a valid empty configuration,
// as a missing file is; the first set fills it in.
func TestEmptyObjectConfig(t *testing.T) {
	cfg := newConfig(t)
	require.NoError(t, os.MkdirAll(filepath.Dir(cfg), 0o755))
	require.NoError(t, os.WriteFile(cfg, []byte("{}\n"), 0o644))
	assert.Equal(t, "no models configured in "+cfg+"\n", ok(t, cfg, "serve", "routing", "list"))
	ok(t, cfg, "serve", "routing", "set", "JPCP")
	assert.Equal(t, config.Model{Mode: gateway.ModeRoundRobin}, getModel(t, cfg, "JPCP"))
}

// TestLongModelNameStats: a model name of the longest accepted length,
// whose escaped form is far longer than a file name may be, still gets its
// statistics file written and read back.
func TestLongModelNameStats(t *testing.T) {
	cfg := newConfig(t)
	name := strings.Repeat("é/", config.MaxNameBytes/3)
	require.NoError(t, config.ValidateModelName(name))
	ok(t, cfg, "serve", "routing", "set", name)
	ok(t, cfg, "serve", "routing", "simulate", name, "--replicas", "2", "--shared-prefix-requests", "10")
	assert.Contains(t, ok(t, cfg, "serve", "routing", "stats", name), "routing statistics (simulated")
}

func TestStatsFromGateway(t *testing.T) {
	cfg := newConfig(t)
	ok(t, cfg, "serve", "routing", "set", "JPCP", "--mode", "cache_aware")
	doc := config.StatsDocument{Models: map[string]config.RoutingStats{"JPCP": {
		Model: "JPCP", Source: config.SourceGateway, Mode: "cache_aware", Requests: 10, Hits: 7, HitRate: 0.7, Blocks: 20, MatchedBlocks: 15, BlockHitRate: 0.75,
		Decisions:   map[string]uint64{"affinity": 8, "load_aware": 2},
		SLOExcluded: 3, SLOFallbacks: 1, NoMatch: 2,
		Replicas: []config.ReplicaStats{{Name: "r0", Routed: 6, Hits: 5, Share: 0.6, Healthy: true}, {Name: "r1", Routed: 4, Hits: 2, Share: 0.4}},
	}}}
	var (
		mu              sync.Mutex
		gotPath, gotMdl string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		gotPath, gotMdl = r.URL.Path, r.URL.Query().Get("model")
		_ = json.NewEncoder(w).Encode(doc)
	}))
	defer srv.Close()

	out := ok(t, cfg, "serve", "routing", "stats", "JPCP", "--gateway", srv.URL)
	mu.Lock()
	assert.Equal(t, "/stats", gotPath)
	assert.Equal(t, "JPCP", gotMdl)
	mu.Unlock()
	for _, want := range []string{
		"mode:         cache_aware",
		"routing statistics (live, from gateway " + srv.URL + "):",
		"hit rate:          75.0% of prompt blocks cached on the chosen replica (15 of 20,",
		"whole-prompt hits: 70.0% of requests (7 of 10)",
		"decisions:         affinity 8 (80.0%), load_aware 2 (20.0%), round_robin 0 (0.0%)",
		"slo exclusions:    3",
		"fallbacks:         slo 1, no match 2, load guard 0, no healthy replica 0",
	} {
		assert.Contains(t, out, want)
	}
	assert.Regexp(t, `(?m)^\s*r0\s+6\s+60\.0%\s+5\s+yes\s+0\s*$`, out)
	assert.Regexp(t, `(?m)^\s*r1\s+4\s+40\.0%\s+2\s+no\s+0\s*$`, out)

	// A disaggregated model: the decider's figures and the prefill pool.
	rec := doc.Models["JPCP"]
	rec.Disaggregation = &config.DisaggregationStats{Mode: "gateway", MinUncachedTokens: 512, Decided: 10, Split: 4, SplitShare: 0.4,
		Fallbacks: map[string]uint64{"prefill_failed": 1, "decode_retry": 2, "prefill_retry": 3},
		Prefill:   &config.RoutingStats{Requests: 4, BlockHitRate: 0.5, Replicas: []config.ReplicaStats{{Name: "prefill/p0", Routed: 4, Share: 1, Healthy: true}}}}
	mu.Lock()
	doc.Models["JPCP"] = rec
	mu.Unlock()
	out = ok(t, cfg, "serve", "routing", "stats", "JPCP", "--gateway", srv.URL)
	assert.Contains(t, out, "p/d split:         4 of 10 requests (40.0%), gateway mode, at 512 uncached prompt tokens or more")
	assert.Contains(t, out, "p/d fallbacks:     prefill unavailable 0, prefill failed 1, no kv_transfer_params 0, decode retried 2, prefill retried 3")
	assert.Contains(t, out, "prefill pool: 4 requests, 50.0% of prompt blocks cached on the chosen replica")
	assert.Regexp(t, `(?m)^\s*prefill/p0\s+4\s+100\.0%\s+0\s+yes\s+0\s*$`, out)

	// A gateway that does not serve the model: say so and fall back.
	out = ok(t, cfg, "serve", "routing", "stats", "other", "--gateway", srv.URL)
	assert.Contains(t, out, `the gateway does not serve model "other"`)
	assert.Contains(t, out, "no routing statistics for other")
}

// TestStatsFromHostileGateway: the strings of a gateway's /stats reach the
// terminal escaped, and an error answer fails the command (exit 1) with
// its message escaped, not a crash.
func TestStatsFromHostileGateway(t *testing.T) {
	cfg := newConfig(t)
	ok(t, cfg, "serve", "routing", "set", "JPCP")
	body := `{"models":{"JPCP":{"mode":"x\u001b]0;pwned\u0007","requests":1,"replicas":[{"name":"r\u001b[2J\u009b1m","routed":1,"share":1}]}}}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("model") == "bad" {
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(`{"error":{"message":"boom\u001b[2J"}}`))
			return
		}
		_, _ = w.Write([]byte(body))
	}))
	defer srv.Close()
	out := ok(t, cfg, "serve", "routing", "stats", "JPCP", "--gateway", srv.URL)
	assert.Contains(t, out, `policy:            "x\x1b]0;pwned\a"`)
	assert.Contains(t, out, `"r\x1b[2J\u009b1m"`)
	assert.NotContains(t, out, "\x1b")
	assert.NotContains(t, out, "\u009b")

	ok(t, cfg, "serve", "routing", "set", "bad")
	r := exa(t, cfg, "serve", "routing", "stats", "bad", "--gateway", srv.URL)
	assert.Equal(t, 1, r.code, "a gateway answering with an error fails the command")
	assert.Contains(t, r.stderr, `500 Internal Server Error: "boom\x1b[2J"`)
	assert.NotContains(t, r.stderr, "\x1b")
}

func TestHelpAndCompletion(t *testing.T) {
	cfg := newConfig(t)
	for _, args := range [][]string{
		{"--help"}, {"serve", "--help"}, {"serve", "routing", "--help"},
		{"serve", "routing", "set", "--help"}, {"serve", "routing", "get", "--help"},
		{"serve", "routing", "list", "--help"}, {"serve", "routing", "delete", "--help"},
		{"serve", "routing", "simulate", "--help"}, {"serve", "routing", "stats", "--help"},
		{"serve", "gateway", "--help"}, {"completion", "--help"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			out := ok(t, cfg, args...)
			assert.Contains(t, out, "Usage:")
		})
	}
	assert.Contains(t, ok(t, cfg, "serve", "routing", "set", "--help"), "--slo-latency-ms")
	assert.Contains(t, ok(t, cfg, "completion", "bash"), "__start_exa")
	assert.Contains(t, ok(t, cfg, "completion", "zsh"), "#compdef exa")
	for _, shell := range []string{"tcsh", "csh", ""} {
		r := exa(t, cfg, "completion", shell)
		assert.Equal(t, 2, r.code, "completion %q: %s", shell, r.stderr)
		assert.Equal(t, fmt.Sprintf("exa: unknown shell %q for \"exa completion\": want one of bash, fish, powershell, zsh\n", shell), r.stderr)
		assert.Empty(t, r.stdout)
	}

	ok(t, cfg, "serve", "routing", "set", "JPCP")
	assert.Contains(t, ok(t, cfg, "__complete", "serve", "routing", "get", ""), "JPCP")
	assert.Contains(t, ok(t, cfg, "__complete", "serve", "routing", "set", "JPCP", "--mode", ""), "cache_aware")
}

// TestGatewayBadHTTPServer: an unknown --http-server is a usage error,
// reported before anything listens.
func TestGatewayBadHTTPServer(t *testing.T) {
	r := exa(t, newConfig(t), "serve", "gateway", "--listen", "127.0.0.1:0", "--http-server", "bogus")
	assert.Equal(t, 2, r.code, "stderr: %s", r.stderr)
	assert.Contains(t, r.stderr, `invalid --http-server "bogus": want lean or std`)
	assert.True(t, strings.HasPrefix(r.stderr, "exa: "), r.stderr)
}

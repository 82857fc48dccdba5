package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/keys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func sample() Model {
	return Model{
		Mode:         gateway.ModeCacheAware,
		SLOLatencyMS: 500,
		LoadWeights:  &LoadWeights{Queue: 1, KV: 0.5, Latency: 0.25},
		Disaggregate: true,
		PrefillPool:  "prefill",
		DecodePool:   "decode",
		Replicas:     []Replica{{Name: "r0", Address: "http://127.0.0.1:8000"}, {Name: "r1", Address: "http://127.0.0.1:8001", CacheBlocks: 8192}},
		Pools: map[string][]Replica{
			"prefill": {{Name: "p0", Address: "http://127.0.0.1:9000"}},
			"decode":  {{Name: "d0", Address: "http://127.0.0.1:9100"}},
		},
	}
}

func TestPath(t *testing.T) {
	t.Setenv(EnvVar, "/tmp/x/routing.json")
	p, err := Path()
	require.NoError(t, err)
	assert.Equal(t, "/tmp/x/routing.json", p)

	t.Setenv(EnvVar, "")
	t.Setenv("XDG_CONFIG_HOME", "/tmp/xdg")
	p, err = Path()
	require.NoError(t, err)
	assert.Equal(t, "/tmp/xdg/exa/routing.json", p)
	assert.Equal(t, "/tmp/xdg/exa/stats", StatsDir(p))
}

func TestLoadMissingIsEmpty(t *testing.T) {
	f, err := Load(filepath.Join(t.TempDir(), "none.json"))
	require.NoError(t, err)
	assert.Equal(t, Version, f.Version)
	assert.Empty(t, f.Models)
}

func TestUpdateRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "routing.json")
	require.NoError(t, Update(path, func(f *File) error {
		f.Models["JPCP"] = sample()
		return nil
	}))
	f, err := Load(path)
	require.NoError(t, err)
	m, err := f.Model("JPCP")
	require.NoError(t, err)
	assert.Equal(t, sample(), m)
	assert.Equal(t, "500ms", m.SLOLatency().String())
	assert.Len(t, m.Pool("prefill"), 1)

	_, err = f.Model("nope")
	assert.ErrorIs(t, err, ErrUnknownModel)

	// No temporary files are left behind.
	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	assert.ElementsMatch(t, []string{"routing.json", "routing.json.lock"}, names)
}

func TestModelValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(*Model)
		field string
	}{
		{"unknown mode", func(m *Model) { m.Mode = 7 }, "mode"},
		{"negative slo", func(m *Model) { m.SLOLatencyMS = -1 }, "slo_latency_ms"},
		{"slo overflowing time.Duration", func(m *Model) { m.SLOLatencyMS = math.MaxInt64 / 1000 }, "slo_latency_ms"},
		{"negative weight", func(m *Model) { m.LoadWeights.KV = -2 }, "load_weights.kv"},
		{"zero weights", func(m *Model) { *m.LoadWeights = LoadWeights{} }, "load_weights"},
		{"huge cache", func(m *Model) { m.Replicas[0].CacheBlocks = 1 << 40 }, "replicas[0].cache_blocks"},
		{"missing prefill pool", func(m *Model) { m.PrefillPool = "" }, "prefill_pool"},
		{"missing decode pool", func(m *Model) { m.DecodePool = "" }, "decode_pool"},
		{"same pools", func(m *Model) { m.DecodePool = m.PrefillPool }, "decode_pool"},
		{"duplicate replica", func(m *Model) { m.Replicas[1].Name = "r0" }, "replicas[1].name"},
		{"empty address", func(m *Model) { m.Replicas[0].Address = "" }, "replicas[0].address"},
		{"ftp address", func(m *Model) { m.Replicas[0].Address = "ftp://x" }, "replicas[0].address"},
		{"file address", func(m *Model) { m.Replicas[1].Address = "file:///etc/passwd" }, "replicas[1].address"},
		{"port out of range", func(m *Model) { m.Replicas[0].Address = "http://h:99999" }, "replicas[0].address"},
		{"control character in address", func(m *Model) { m.Replicas[0].Address = "http://h\x01:80" }, "replicas[0].address"},
		{"bad pool address", func(m *Model) { m.Pools["decode"][0].Address = "gopher://x" }, "pools.decode[0].address"},
		{"long replica name", func(m *Model) { m.Replicas[0].Name = strings.Repeat("r", MaxNameBytes+1) }, "replicas[0].name"},
		{"long pool name", func(m *Model) { m.Pools[strings.Repeat("p", MaxNameBytes+1)] = nil }, "pool"},
		{"invalid UTF-8 replica name", func(m *Model) { m.Replicas[0].Name = "r\xff" }, "replicas[0].name"},
		{"negative cache", func(m *Model) { m.Replicas[0].CacheBlocks = -5 }, "replicas[0].cache_blocks"},
		{"bad pool replica", func(m *Model) { m.Pools["decode"][0].Name = "" }, "pools.decode[0].name"},
		{"empty pool name", func(m *Model) { m.Pools[""] = nil }, "pool"},
		{"too many replicas", func(m *Model) { m.Replicas = manyReplicas("r", gateway.MaxReplicas+1) }, "replicas"},
		{"empty adapter", func(m *Model) { m.Adapters = []string{"a", ""} }, "adapters[1]"},
		{"adapter twice", func(m *Model) { m.Adapters = []string{"a", "b", "a"} }, "adapters[2]"},
		{"adapter with spaces", func(m *Model) { m.Adapters = []string{" a"} }, "adapters[0]"},
		{"too many adapters", func(m *Model) { m.Adapters = make([]string, MaxAdapters+1) }, "adapters"},
		{"too many in one pool", func(m *Model) { m.Pools["other"] = manyReplicas("o", gateway.MaxReplicas+1) }, "pools.other"},
		{"unknown pd mode", func(m *Model) { m.PDMode = "both" }, "pd_mode"},
		{"pd mode in capitals", func(m *Model) { m.PDMode = "Sidecar" }, "pd_mode"},
		{"negative pd threshold", func(m *Model) { n := -1; m.PDMinUncachedTokens = &n }, "pd_min_uncached_tokens"},
		{"huge pd threshold", func(m *Model) { n := MaxPDMinUncachedTokens + 1; m.PDMinUncachedTokens = &n }, "pd_min_uncached_tokens"},
		// prefill_pool and decode_pool name pools, so they follow the pool
		// names' rules (TestPoolReferenceNames).
		{"prefill pool with spaces", func(m *Model) { m.PrefillPool = " prefill" }, "prefill_pool"},
		{"decode pool with a control character", func(m *Model) { m.DecodePool = "de\x1b[2Jcode" }, "decode_pool"},
		{"long prefill pool", func(m *Model) { m.PrefillPool = strings.Repeat("p", MaxNameBytes+1) }, "prefill_pool"},
		{"inactive decode pool with spaces", func(m *Model) { m.Disaggregate = false; m.DecodePool = "decode " }, "decode_pool"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := sample().Clone()
			tc.edit(&m)
			err := m.Validate()
			require.ErrorIs(t, err, ErrInvalid)
			var fe *FieldError
			require.ErrorAs(t, err, &fe)
			assert.Equal(t, tc.field, fe.Field)
		})
	}
	assert.NoError(t, sample().Validate())
	assert.NoError(t, Model{}.Validate())
	limits := sample().Clone()
	limits.Replicas = manyReplicas("r", gateway.MaxReplicas)
	limits.Pools["prefill"] = manyReplicas("p", gateway.MaxReplicas)
	limits.Pools["decode"] = manyReplicas("d", gateway.MaxReplicas)
	assert.NoError(t, limits.Validate(), "exactly MaxReplicas is allowed, in each pool")
	pd := sample().Clone()
	zero, most := 0, MaxPDMinUncachedTokens
	pd.PDMode, pd.PDMinUncachedTokens = PDModeSidecar, &zero
	assert.NoError(t, pd.Validate(), "threshold 0 splits every request")
	pd.PDMode, pd.PDMinUncachedTokens = PDModeGateway, &most
	assert.NoError(t, pd.Validate())
	assert.Equal(t, PDModeGateway, Model{}.PDModeName())
	assert.Equal(t, DefaultPDMinUncachedTokens, Model{}.MinUncachedTokens())
	assert.Equal(t, MaxPDMinUncachedTokens, pd.MinUncachedTokens())
	c := pd.Clone()
	*c.PDMinUncachedTokens = 7
	assert.Equal(t, MaxPDMinUncachedTokens, *pd.PDMinUncachedTokens, "Clone copies the threshold")
	undefined := Model{Disaggregate: true, PrefillPool: DefaultPrefillPool, DecodePool: DefaultDecodePool}
	assert.NoError(t, undefined.Validate(), "pools may be named before they are defined (exa serve routing set --disaggregate)")
	assert.Equal(t, gateway.ModeRoundRobin, Model{}.Mode)
}

// TestModeText: a mode is written by name, read with hyphens or
// underscores (an empty name or an absent field is round_robin), and a
// name that is no mode is an ErrInvalid FieldError naming its path and
// the file.
func TestModeText(t *testing.T) {
	f, err := Decode("f.json", []byte(`{"models":{"a":{"mode":"cache-aware"},"b":{"mode":"load_aware"},"c":{"mode":""},"d":{}}}`))
	require.NoError(t, err)
	assert.Equal(t, gateway.ModeCacheAware, f.Models["a"].Mode)
	assert.Equal(t, gateway.ModeLoadAware, f.Models["b"].Mode)
	assert.Equal(t, gateway.ModeRoundRobin, f.Models["c"].Mode)
	assert.Equal(t, gateway.ModeRoundRobin, f.Models["d"].Mode)
	enc, err := Encode(f)
	require.NoError(t, err)
	assert.Contains(t, string(enc), `"mode": "cache_aware"`)
	assert.Contains(t, string(enc), `"mode": "round_robin"`)
	assert.NotContains(t, string(enc), "cache-aware")

	_, err = Decode("f.json", []byte(`{"models":{"JPCP":{"mode":"fastest"}}}`))
	require.ErrorIs(t, err, ErrInvalid)
	var fe *FieldError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, "models.JPCP.mode", fe.Field)
	assert.Equal(t, "fastest", fe.Value)
	assert.Equal(t, "f.json", fe.File)
	assert.Contains(t, err.Error(), "want round_robin, cache_aware or load_aware")

	_, err = Decode("f.json", []byte(`{"models":{"JPCP":{"mode":3}}}`))
	require.ErrorIs(t, err, ErrCorrupt, "a mode that is not a string")
}

func TestGatewayConversion(t *testing.T) {
	m := sample()
	opts, err := m.Options()
	require.NoError(t, err)
	assert.Len(t, opts, 2, "mode and SLO; the sample's load weights apply to load_aware only")
	g, err := gateway.New(GatewayReplicas(m.Replicas), opts...)
	require.NoError(t, err)
	assert.Equal(t, gateway.ModeCacheAware.String(), "cache_aware")
	assert.Len(t, g.Replicas(), 2)

	opts, err = Model{}.Options()
	require.NoError(t, err)
	assert.Len(t, opts, 1)
	_, err = Model{Mode: 9}.Options()
	require.ErrorIs(t, err, ErrInvalid)
}

func TestValidateModelName(t *testing.T) {
	for _, name := range []string{"", " x", "x ", "a\nb", "a\x00b", "\xff", strings.Repeat("m", MaxNameBytes+1), strings.Repeat("é", MaxNameBytes/2+1)} {
		t.Run(fmt.Sprintf("%q", name), func(t *testing.T) {
			assert.ErrorIs(t, ValidateModelName(name), ErrInvalid)
		})
	}
	assert.NoError(t, ValidateModelName("meta-llama/Llama-3.1-8B"))
	assert.NoError(t, ValidateModelName(strings.Repeat("m", MaxNameBytes)))
	err := ValidateModelName(strings.Repeat("m", 300))
	assert.ErrorContains(t, err, "300 bytes, at most 255")
}

func TestBadFileLeftUntouched(t *testing.T) {
	for _, tc := range []struct {
		name    string
		content string
		want    error
		msg     string
	}{
		{"syntax", `{"version": 1, "models": {`, ErrCorrupt, "unexpected EOF"},
		{"empty", ``, ErrCorrupt, "empty file"},
		{"trailing", `{"version":1} {}`, ErrCorrupt, "trailing data"},
		{"unknown field", `{"version":1,"modles":{}}`, ErrCorrupt, "modles"},
		{"wrong type", `{"version":1,"models":{"m":{"mode":3}}}`, ErrCorrupt, "mode"},
		{"version", `{"version":7}`, ErrCorrupt, "version 7"},
		{"invalid mode", `{"version":1,"models":{"m":{"mode":"fast"}}}`, ErrInvalid, `invalid models.m.mode "fast"`},
		{"empty model name", `{"version":1,"models":{"":{}}}`, ErrInvalid, `invalid models ""`},
		{"null", `null`, ErrCorrupt, "the document is null, want an object"},
		{"null with spaces", " null\n", ErrCorrupt, "the document is null, want an object"},
		{"array", `[]`, ErrCorrupt, "the document is an array, want an object"},
		{"string", `"x"`, ErrCorrupt, "the document is a string, want an object"},
		{"number", `1`, ErrCorrupt, "the document is a number, want an object"},
		{"null models", `{"models":null}`, ErrCorrupt, "models is null; leave the field out instead"},
		{"null model", `{"models":{"M":null}}`, ErrCorrupt, "models.M is null"},
		{"null field", `{"models":{"M":{"load_weights":null}}}`, ErrCorrupt, "models.M.load_weights is null"},
		{"duplicate model", `{"models":{"M":{},"M":{"mode":"cache_aware"}}}`, ErrCorrupt, "models.M is given twice"},
		{"duplicate field", `{"version":1,"version":1}`, ErrCorrupt, "version is given twice"},
		{"field in another case", `{"Models":{}}`, ErrCorrupt, `unknown field Models (field names are case-sensitive: did you mean "models"?)`},
		{"nested unknown field", `{"models":{"M":{"replicas":[{"name":"r0","adress":"http://x"}]}}}`, ErrCorrupt, "unknown field models.M.replicas[0].adress; the fields of models.M.replicas[0] are address, cache_blocks, kv_events, kv_events_replay, name, pod"},
		{"object for a scalar", `{"models":{"M":{"mode":{}}}}`, ErrCorrupt, "models.M.mode is an object, want a string, number or boolean"},
		{"array for an object", `{"models":[]}`, ErrCorrupt, "models is an array, want an object"},
		{"scalar for an array", `{"models":{"M":{"replicas":"r0"}}}`, ErrCorrupt, "models.M.replicas is a string, want an array"},
		{"odd key quoted", "{\"models\":{\"a.b\\u001b\":{\"x\":1}}}", ErrCorrupt, `unknown field models."a.b\x1b".x`},
		{"bad address", `{"models":{"M":{"replicas":[{"name":"r0","address":"ftp://x"}]}}}`, ErrInvalid, `invalid models.M.replicas[0].address "ftp://x"`},
		{"long model name", `{"models":{"` + strings.Repeat("m", 256) + `":{}}}`, ErrInvalid, "256 bytes, at most 255"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "routing.json")
			require.NoError(t, os.WriteFile(path, []byte(tc.content), 0o644))
			_, err := Load(path)
			require.ErrorIs(t, err, tc.want)
			assert.Contains(t, err.Error(), path)
			assert.Contains(t, err.Error(), tc.msg)

			called := false
			err = Update(path, func(f *File) error { called = true; return nil })
			require.ErrorIs(t, err, tc.want)
			assert.False(t, called)
			got, err := os.ReadFile(path)
			require.NoError(t, err)
			assert.Equal(t, tc.content, string(got))
		})
	}
}

// TestDecodeEmptyObject: {} is a valid empty configuration, the same as a
// missing file, and so is an object with empty models.
func TestDecodeEmptyObject(t *testing.T) {
	for _, doc := range []string{`{}`, ` {} `, `{"version":1}`, `{"models":{}}`} {
		f, err := Decode("mem", []byte(doc))
		require.NoError(t, err, doc)
		assert.Equal(t, &File{Version: Version, Models: map[string]Model{}}, f, doc)
	}
}

// TestDecodeNormalisesEmptyLists: empty replica lists and pool maps decode
// as nil, as Encode leaves them out; a pool with no members survives a
// round trip as [] (never null, which Decode rejects).
func TestDecodeNormalisesEmptyLists(t *testing.T) {
	f, err := Decode("mem", []byte(`{"models":{"M":{"replicas":[],"pools":{},"adapters":[]},"N":{"pools":{"p":[]}}}}`))
	require.NoError(t, err)
	assert.Nil(t, f.Models["M"].Adapters)
	assert.Nil(t, f.Models["M"].Replicas)
	assert.Nil(t, f.Models["M"].Pools)
	f.Models["N"].Pools["q"] = nil
	data, err := Encode(f)
	require.NoError(t, err)
	assert.NotContains(t, string(data), "null")
	g, err := Decode("mem", data)
	require.NoError(t, err)
	assert.Equal(t, []Replica{}, g.Models["N"].Pools["q"])
}

func TestValidateAddress(t *testing.T) {
	for _, tc := range []struct{ addr, reason string }{
		{"", "must not be empty"},
		{"ftp://x", `scheme "ftp", want http or https`},
		{"file:///etc/passwd", `scheme "file", want http or https`},
		{"FILE:///etc/passwd", `scheme "FILE", want http or https`},
		{"file:/etc/passwd", `scheme "file", want http or https`},
		{"unix:", `scheme "unix", want http or https`},
		{"http://h:99999", "port 99999 out of range 1..65535"},
		{"http://h:0", "port 0 out of range 1..65535"},
		{"h:70000", "port 70000 out of range 1..65535"},
		{"http://h:0x50", `not a valid URL (invalid port ":0x50" after host)`},
		{"http://h:", "empty port after ':'"},
		{"http://:80", "missing host"},
		{"http://", "missing host"},
		{"http://h\x01:80", "must not contain spaces or control characters"},
		{"http://h\x7f", "must not contain spaces or control characters"},
		{"http://h\u0085", "must not contain spaces or control characters"},
		{"http://a b", "must not contain spaces or control characters"},
		{"http://h\xff", "must be valid UTF-8"},
		{"http://user:pw@h:80", "must not contain credentials"},
		{"mailto:a@b", `scheme "mailto", want http or https`},
		{"user@h:80", "must not contain credentials"},
		{"http://h/?q=1", "must not have a query or fragment"},
		{"http://h/?", "must not have a query or fragment"},
		{"http://h/#f", "must not have a query or fragment"},
		{"http://h/#", "must not have a query or fragment"},
		{"http://h/%zz", "not a valid URL"},
	} {
		t.Run(fmt.Sprintf("%q", tc.addr), func(t *testing.T) {
			err := ValidateAddress(tc.addr)
			require.ErrorIs(t, err, ErrInvalid)
			var fe *FieldError
			require.ErrorAs(t, err, &fe)
			assert.Equal(t, "address", fe.Field)
			assert.Equal(t, tc.addr, fe.Value)
			assert.Contains(t, fe.Reason, tc.reason)
		})
	}
	for _, addr := range []string{
		"http://10.0.0.1:8000", "https://engine.example:443", "HTTP://h", "http://h/", "http://h:8000/prefix",
		"10.0.0.1:8000", "localhost", "http://[::1]:8000", "[::1]:8000", "http://h:65535", "http://h:1",
	} {
		assert.NoError(t, ValidateAddress(addr), addr)
	}
}

func TestUpdateErrorsWriteNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routing.json")
	require.NoError(t, Update(path, func(f *File) error { f.Models["a"] = Model{}; return nil }))
	before, err := os.ReadFile(path)
	require.NoError(t, err)

	sentinel := errors.New("stop")
	require.ErrorIs(t, Update(path, func(f *File) error { f.Models["b"] = Model{}; return sentinel }), sentinel)
	require.ErrorIs(t, Update(path, func(f *File) error { f.Models["b"] = Model{Mode: 5}; return nil }), ErrInvalid)
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, before, after)
}

func TestConcurrentUpdatesLoseNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routing.json")
	const writers, each = 8, 10
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				assert.NoError(t, Update(path, func(f *File) error {
					f.Models[fmt.Sprintf("m%d-%d", w, i)] = Model{SLOLatencyMS: int64(i)}
					return nil
				}))
			}
		})
	}
	wg.Wait()
	f, err := Load(path)
	require.NoError(t, err)
	assert.Len(t, f.Models, writers*each)
}

func TestEncodeDecodeProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		name := rapid.StringMatching(`[A-Za-z0-9][A-Za-z0-9/._-]{0,20}`).Draw(t, "name")
		m := Model{
			Mode:         rapid.SampledFrom([]gateway.Mode{gateway.ModeRoundRobin, gateway.ModeCacheAware, gateway.ModeLoadAware}).Draw(t, "mode"),
			SLOLatencyMS: rapid.Int64Range(0, 1e6).Draw(t, "slo"),
		}
		for i := range rapid.IntRange(0, 4).Draw(t, "n") {
			m.Replicas = append(m.Replicas, Replica{Name: fmt.Sprintf("r%d", i), Address: rapid.StringMatching(`(https?://)?[a-z0-9][a-z0-9.-]{0,15}(:[1-9][0-9]{0,3})?(/[a-z0-9]{0,5})?`).Draw(t, "addr")})
		}
		for i := range rapid.IntRange(0, 3).Draw(t, "adapters") {
			m.Adapters = append(m.Adapters, fmt.Sprintf("lora-%d", i))
		}
		f := &File{Version: Version, Models: map[string]Model{name: m}}
		data, err := Encode(f)
		require.NoError(t, err)
		g, err := Decode("mem", data)
		require.NoError(t, err)
		assert.Equal(t, f.Models, g.Models)
		again, err := Encode(g)
		require.NoError(t, err)
		assert.Equal(t, string(data), string(again))
	})
}

// TestStatsReplicaSpeeds: a gateway's record shows each replica's learned
// time per block and per token in milliseconds once known, and omits
// them while unknown.
func TestStatsReplicaSpeeds(t *testing.T) {
	g, err := gateway.New([]gateway.Replica{{Name: "a"}}, gateway.WithMode(gateway.ModeCacheAware))
	require.NoError(t, err)
	rec := StatsFromGateway("m", SourceGateway, gateway.ModeCacheAware, g.Stats(), g.Replicas())
	data, err := json.Marshal(rec)
	require.NoError(t, err)
	assert.NotContains(t, string(data), "time_ms", "unknown speeds are omitted")
	for i := range 60 {
		d, err := g.Route(keys.PrefixKey("sys", fmt.Sprint(i), ""))
		require.NoError(t, err)
		d.Done(gateway.DoneInfo{TTFT: 20 * time.Millisecond, Elapsed: 120 * time.Millisecond, OutputTokens: 11})
	}
	rec = StatsFromGateway("m", SourceGateway, gateway.ModeCacheAware, g.Stats(), g.Replicas())
	require.Len(t, rec.Replicas, 1)
	assert.InDelta(t, 10, rec.Replicas[0].TokenTimeMS, 0.01, "100 ms over 10 tokens after the first")
	assert.Greater(t, rec.Replicas[0].BlockTimeMS, 0.0)
	data, err = json.Marshal(rec)
	require.NoError(t, err)
	assert.Contains(t, string(data), `"token_time_ms":10`)
}

func TestStatsStore(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "routing.json")
	_, err := LoadStats(cfg, "org/model")
	require.ErrorIs(t, err, ErrNoStats)

	g, err := gateway.New([]gateway.Replica{{Name: "a"}, {Name: "b"}}, gateway.WithMode(gateway.ModeCacheAware))
	require.NoError(t, err)
	_, err = gateway.MeasureHitRate(g, []gateway.Key{keys.PrefixKey("sys", "", ""), keys.PrefixKey("sys", "", "")})
	require.NoError(t, err)
	rec := StatsFromGateway("org/model", SourceSimulated, gateway.ModeCacheAware, g.Stats(), g.Replicas())
	assert.Equal(t, uint64(2), rec.Requests)
	assert.Equal(t, uint64(1), rec.Hits)
	assert.InDelta(t, 0.5, rec.HitRate, 1e-9)
	require.Len(t, rec.Replicas, 2)
	assert.InDelta(t, 1.0, rec.Replicas[0].Share+rec.Replicas[1].Share, 1e-9)

	require.NoError(t, SaveStats(cfg, rec))
	assert.FileExists(t, filepath.Join(filepath.Dir(cfg), "stats", "org%2Fmodel.json"))
	got, err := LoadStats(cfg, "org/model")
	require.NoError(t, err)
	assert.Equal(t, rec, got)

	// Every valid model name has a statistics file that can be written,
	// however long its escaped form; different names get different files.
	paths := map[string]string{}
	for _, name := range []string{
		strings.Repeat("m", MaxNameBytes),
		strings.Repeat("m", MaxNameBytes-1) + "n",
		strings.Repeat("/", MaxNameBytes),
		strings.Repeat("é", MaxNameBytes/2),
		strings.Repeat("m", 199) + "/",
		"org/" + strings.Repeat("x", 220),
	} {
		require.NoError(t, ValidateModelName(name))
		p := StatsPath(cfg, name)
		assert.LessOrEqual(t, len(filepath.Base(p)), maxStatsStem+len(".json"), name)
		assert.NotContains(t, paths, p, "two names share a file")
		paths[p] = name
		rec := RoutingStats{Model: name, Source: SourceSimulated, Requests: 3}
		require.NoError(t, SaveStats(cfg, rec), name)
		got, err := LoadStats(cfg, name)
		require.NoError(t, err)
		assert.Equal(t, rec, got)
	}
	assert.Equal(t, filepath.Join(StatsDir(cfg), "short%2Fname.json"), StatsPath(cfg, "short/name"), "short names keep the plain escaped form")

	require.NoError(t, os.WriteFile(StatsPath(cfg, "bad"), []byte("{"), 0o644))
	_, err = LoadStats(cfg, "bad")
	assert.ErrorIs(t, err, ErrCorrupt)
}

// TestWriteFileAtomicCreatesNoDirectories: WriteFileAtomic writes into an
// existing directory only, and a directory in the way is named as such.
func TestWriteFileAtomicCreatesNoDirectories(t *testing.T) {
	dir := t.TempDir()
	err := WriteFileAtomic(filepath.Join(dir, "a", "b", "f.svg"), []byte("x"))
	require.ErrorIs(t, err, os.ErrNotExist)
	assert.NoDirExists(t, filepath.Join(dir, "a"))

	err = WriteFileAtomic(dir, []byte("x"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), dir+": is a directory")

	p := filepath.Join(dir, "f.svg")
	require.NoError(t, WriteFileAtomic(p, []byte("x")))
	got, err := os.ReadFile(p)
	require.NoError(t, err)
	assert.Equal(t, "x", string(got))
}

func TestDecodeGatewayStats(t *testing.T) {
	rec, err := DecodeGatewayStats([]byte(`{"models":{"M":{"model":"other","requests":4,"future_field":1}}}`), "M")
	require.NoError(t, err)
	assert.Equal(t, "M", rec.Model)
	assert.Equal(t, SourceGateway, rec.Source)
	assert.Equal(t, uint64(4), rec.Requests)

	rec, err = DecodeGatewayStats([]byte(`{"model":"M","source":"simulated","hits":2}`), "M")
	require.NoError(t, err)
	assert.Equal(t, SourceSimulated, rec.Source)
	assert.Equal(t, uint64(2), rec.Hits)

	for _, body := range []string{`{"models":{}}`, `null`, `{}`, `{"model":"N"}`} {
		_, err = DecodeGatewayStats([]byte(body), "M")
		assert.ErrorIs(t, err, ErrNotServed, body)
		assert.ErrorContains(t, err, `the gateway does not serve model "M"`)
	}
	for _, body := range []string{``, `{`, `[]`, `{"models":[]}`, `{"models":{"M":{"requests":-1}}}`, `{"model":3}`} {
		_, err = DecodeGatewayStats([]byte(body), "M")
		assert.ErrorContains(t, err, "bad JSON", body)
	}
}

func manyReplicas(prefix string, n int) []Replica {
	out := make([]Replica, n)
	for i := range out {
		out[i] = Replica{Name: fmt.Sprintf("%s%d", prefix, i), Address: fmt.Sprintf("http://10.0.0.1:%d", 1000+i)}
	}
	return out
}

func TestModelEngine(t *testing.T) {
	for _, e := range []string{"", "vllm", "sglang", "trtllm"} {
		require.NoError(t, Model{Engine: e}.Validate(), e)
	}
	for _, e := range []string{"auto", "tgi", "VLLM"} {
		err := Model{Engine: e}.Validate()
		var fe *FieldError
		require.ErrorAs(t, err, &fe, e)
		assert.Equal(t, "engine", fe.Field)
		assert.Equal(t, e, fe.Value)
	}
	assert.Equal(t, "auto", Model{}.EngineName())
	assert.Equal(t, "sglang", Model{Engine: "sglang"}.EngineName())
}

// TestPoolReferenceNames: prefill_pool and decode_pool name pools, so they
// follow the pool names' rules; a name no pool can have (surrounding
// spaces, a control character, past MaxNameBytes) is refused naming the
// field and the value, instead of leaving the model waiting for a pool
// that can never be defined: in a file as in Model.Validate.
func TestPoolReferenceNames(t *testing.T) {
	// Model.Validate's cases are in TestModelValidate's table.
	_, err := Decode("routing.json", []byte(`{"models":{"M":{"disaggregate":true,"prefill_pool":"prefill\t","decode_pool":"decode"}}}`))
	require.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), `models.M.prefill_pool "prefill\t" in routing.json`)
}

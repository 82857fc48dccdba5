package config

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/examlops/gateway"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func sample() Model {
	return Model{
		Mode:         ModeCacheAware,
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
		{"unknown mode", func(m *Model) { m.Mode = "fastest" }, "mode"},
		{"negative slo", func(m *Model) { m.SLOLatencyMS = -1 }, "slo_latency_ms"},
		{"slo overflowing time.Duration", func(m *Model) { m.SLOLatencyMS = math.MaxInt64 / 1000 }, "slo_latency_ms"},
		{"negative weight", func(m *Model) { m.LoadWeights.KV = -2 }, "load_weights.kv"},
		{"zero weights", func(m *Model) { *m.LoadWeights = LoadWeights{} }, "load_weights"},
		{"hyphenated mode", func(m *Model) { m.Mode = "cache-aware" }, "mode"},
		{"huge cache", func(m *Model) { m.Replicas[0].CacheBlocks = 1 << 40 }, "replicas[0].cache_blocks"},
		{"missing prefill pool", func(m *Model) { m.PrefillPool = "" }, "prefill_pool"},
		{"missing decode pool", func(m *Model) { m.DecodePool = "" }, "decode_pool"},
		{"same pools", func(m *Model) { m.DecodePool = m.PrefillPool }, "decode_pool"},
		{"duplicate replica", func(m *Model) { m.Replicas[1].Name = "r0" }, "replicas[1].name"},
		{"empty address", func(m *Model) { m.Replicas[0].Address = "" }, "replicas[0].address"},
		{"negative cache", func(m *Model) { m.Replicas[0].CacheBlocks = -5 }, "replicas[0].cache_blocks"},
		{"bad pool replica", func(m *Model) { m.Pools["decode"][0].Name = "" }, "pools.decode[0].name"},
		{"empty pool name", func(m *Model) { m.Pools[""] = nil }, "pool"},
		{"too many replicas", func(m *Model) { m.Replicas = manyReplicas("r", gateway.MaxReplicas+1) }, "replicas"},
		{"too many in one pool", func(m *Model) { m.Pools["other"] = manyReplicas("o", gateway.MaxReplicas+1) }, "pools.other"},
		{"too many in the merged pools", func(m *Model) {
			m.Pools["prefill"] = manyReplicas("p", gateway.MaxReplicas/2+1)
			m.Pools["decode"] = manyReplicas("d", gateway.MaxReplicas/2)
		}, "pools.prefill+decode"},
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
	limits.Pools["prefill"] = manyReplicas("p", gateway.MaxReplicas/2)
	limits.Pools["decode"] = manyReplicas("d", gateway.MaxReplicas/2)
	assert.NoError(t, limits.Validate(), "exactly MaxReplicas is allowed")
	undefined := Model{Disaggregate: true, PrefillPool: DefaultPrefillPool, DecodePool: DefaultDecodePool}
	assert.NoError(t, undefined.Validate(), "pools may be named before they are defined (exa serve routing set --disaggregate)")
	assert.Equal(t, ModeRoundRobin, Model{}.ModeName())
}

func TestGatewayConversion(t *testing.T) {
	m := sample()
	mode, err := m.GatewayMode()
	require.NoError(t, err)
	assert.Equal(t, gateway.ModeCacheAware, mode)
	opts, err := m.Options()
	require.NoError(t, err)
	assert.Len(t, opts, 3)
	g, err := gateway.New(GatewayReplicas(m.Replicas), opts...)
	require.NoError(t, err)
	assert.Equal(t, gateway.ModeCacheAware.String(), "cache_aware")
	assert.Len(t, g.Replicas(), 2)

	opts, err = Model{}.Options()
	require.NoError(t, err)
	assert.Len(t, opts, 1)

	c, err := ParseMode("load-aware")
	require.NoError(t, err)
	assert.Equal(t, ModeLoadAware, c)
}

func TestValidateModelName(t *testing.T) {
	for _, name := range []string{"", " x", "x ", "a\nb"} {
		t.Run(fmt.Sprintf("%q", name), func(t *testing.T) {
			assert.ErrorIs(t, ValidateModelName(name), ErrInvalid)
		})
	}
	assert.NoError(t, ValidateModelName("meta-llama/Llama-3.1-8B"))
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

func TestUpdateErrorsWriteNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routing.json")
	require.NoError(t, Update(path, func(f *File) error { f.Models["a"] = Model{}; return nil }))
	before, err := os.ReadFile(path)
	require.NoError(t, err)

	sentinel := errors.New("stop")
	require.ErrorIs(t, Update(path, func(f *File) error { f.Models["b"] = Model{}; return sentinel }), sentinel)
	require.ErrorIs(t, Update(path, func(f *File) error { f.Models["b"] = Model{Mode: "x"}; return nil }), ErrInvalid)
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
			Mode:         rapid.SampledFrom(Modes).Draw(t, "mode"),
			SLOLatencyMS: rapid.Int64Range(0, 1e6).Draw(t, "slo"),
		}
		for i := range rapid.IntRange(0, 4).Draw(t, "n") {
			m.Replicas = append(m.Replicas, Replica{Name: fmt.Sprintf("r%d", i), Address: rapid.StringMatching(`http://[a-z0-9.:]{1,20}`).Draw(t, "addr")})
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

func TestStatsStore(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "routing.json")
	_, err := LoadStats(cfg, "org/model")
	require.ErrorIs(t, err, ErrNoStats)

	g, err := gateway.New([]gateway.Replica{{Name: "a"}, {Name: "b"}}, gateway.WithMode(gateway.ModeCacheAware))
	require.NoError(t, err)
	_, err = gateway.MeasureHitRate(g, []gateway.Key{gateway.PrefixKey("sys", "", ""), gateway.PrefixKey("sys", "", "")})
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

	require.NoError(t, os.WriteFile(StatsPath(cfg, "bad"), []byte("{"), 0o644))
	_, err = LoadStats(cfg, "bad")
	assert.ErrorIs(t, err, ErrCorrupt)
}

func manyReplicas(prefix string, n int) []Replica {
	out := make([]Replica, n)
	for i := range out {
		out[i] = Replica{Name: fmt.Sprintf("%s%d", prefix, i), Address: fmt.Sprintf("http://10.0.0.1:%d", 1000+i)}
	}
	return out
}

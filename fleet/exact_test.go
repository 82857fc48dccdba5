package fleet

import (
	"context"
	"net/netip"
	"testing"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/kvevents"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

func TestExactKVTable(t *testing.T) {
	gw, err := gateway.New([]gateway.Replica{{Name: "x"}})
	require.NoError(t, err)
	ms := func(name string, cfg config.Model) *Model {
		m := &Model{Name: name, Cfg: cfg, Gateway: gw, ByName: map[string]*Endpoint{}}
		for _, r := range cfg.Replicas {
			m.ByName[r.Name] = NewEndpoint(NormalizeAddress(r.Address))
		}
		return m
	}
	const bind = "tcp://*:5557"
	exact := func(reps ...config.Replica) config.Model {
		return config.Model{Mode: gateway.ModeCacheAware, Index: config.IndexExact, KVEventsBind: bind, Replicas: reps}
	}
	tab := buildKVTable(map[string]*Model{
		"base": ms("base", exact(
			config.Replica{Name: "a", Address: "http://10.0.0.1:8000"},                                  // pods 10.0.0.1:8000 and 10.0.0.1
			config.Replica{Name: "b", Address: "http://10.0.0.2:8000"},                                  // 10.0.0.2:8000 only: c shares the host
			config.Replica{Name: "c", Address: "http://10.0.0.2:8001"},                                  // 10.0.0.2:8001 only
			config.Replica{Name: "d", Address: "http://10.0.0.4:8000", Pod: "pod-d"},                    // pod-d only
			config.Replica{Name: "v", Address: "http://10.0.0.5:8000", KVEvents: "tcp://10.0.0.5:5557"}, // its own publisher
			config.Replica{Name: "r1", Address: "http://10.0.0.6:8000", KVEvents: "tcp://relay:1"},
			config.Replica{Name: "r2", Address: "http://10.0.0.7:8000", KVEvents: "tcp://relay:1"},
		)),
		"lora": ms("lora", exact(config.Replica{Name: "a2", Address: "http://10.0.0.1:8000"})),
		"big": ms("big", func() config.Model {
			m := exact(config.Replica{Name: "d2", Address: "http://10.0.0.9:1", Pod: "pod-d"})
			m.BlockSize = 32
			return m
		}()),
		"approx": ms("approx", config.Model{Mode: gateway.ModeCacheAware, KVEventsBind: "tcp://*:9", Replicas: []config.Replica{{Name: "z", Address: "http://10.0.0.1:8000"}}}),
	})
	require.ElementsMatch(t, []string{bind}, tab.bind)
	require.ElementsMatch(t, []string{"tcp://10.0.0.5:5557", "tcp://relay:1"}, tab.connect)
	require.True(t, tab.sources["tcp://10.0.0.5:5557"].single)
	require.False(t, tab.sources["tcp://relay:1"].single)
	attach := func(id string) []string {
		if tab.engines[id] == nil {
			return nil
		}
		return tab.replicasOf(id)
	}
	require.Equal(t, []string{"base/a", "lora/a2"}, attach(kvID(bind, "10.0.0.1:8000")), "an engine of two models")
	require.Equal(t, []string{"base/a", "lora/a2"}, attach(kvID(bind, "10.0.0.1")), "its host alone")
	require.Equal(t, "", tab.engines[kvID(bind, "10.0.0.1")].model, "two models: the topic names the chain root")
	require.Same(t, tab.engines[kvID(bind, "10.0.0.1:8000")], tab.engines[kvID(bind, "10.0.0.1")], "one engine by either name: one state")
	require.Equal(t, []string{"base/b"}, attach(kvID(bind, "10.0.0.2:8000")))
	require.Nil(t, attach(kvID(bind, "10.0.0.2")), "a host of two engines names neither")
	require.Nil(t, attach(kvID(bind, "10.0.0.4:8000")), "an explicit pod replaces the address")
	require.Contains(t, tab.engines[kvID(bind, "pod-d")].err, "block sizes 16 and 32")
	require.Equal(t, []string{"base/v"}, attach(kvID("tcp://10.0.0.5:5557", "")))
	require.Equal(t, "base", tab.engines[kvID("tcp://10.0.0.5:5557", "")].model)
	require.Equal(t, []string{"base/r1"}, attach(kvID("tcp://relay:1", "10.0.0.6:8000")))
	require.Nil(t, attach(kvID("tcp://*:9", "10.0.0.1:8000")), "approximate models are not heard")

	s := &Fleet{}
	st := &State{KV: tab, Models: map[string]*Model{}}
	s.state.Store(st)
	for _, tc := range []struct {
		src     kvevents.Source
		replica string
		model   string
		err     string
	}{
		{kvevents.Source{Endpoint: bind, Topic: "kv@10.0.0.1@base", Pod: "10.0.0.1", Model: "base"}, kvID(bind, "10.0.0.1:8000"), "base", ""},
		{kvevents.Source{Endpoint: bind, Topic: "kv@10.0.0.1:8000@base", Pod: "10.0.0.1:8000", Model: "base"}, kvID(bind, "10.0.0.1:8000"), "base", ""},
		{kvevents.Source{Endpoint: bind, Topic: "kv@10.0.0.2:8000@base", Pod: "10.0.0.2:8000", Model: "base"}, kvID(bind, "10.0.0.2:8000"), "base", ""},
		{kvevents.Source{Endpoint: bind, Topic: "kv@10.0.0.2:8000@other", Pod: "10.0.0.2:8000", Model: "other"}, "", "", "names model \"other\""},
		{kvevents.Source{Endpoint: bind, Topic: "kv@10.0.0.1@lora", Pod: "10.0.0.1", Model: "lora"}, kvID(bind, "10.0.0.1:8000"), "lora", ""},
		{kvevents.Source{Endpoint: bind, Topic: ""}, "", "", "names no pod"},
		{kvevents.Source{Endpoint: bind, Topic: "kv@10.0.0.3@base", Pod: "10.0.0.3", Model: "base"}, "", "", "no replica answers to pod"},
		{kvevents.Source{Endpoint: bind, Topic: "kv@pod-d@base", Pod: "pod-d", Model: "base"}, "", "", "block sizes"},
		{kvevents.Source{Endpoint: "tcp://10.0.0.5:5557", Topic: ""}, kvID("tcp://10.0.0.5:5557", ""), "base", ""},
		{kvevents.Source{Endpoint: "tcp://10.0.0.5:5557", Topic: "kv@whatever@base", Pod: "whatever", Model: "base"}, kvID("tcp://10.0.0.5:5557", ""), "base", ""},
		{kvevents.Source{Endpoint: "tcp://10.0.0.5:5557", Topic: "vllm-free-topic"}, kvID("tcp://10.0.0.5:5557", ""), "base", ""},
		{kvevents.Source{Endpoint: "tcp://10.0.0.5:5557", Topic: "kv@whatever@x", Pod: "whatever", Model: "x"}, "", "", "names model \"x\""},
		{kvevents.Source{Endpoint: "tcp://relay:1", Topic: "kv@10.0.0.7@base", Pod: "10.0.0.7", Model: "base"}, kvID("tcp://relay:1", "10.0.0.7:8000"), "base", ""},
		{kvevents.Source{Endpoint: "tcp://other:1"}, "", "", "not configured"},
	} {
		tg, err := s.resolveKV(tc.src)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, "%+v", tc.src)
			continue
		}
		require.NoError(t, err, "%+v", tc.src)
		require.Equal(t, tc.replica, tg.Replica)
		require.Equal(t, tc.model, tg.Model)
	}
	// Two models on one engine, and a topic that names no model: no root.
	_, err = s.resolveKV(kvevents.Source{Endpoint: bind, Topic: "kv@10.0.0.1:8000", Pod: "10.0.0.1:8000"})
	require.Error(t, err)
}

func TestKVPolicyHostnames(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, err := New(Options{Registerer: reg, Logger: quietLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	bind := freeTCP(t)
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {
		Mode: gateway.ModeCacheAware, Index: config.IndexExact, KVEventsBind: bind,
		Replicas: []config.Replica{{Name: "a", Address: "http://engine-a:8000"}, {Name: "l", Address: "http://localhost:8001"}}}}}))
	lookups := 0
	p := kvPolicy{s: s, lookup: func(_ context.Context, host string) ([]netip.Addr, error) {
		lookups++
		require.Equal(t, "engine-a", host)
		return []netip.Addr{netip.MustParseAddr("10.1.2.3")}, nil
	}}
	ip := netip.MustParseAddr
	require.NoError(t, p.AcceptConn(bind, ip("10.9.9.9")), "a name's addresses are known only when its topic is checked")
	require.NoError(t, p.AcceptTopic(bind, ip("10.1.2.3"), []byte("kv@engine-a:8000@"+testModel)))
	require.Error(t, p.AcceptTopic(bind, ip("10.9.9.9"), []byte("kv@engine-a:8000@"+testModel)))
	require.Equal(t, 2, lookups)
	require.NoError(t, p.AcceptTopic(bind, ip("127.0.0.1"), []byte("kv@localhost:8001@"+testModel)), "localhost needs no lookup")
	require.NoError(t, p.AcceptTopic(bind, ip("::1"), []byte("kv@localhost:8001@"+testModel)))
	require.Error(t, p.AcceptTopic(bind, ip("127.0.0.1"), []byte("kv@nobody@"+testModel)))
	require.Error(t, p.AcceptConn("tcp://127.0.0.1:1", ip("127.0.0.1")), "an endpoint not configured")
	require.Equal(t, 4, p.MaxConnsFrom(bind, ip("127.0.0.1")), "one engine at 127.0.0.1: 2 + 2")
	require.Zero(t, p.MaxConnsFrom(bind, ip("10.1.2.3")), "a host name: the subscriber's default")
	require.NoError(t, p.AcceptConn(bind, netip.Addr{}), "a Unix socket is trusted")
}

// TestKVMaxMappedBlocks: the bound of all engines' KV-event maps is
// Options.KVMaxMappedBlocks (kvevents' default when zero), shown on
// /metrics with the blocks mapped; a negative one is refused.
func TestKVMaxMappedBlocks(t *testing.T) {
	for _, tc := range []struct{ opt, want int }{{0, kvevents.DefaultMaxMappedTotal}, {123, 123}} {
		reg := prometheus.NewRegistry()
		s, err := New(Options{Registerer: reg, Logger: quietLogger(), KVMaxMappedBlocks: tc.opt})
		require.NoError(t, err)
		mfs, err := reg.Gather()
		require.NoError(t, err)
		got := map[string]float64{}
		for _, mf := range mfs {
			if n := mf.GetName(); n == "exa_gateway_kv_all_mapped_blocks" || n == "exa_gateway_kv_all_mapped_blocks_limit" {
				got[n] = mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		require.Equal(t, map[string]float64{"exa_gateway_kv_all_mapped_blocks": 0, "exa_gateway_kv_all_mapped_blocks_limit": float64(tc.want)}, got)
		require.NoError(t, s.Close())
	}
	_, err := New(Options{KVMaxMappedBlocks: -1})
	require.ErrorIs(t, err, ErrInvalidOptions)
	require.ErrorContains(t, err, "KVMaxMappedBlocks -1 is negative")
}

// TestTokenizeMaxBytes: the budget of the default tokenizer's calls is
// Options.TokenizeMaxBytes (kvevents' default when zero), shown on
// /metrics with what is held and the calls refused; an embedder's
// Tokenizer has none; a negative one is refused.
func TestTokenizeMaxBytes(t *testing.T) {
	for _, tc := range []struct{ opt, want int64 }{{0, kvevents.DefaultTokenizeBytes}, {4096, 4096}} {
		reg := prometheus.NewRegistry()
		s, err := New(Options{Registerer: reg, Logger: quietLogger(), TokenizeMaxBytes: tc.opt})
		require.NoError(t, err)
		require.Equal(t, map[string]float64{"exa_gateway_tokenize_bytes": 0, "exa_gateway_tokenize_bytes_limit": float64(tc.want),
			"exa_gateway_tokenize_over_budget_total": 0}, tokenizeSeries(t, reg))
		require.NoError(t, s.Close())
	}
	reg := prometheus.NewRegistry()
	s, err := New(Options{Registerer: reg, Logger: quietLogger(), Tokenizer: kvevents.NewHTTPTokenizer(nil, nil, 1)})
	require.NoError(t, err)
	require.Empty(t, tokenizeSeries(t, reg), "an embedder's tokenizer: its budget is its own")
	require.NoError(t, s.Close())
	_, err = New(Options{TokenizeMaxBytes: -1})
	require.ErrorIs(t, err, ErrInvalidOptions)
	require.ErrorContains(t, err, "TokenizeMaxBytes -1 is negative")
}

func tokenizeSeries(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		switch n := mf.GetName(); n {
		case "exa_gateway_tokenize_bytes", "exa_gateway_tokenize_bytes_limit":
			got[n] = mf.GetMetric()[0].GetGauge().GetValue()
		case "exa_gateway_tokenize_over_budget_total":
			got[n] = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return got
}

// TestExactKVTableExplicitPod: a replica's explicit pod that is another
// replica's host (two engines on one host, one naming itself by its
// POD_IP) names that replica's engine; the host does not become another
// name of the engine on the host's other port.
func TestExactKVTableExplicitPod(t *testing.T) {
	gw, err := gateway.New([]gateway.Replica{{Name: "a"}, {Name: "b"}})
	require.NoError(t, err)
	const bind = "tcp://*:5557"
	cfg := config.Model{Mode: gateway.ModeCacheAware, Index: config.IndexExact, KVEventsBind: bind, Replicas: []config.Replica{
		{Name: "a", Address: "http://10.0.0.5:8000", Pod: "10.0.0.5"},
		{Name: "b", Address: "http://10.0.0.5:8001"},
	}}
	m := &Model{Name: testModel, Cfg: cfg, Gateway: gw, ByName: map[string]*Endpoint{}}
	for _, r := range cfg.Replicas {
		m.ByName[r.Name] = NewEndpoint(NormalizeAddress(r.Address))
	}
	tab := buildKVTable(map[string]*Model{testModel: m})
	require.Equal(t, []string{testModel + "/a"}, tab.replicasOf(kvID(bind, "10.0.0.5")))
	require.Equal(t, []string{testModel + "/b"}, tab.replicasOf(kvID(bind, "10.0.0.5:8001")))
}

package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
)

func TestSetExactIndex(t *testing.T) {
	cfg := newConfig(t)
	ok(t, cfg, "serve", "routing", "set", "M", "--mode", "cache_aware",
		"--replica", "r0=http://10.0.0.1:8000", "--replica", "r1=http://10.0.0.2:8000")
	out := ok(t, cfg, "serve", "routing", "set", "M", "--index", "exact", "--block-size", "32",
		"--kv-events-bind", "tcp://0.0.0.0:5557", "--kv-events-connect", "r1=tcp://10.0.0.2:5557", "--pod", "r0=10.0.0.1")
	assert.Contains(t, out, "index:        exact (KV events, blocks of 32 tokens; listening on tcp://0.0.0.0:5557)")
	assert.Contains(t, out, "r0=http://10.0.0.1:8000 (pod 10.0.0.1), r1=http://10.0.0.2:8000 (events from tcp://10.0.0.2:5557)")
	want := config.Model{Mode: gateway.ModeCacheAware, Index: "exact", BlockSize: 32, KVEventsBind: "tcp://0.0.0.0:5557",
		Replicas: []config.Replica{{Name: "r0", Address: "http://10.0.0.1:8000", Pod: "10.0.0.1"},
			{Name: "r1", Address: "http://10.0.0.2:8000", KVEvents: "tcp://10.0.0.2:5557"}}}
	assert.Equal(t, want, getModel(t, cfg, "M"))

	// Naming the replicas again keeps their event sources.
	ok(t, cfg, "serve", "routing", "set", "M", "--replica", "r0=http://10.0.0.1:8000", "--replica", "r1=http://10.0.0.2:8000")
	assert.Equal(t, want, getModel(t, cfg, "M"))
	// Clearing.
	ok(t, cfg, "serve", "routing", "set", "M", "--kv-events-connect", "r1=", "--pod", "r0=", "--block-size", "0")
	want.BlockSize, want.Replicas[0].Pod, want.Replicas[1].KVEvents = 0, "", ""
	assert.Equal(t, want, getModel(t, cfg, "M"))
	ok(t, cfg, "serve", "routing", "set", "M", "--index", "approximate", "--kv-events-bind", "")
	want.Index, want.KVEventsBind = "approximate", ""
	assert.Equal(t, want, getModel(t, cfg, "M"))
}

func TestSetExactIndexBadInput(t *testing.T) {
	cfg := newConfig(t)
	ok(t, cfg, "serve", "routing", "set", "M", "--replica", "r0=http://10.0.0.1:8000")
	before, err := os.ReadFile(cfg)
	require.NoError(t, err)
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--index", "precise"}, `invalid --index "precise": want approximate or exact`},
		{[]string{"--block-size", "-1"}, `invalid --block-size "-1": want a whole number of tokens in 0..1024`},
		{[]string{"--kv-events-bind", "udp://x:1"}, `invalid --kv-events-bind "udp://x:1": want tcp://HOST:PORT or ipc://PATH`},
		{[]string{"--kv-events-connect", "r0=tcp://*:5557"}, `endpoint a host to connect to, not "*"`},
		{[]string{"--kv-events-connect", "r0"}, `want NAME=ENDPOINT`},
		{[]string{"--pod", "r0=a@b"}, `pod must not contain '@'`},
		{[]string{"--pod", "r9=x"}, `invalid --pod r9="x": model "M" has no replica "r9"`},
		{[]string{"--index", "exact", "--kv-events-bind", "tcp://*:5557"}, `invalid --index: index "exact": needs mode cache_aware`},
		{[]string{"--index", "exact", "--mode", "cache_aware"}, `invalid --kv-events-connect: replicas[0].kv_events "": index exact needs a source of KV events`},
	} {
		r := exa(t, cfg, append([]string{"serve", "routing", "set", "M"}, tc.args...)...)
		assertRejected(t, r, tc.msg, cfg, before)
	}
}

func TestStatsExactIndex(t *testing.T) {
	cfg := newConfig(t)
	ok(t, cfg, "serve", "routing", "set", "M", "--mode", "cache_aware", "--index", "exact", "--kv-events-bind", "tcp://*:5557",
		"--replica", "r0=http://10.0.0.1:8000")
	rec := config.RoutingStats{Model: "M", Source: config.SourceGateway, Mode: "cache_aware", Index: "exact", Requests: 10,
		Replicas: []config.ReplicaStats{{Name: "r0", Routed: 10, Share: 1, Healthy: true, CachedBlocks: 42}},
		KVEvents: &config.KVEventsStats{BlockSize: 16,
			Tokenize:  config.TokenizeStats{Requests: 9, EngineCalls: 4, Errors: 1},
			Fallbacks: map[string]uint64{"tokenize_error": 1, "short_prompt": 1},
			Engines: []config.KVEngineStats{{Endpoint: "tcp://*:5557", Topic: "kv@10.0.0.1:8000@M\x1b[2J", Replicas: []string{"M/r0"},
				Events: 50, Applied: 49, Dropped: 1, DroppedBy: map[string]uint64{"orphan": 1}, StoredBlocks: 60, RemovedBlocks: 18,
				MappedBlocks: 42, Restarts: 1, Clears: 1, LastError: "boom"}},
			Endpoints: []config.KVEndpointStats{{Endpoint: "tcp://*:5557", Bound: true, Connected: true}},
		}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(config.StatsDocument{Models: map[string]config.RoutingStats{"M": rec}})
	}))
	defer srv.Close()
	out := ok(t, cfg, "serve", "routing", "stats", "M", "--gateway", srv.URL)
	for _, want := range []string{
		"index:             exact",
		"exact index (blocks of 16 tokens, kept current by the engines' KV events):",
		"tokenized:             9 requests: 4 calls to an engine's /tokenize, 5 from the gateway's cache, 1 errors",
		"routed without tokens: tokenize_error 1, short_prompt 1, unsupported 0 (as if nothing were cached)",
		`"kv@10.0.0.1:8000@M\x1b[2J" dropped: orphan 1`,
		"last error: boom",
		"events: listening on tcp://*:5557, 0 publisher connections ended",
	} {
		assert.Contains(t, out, want)
	}
	assert.Regexp(t, `(?m)^\s*r0\s+10\s+100\.0%\s+0\s+yes\s+42\s*$`, out)
	assert.Regexp(t, `(?m)M/r0\s+50\s+49\s+1\s+60\s+18\s+42\s+0\s+1\s+1\s+0\s*$`, out)
	assert.NotContains(t, out, "\x1b")
}

// A disaggregated model on the exact index: pool members get their event
// sources and pods as POOL:NAME, keep them when their pool is named again,
// and a member without a source is refused naming the flag and field.
func TestSetExactIndexDisaggregated(t *testing.T) {
	cfg := newConfig(t)
	out := ok(t, cfg, "serve", "routing", "set", "M", "--disaggregate", "--index", "exact",
		"--pool", "prefill:p0=http://10.0.1.1:8000", "--pool", "decode:d0=http://10.0.2.1:8000",
		"--kv-events-connect", "prefill:p0=tcp://10.0.1.1:5557", "--kv-events-connect", "decode:d0=tcp://10.0.2.1:5557", "--pod", "decode:d0=pod-d0")
	assert.Contains(t, out, "p0=http://10.0.1.1:8000 (events from tcp://10.0.1.1:5557)")
	want := map[string][]config.Replica{
		"prefill": {{Name: "p0", Address: "http://10.0.1.1:8000", KVEvents: "tcp://10.0.1.1:5557"}},
		"decode":  {{Name: "d0", Address: "http://10.0.2.1:8000", KVEvents: "tcp://10.0.2.1:5557", Pod: "pod-d0"}},
	}
	m := getModel(t, cfg, "M")
	assert.Equal(t, want, m.Pools)
	assert.True(t, m.Disaggregate && m.Exact())
	assert.Equal(t, gateway.ModeRoundRobin, m.Mode, "a disaggregated model needs no cache_aware mode")
	ok(t, cfg, "serve", "routing", "set", "M", "--pool", "decode:d0=http://10.0.2.1:8000")
	assert.Equal(t, want, getModel(t, cfg, "M").Pools, "naming the pool again keeps its members' event sources")

	before, err := os.ReadFile(cfg)
	require.NoError(t, err)
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--pool", "decode:d1=http://10.0.2.2:8000"}, `invalid --kv-events-connect: pools.decode[0].kv_events "": index exact needs a source of KV events`},
		{[]string{"--kv-events-connect", "decode:d9=tcp://h:1"}, `model "M" has no replica "decode:d9"`},
		{[]string{"--kv-events-connect", "prefill:p0=tcp://*:1"}, `endpoint a host to connect to, not "*"`},
	} {
		r := exa(t, cfg, append([]string{"serve", "routing", "set", "M"}, tc.args...)...)
		assertRejected(t, r, tc.msg, cfg, before)
	}
}

package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway/config"
)

// --kv-events-replay sets a replica's (or pool member's) kv_events_replay,
// naming the replicas again keeps it, an empty endpoint clears it, and bad
// endpoints are refused naming the flag and the value, the file untouched.
func TestSetKVEventsReplay(t *testing.T) {
	cfg := newConfig(t)
	ok(t, cfg, "serve", "routing", "set", "M", "--mode", "cache_aware",
		"--replica", "r0=http://10.0.0.1:8000", "--replica", "r1=http://10.0.0.2:8000",
		"--pool", "decode:d0=http://10.0.2.1:8000")
	out := ok(t, cfg, "serve", "routing", "set", "M", "--kv-events-connect", "r1=tcp://10.0.0.2:5557",
		"--kv-events-replay", "r0=tcp://10.0.0.1:5558", "--kv-events-replay", "r1=tcp://10.0.0.2:5558",
		"--kv-events-replay", "decode:d0=tcp://10.0.2.1:5558")
	assert.Contains(t, out, "r0=http://10.0.0.1:8000 (replay from tcp://10.0.0.1:5558), r1=http://10.0.0.2:8000 (events from tcp://10.0.0.2:5557, replay from tcp://10.0.0.2:5558)")
	want := []config.Replica{
		{Name: "r0", Address: "http://10.0.0.1:8000", KVEventsReplay: "tcp://10.0.0.1:5558"},
		{Name: "r1", Address: "http://10.0.0.2:8000", KVEvents: "tcp://10.0.0.2:5557", KVEventsReplay: "tcp://10.0.0.2:5558"},
	}
	wantPool := []config.Replica{{Name: "d0", Address: "http://10.0.2.1:8000", KVEventsReplay: "tcp://10.0.2.1:5558"}}
	m := getModel(t, cfg, "M")
	assert.Equal(t, want, m.Replicas)
	assert.Equal(t, wantPool, m.Pools["decode"])

	ok(t, cfg, "serve", "routing", "set", "M", "--replica", "r0=http://10.0.0.1:8000", "--replica", "r1=http://10.0.0.2:8000",
		"--pool", "decode:d0=http://10.0.2.1:8000")
	m = getModel(t, cfg, "M")
	assert.Equal(t, want, m.Replicas, "naming the replicas again keeps their replay endpoints")
	assert.Equal(t, wantPool, m.Pools["decode"])

	ok(t, cfg, "serve", "routing", "set", "M", "--kv-events-replay", "r0=")
	want[0].KVEventsReplay = ""
	assert.Equal(t, want, getModel(t, cfg, "M").Replicas)

	before, err := os.ReadFile(cfg)
	require.NoError(t, err)
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--kv-events-replay", "r0"}, `want NAME=ENDPOINT`},
		{[]string{"--kv-events-replay", "r0=tcp://*:5558"}, `invalid --kv-events-replay "r0=tcp://*:5558": endpoint a host to connect to, not "*"`},
		{[]string{"--kv-events-replay", "r0=udp://10.0.0.1:5558"}, `invalid --kv-events-replay "r0=udp://10.0.0.1:5558": endpoint want tcp://HOST:PORT or ipc://PATH`},
		{[]string{"--kv-events-replay", "r9=tcp://10.0.0.9:5558"}, `invalid --kv-events-replay r9="tcp://10.0.0.9:5558": model "M" has no replica "r9"`},
		// The host check is config's (Model.Validate), reported under the flag.
		{[]string{"--kv-events-replay", "r0=tcp://10.0.0.9:5558"}, `invalid --kv-events-replay: replicas[0].kv_events_replay "tcp://10.0.0.9:5558": `},
		{[]string{"--kv-events-replay", "r1=tcp://10.0.0.1:5558"}, `invalid --kv-events-replay: replicas[1].kv_events_replay "tcp://10.0.0.1:5558": `},
		{[]string{"--kv-events-replay", "decode:d0=ipc:///tmp/replay"}, `invalid --kv-events-replay: pools.decode[0].kv_events_replay "ipc:///tmp/replay": an ipc:// replay endpoint needs`},
	} {
		r := exa(t, cfg, append([]string{"serve", "routing", "set", "M"}, tc.args...)...)
		assertRejected(t, r, tc.msg, cfg, before)
	}
}

// stats prints an engine's replay counters when it has any, and nothing
// about replay for an engine without.
func TestStatsKVReplay(t *testing.T) {
	cfg := newConfig(t)
	ok(t, cfg, "serve", "routing", "set", "M", "--mode", "cache_aware", "--index", "exact", "--kv-events-bind", "tcp://*:5557",
		"--replica", "r0=http://10.0.0.1:8000", "--replica", "r1=http://10.0.0.2:8000")
	for _, tc := range []struct {
		name   string
		engine config.KVEngineStats
		want   string // "" means no replay line
	}{
		{"none", config.KVEngineStats{Topic: "kv@10.0.0.1:8000@M", Replicas: []string{"M/r0"}, Gaps: 2}, ""},
		{"replays", config.KVEngineStats{Topic: "kv@10.0.0.2:8000@M", Replicas: []string{"M/r1"}, Gaps: 3,
			ReplayAttempts: 3, ReplaySucceeded: 2, ReplayFailed: 1, ReplayedBatches: 17},
			"  kv@10.0.0.2:8000@M replays: 3 gaps asked for, 2 filled, 1 failed (engine cleared), 17 batches recovered\n"},
		{"hostile topic", config.KVEngineStats{Topic: "kv@x\x1b[2J@M", ReplayAttempts: 1, ReplayFailed: 1},
			`  "kv@x\x1b[2J@M" replays: 1 gaps asked for, 0 filled, 1 failed (engine cleared), 0 batches recovered` + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := config.RoutingStats{Model: "M", Source: config.SourceGateway, Mode: "cache_aware", Index: "exact",
				Replicas: []config.ReplicaStats{{Name: "r0", Healthy: true}, {Name: "r1", Healthy: true}},
				KVEvents: &config.KVEventsStats{BlockSize: 16, Engines: []config.KVEngineStats{tc.engine}}}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_ = json.NewEncoder(w).Encode(config.StatsDocument{Models: map[string]config.RoutingStats{"M": rec}})
			}))
			defer srv.Close()
			out := ok(t, cfg, "serve", "routing", "stats", "M", "--gateway", srv.URL)
			if tc.want == "" {
				assert.NotContains(t, out, "replays:")
			} else {
				assert.Contains(t, out, tc.want)
			}
			assert.NotContains(t, out, "\x1b")
		})
	}
}

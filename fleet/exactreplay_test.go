package fleet

import (
	"net/netip"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/kvevents"
)

// TestExactReplayTarget: an engine's Target names its replicas'
// kv_events_replay, bound to the engine's host; replicas of one engine
// that disagree switch replay off; changing it resets the engine.
func TestExactReplayTarget(t *testing.T) {
	s, err := New(Options{Registerer: prometheus.NewRegistry(), Logger: quietLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	bind := freeTCP(t)
	model := func(replay, loraReplay string) *config.File {
		m := config.Model{Mode: gateway.ModeCacheAware, Index: config.IndexExact, KVEventsBind: bind,
			Replicas: []config.Replica{
				{Name: "a", Address: "http://127.0.0.1:8000", KVEventsReplay: replay},
				{Name: "n", Address: "http://engine-n:8000", KVEventsReplay: "tcp://engine-n:5558"},
			}}
		lora := config.Model{Mode: gateway.ModeCacheAware, Index: config.IndexExact, KVEventsBind: bind,
			Replicas: []config.Replica{{Name: "a2", Address: "http://127.0.0.1:8000", KVEventsReplay: loraReplay}}}
		return &config.File{Version: 1, Models: map[string]config.Model{testModel: m, "lora": lora}}
	}
	resolve := func(pod string) kvevents.Target {
		t.Helper()
		tg, err := s.resolveKV(kvevents.Source{Endpoint: bind, Topic: "kv@" + pod + "@" + testModel, Pod: pod, Model: testModel})
		require.NoError(t, err)
		return tg
	}
	require.NoError(t, s.Apply(model("tcp://127.0.0.1:5558", "tcp://127.0.0.1:5558")))
	tg := resolve("127.0.0.1:8000")
	require.Equal(t, "tcp://127.0.0.1:5558", tg.Replay)
	require.Equal(t, []netip.Addr{netip.MustParseAddr("127.0.0.1")}, tg.ReplayFrom)
	tg = resolve("engine-n:8000")
	require.Equal(t, "tcp://engine-n:5558", tg.Replay)
	require.Empty(t, tg.ReplayFrom, "a host name: bound by the configuration's host check only")

	// Heard once, the engine's Target is kept; a change of its replay
	// endpoint resets it so that the next message resolves it afresh.
	s.kv.tr.Handle(bind, [][]byte{[]byte("kv@127.0.0.1:8000@" + testModel), make([]byte, 8), {0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90, 0}})
	require.NoError(t, s.Apply(model("tcp://127.0.0.1:5559", "tcp://127.0.0.1:5558")))
	require.Empty(t, resolve("127.0.0.1:8000").Replay, "two models' replicas of one engine disagree: off")
	var resets uint64
	st, _ := s.kv.tr.Stats()
	for _, e := range st {
		resets += e.Resets
	}
	require.Equal(t, uint64(1), resets)
	require.NoError(t, s.Apply(model("tcp://127.0.0.1:5559", "tcp://127.0.0.1:5559")))
	require.Equal(t, "tcp://127.0.0.1:5559", resolve("127.0.0.1:8000").Replay)
}

package fleet

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/kvevents"
)

// storedMsg is a KV-event message of one BlockStored event of one
// block (16 tokens, the first its hash), in llm-d-inference-sim's array encoding.
func storedMsg(t *testing.T, topic string, seq uint64, hash uint64) [][]byte {
	t.Helper()
	tokens := make([]uint32, 16)
	tokens[0] = uint32(hash) // a block of its own content
	ev := []any{"BlockStored", []any{hash}, nil, tokens, 16, nil, nil, nil}
	b, err := msgpack.Marshal([]any{1712345678.25, []any{ev}, 0})
	require.NoError(t, err)
	sq := make([]byte, 8)
	binary.BigEndian.PutUint64(sq, seq)
	return [][]byte{[]byte(topic), sq, b}
}

// TestExactReconcileClearsDetachedReplicas: a replica that a reload
// moves off an engine (its pod, and so its engine, changed; the gateway
// and the replica are kept) loses the blocks that engine announced: they
// are not the new engine's, and no event of the old engine will remove
// them.
func TestExactReconcileClearsDetachedReplicas(t *testing.T) {
	s, err := New(Options{Registerer: prometheus.NewRegistry(), Logger: quietLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	bind := freeTCP(t)
	file := func(podA, podB string) *config.File {
		return &config.File{Version: 1, Models: map[string]config.Model{testModel: {
			Mode: gateway.ModeCacheAware, Index: config.IndexExact, KVEventsBind: bind,
			Replicas: []config.Replica{
				{Name: "a", Address: "http://127.0.0.1:8000", Pod: podA, CacheBlocks: 100},
				{Name: "b", Address: "http://127.0.0.1:8001", Pod: podB, CacheBlocks: 100},
			}}}}
	}
	cached := func() map[string]int {
		out := map[string]int{}
		for _, r := range s.Snapshot().Models[testModel].Gateway.Replicas() {
			out[r.Name] = r.CachedBlocks
		}
		return out
	}
	require.NoError(t, s.Apply(file("p1", "p2")))
	gw := s.Snapshot().Models[testModel].Gateway
	s.kv.tr.Handle(bind, storedMsg(t, "kv@p1@"+testModel, 0, 7))
	s.kv.tr.Handle(bind, storedMsg(t, "kv@p2@"+testModel, 0, 8))
	require.Equal(t, map[string]int{"a": 1, "b": 1}, cached())

	// a's engine is now p3, never heard: p1 is gone from the table.
	require.NoError(t, s.Apply(file("p3", "p2")))
	require.Same(t, gw, s.Snapshot().Models[testModel].Gateway, "the gateway and its index are kept")
	require.Equal(t, map[string]int{"a": 0, "b": 1}, cached(), "p1's blocks leave a's index")

	// a and b swap engines: each loses the other's blocks and gets its
	// new engine's, which that engine will not announce again.
	require.NoError(t, s.Apply(file("p2", "p3")))
	s.kv.tr.Handle(bind, storedMsg(t, "kv@p3@"+testModel, 0, 9))
	s.kv.tr.Handle(bind, storedMsg(t, "kv@p3@"+testModel, 1, 10))
	require.Equal(t, map[string]int{"a": 1, "b": 2}, cached())

	// A model of another block size shares p3, which is refused: none of
	// its events (nor a reset's clear) reaches b any more.
	f := file("p2", "p3")
	f.Models["big"] = config.Model{Mode: gateway.ModeCacheAware, Index: config.IndexExact, KVEventsBind: bind, BlockSize: 32,
		Replicas: []config.Replica{{Name: "z", Address: "http://127.0.0.1:8002", Pod: "p3", CacheBlocks: 100}}}
	require.NoError(t, s.Apply(f))
	require.Contains(t, s.Snapshot().KV.engines[kvID(bind, "p3")].err, "block sizes")
	require.Equal(t, map[string]int{"a": 1, "b": 0}, cached())
}

// TestExactMetricsOneSeriesPerSource: an engine's state outlives its
// reset (an ejection) while its engine is configured, so after a reload
// that resolves its topic to another engine (here a replica's explicit
// pod that is the first engine's host) two states carry the same
// endpoint and topic; /metrics shows them as one series each, summed,
// instead of failing the gather with a series collected twice.
func TestExactMetricsOneSeriesPerSource(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, err := New(Options{Registerer: reg, Logger: quietLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	bind := freeTCP(t)
	file := func(reps ...config.Replica) *config.File {
		return &config.File{Version: 1, Models: map[string]config.Model{testModel: {
			Mode: gateway.ModeCacheAware, Index: config.IndexExact, KVEventsBind: bind, Replicas: reps}}}
	}
	a := config.Replica{Name: "a", Address: "http://127.0.0.1:8000", CacheBlocks: 100}
	require.NoError(t, s.Apply(file(a)))
	topic := "kv@127.0.0.1@" + testModel // a's engine by its host alone
	s.kv.tr.Handle(bind, storedMsg(t, topic, 0, 7))
	st := s.Snapshot()
	require.Equal(t, 1, s.kv.resetEngines(st.KV, st.Models[testModel].ByName["a"]))
	require.NoError(t, s.Apply(file(a, config.Replica{Name: "c", Address: "http://127.0.0.2:8000", Pod: "127.0.0.1", CacheBlocks: 100})))
	s.kv.tr.Handle(bind, storedMsg(t, topic, 0, 8))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "exa_gateway_kv_messages_total" {
			found = true
			require.Len(t, mf.GetMetric(), 1)
			require.Equal(t, 2.0, mf.GetMetric()[0].GetCounter().GetValue(), "both states' messages")
		}
	}
	require.True(t, found)
}

// TestExactEnginesComeAndGo: engines that reloads remove (pods replaced,
// each with a new address) leave the Translator: they neither fill
// kvevents.MaxEngines, after which no new engine would be heard, nor keep
// their series on /metrics.
func TestExactEnginesComeAndGo(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, err := New(Options{Registerer: reg, Logger: quietLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	bind := freeTCP(t)
	const per = 64
	for round := range kvevents.MaxEngines/per + 1 {
		reps := make([]config.Replica, per)
		for i := range reps {
			reps[i] = config.Replica{Name: fmt.Sprintf("r%d", i), Address: fmt.Sprintf("http://10.%d.%d.%d:8000", round/200, round%200, i+1), CacheBlocks: 100}
		}
		require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {
			Mode: gateway.ModeCacheAware, Index: config.IndexExact, KVEventsBind: bind, Replicas: reps}}}))
		for i, r := range reps {
			s.kv.tr.Handle(bind, storedMsg(t, "kv@"+r.Address[len("http://"):]+"@"+testModel, 0, uint64(i)))
		}
		for _, r := range s.Snapshot().Models[testModel].Gateway.Replicas() {
			require.Equal(t, 1, r.CachedBlocks, "round %d: %s heard", round, r.Name)
		}
	}
	engines, glob := s.kv.tr.Stats()
	require.Len(t, engines, per, "only the configured engines")
	require.Zero(t, glob.Unresolved)
}

// TestExactReconcileNameMoves: a reload that takes a name away from an
// engine (its host alone, once a second engine shares the host) resets
// it, so that messages under that name are resolved afresh instead of
// reaching it through the Translator's cache of sources.
func TestExactReconcileNameMoves(t *testing.T) {
	s, err := New(Options{Registerer: prometheus.NewRegistry(), Logger: quietLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	bind := freeTCP(t)
	file := func(reps ...config.Replica) *config.File {
		return &config.File{Version: 1, Models: map[string]config.Model{testModel: {
			Mode: gateway.ModeCacheAware, Index: config.IndexExact, KVEventsBind: bind, Replicas: reps}}}
	}
	cached := func() map[string]int {
		out := map[string]int{}
		for _, r := range s.Snapshot().Models[testModel].Gateway.Replicas() {
			out[r.Name] = r.CachedBlocks
		}
		return out
	}
	a := config.Replica{Name: "a", Address: "http://127.0.0.1:8000", CacheBlocks: 100}
	b := config.Replica{Name: "b", Address: "http://127.0.0.1:8001", CacheBlocks: 100}
	topic := "kv@127.0.0.1@" + testModel // a's engine by its host alone
	require.NoError(t, s.Apply(file(a)))
	s.kv.tr.Handle(bind, storedMsg(t, topic, 0, 7))
	require.Equal(t, map[string]int{"a": 1}, cached())

	require.NoError(t, s.Apply(file(a, b))) // the host names neither now
	require.Equal(t, map[string]int{"a": 0, "b": 0}, cached(), "a, heard by that name only, is reset")
	s.kv.tr.Handle(bind, storedMsg(t, topic, 1, 8))
	require.Equal(t, map[string]int{"a": 0, "b": 0}, cached(), "the name resolves to no engine")
	_, glob := s.kv.tr.Stats()
	require.Equal(t, uint64(1), glob.Unresolved)
}

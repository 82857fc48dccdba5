package fleet

import (
	"encoding/binary"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
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

// TestExactMetricsOneSeriesPerSource: a reload that gives an engine a new
// id (a second replica on its relay endpoint: the endpoint no longer
// names it alone) leaves its old, reset state in the Translator's figures
// beside the new one, both under the same endpoint and topic; /metrics
// shows them as one series each, summed, instead of failing the gather
// with a series collected twice.
func TestExactMetricsOneSeriesPerSource(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, err := New(Options{Registerer: reg, Logger: quietLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	relay := freeTCP(t)
	a := config.Replica{Name: "a", Address: "http://127.0.0.1:8000", Pod: "pa", KVEvents: relay, CacheBlocks: 100}
	b := config.Replica{Name: "b", Address: "http://127.0.0.1:8001", Pod: "pb", KVEvents: relay, CacheBlocks: 100}
	file := func(reps ...config.Replica) *config.File {
		return &config.File{Version: 1, Models: map[string]config.Model{testModel: {
			Mode: gateway.ModeCacheAware, Index: config.IndexExact, Replicas: reps}}}
	}
	require.NoError(t, s.Apply(file(a)))
	s.kv.tr.Handle(relay, storedMsg(t, "kv@pa@"+testModel, 0, 7))
	require.NoError(t, s.Apply(file(a, b)))
	s.kv.tr.Handle(relay, storedMsg(t, "kv@pa@"+testModel, 1, 8))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "exa_gateway_kv_messages_total" {
			require.Len(t, mf.GetMetric(), 1)
			require.Equal(t, 2.0, mf.GetMetric()[0].GetCounter().GetValue(), "both states' messages")
		}
	}
}

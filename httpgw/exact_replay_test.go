package httpgw

import (
	"context"
	"encoding/binary"
	"io"
	"log"
	"strings"
	"testing"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway/config"
)

// routerReplay is an engine's replay endpoint as vLLM binds it
// (vllm/distributed/kv_events.py, ZmqEventPublisher._service_replay):
// a ROUTER answering (empty, start seq) with (empty, seq, payload) for
// each buffered batch from start, then (empty, 0xFF×8, empty).
func routerReplay(t *testing.T, host string, buffer map[uint64][]byte) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := zmq4.NewRouter(ctx, zmq4.WithLogger(log.New(io.Discard, "", 0)))
	require.NoError(t, r.Listen("tcp://"+host+":0"))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			msg, err := r.Recv()
			if err != nil {
				return
			}
			if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
				continue
			}
			id := msg.Frames[0]
			for seq := binary.BigEndian.Uint64(msg.Frames[2]); buffer[seq] != nil; seq++ {
				_ = r.Send(zmq4.NewMsgFrom(id, nil, binary.BigEndian.AppendUint64(nil, seq), buffer[seq]))
			}
			_ = r.Send(zmq4.NewMsgFrom(id, nil, binary.BigEndian.AppendUint64(nil, ^uint64(0)), nil))
		}
	}()
	t.Cleanup(func() { cancel(); r.Close(); <-done })
	return "tcp://" + r.Addr().String()
}

// TestExactReplayFillsGap: with a replica's kv_events_replay, a batch
// lost on the event stream is fetched from the engine's replay endpoint
// and applied: the index holds the blocks as if nothing was missed, and
// /metrics and /stats count the replay. Without it, the gap clears the
// engine.
func TestExactReplayFillsGap(t *testing.T) {
	for _, replay := range []bool{true, false} {
		t.Run(map[bool]string{true: "replay", false: "no replay"}[replay], func(t *testing.T) {
			ef := newExactFixture(t, 4)
			topic := "kv@" + ef.pod(0) + "@" + testModel
			batches := map[uint64][][]byte{
				1: eventFrames(t, topic, 1, storedEvent([]uint64{1}, nil, wordTokens(words("a", 4)), 4)),
				2: eventFrames(t, topic, 2, storedEvent([]uint64{2}, uint64(1), wordTokens(words("b", 4)), 4)),
				3: eventFrames(t, topic, 3, storedEvent([]uint64{3}, uint64(2), wordTokens(words("c", 4)), 4)),
			}
			if replay {
				buffer := map[uint64][]byte{}
				for seq, fr := range batches {
					buffer[seq] = fr[2]
				}
				cfg := ef.cfg
				cfg.Replicas = append([]config.Replica(nil), ef.cfg.Replicas...)
				host := strings.Split(ef.pod(0), ":")[0]
				cfg.Replicas[0].KVEventsReplay = routerReplay(t, host, buffer)
				require.NoError(t, ef.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: cfg}}))
			}
			ef.srv.HandleKVFrames(ef.bind, batches[1])
			ef.srv.HandleKVFrames(ef.bind, batches[3]) // 2 was lost
			st := ef.stats()
			m := st.Models[testModel]
			require.Len(t, m.KVEvents.Engines, 1)
			e := m.KVEvents.Engines[0]
			succeeded := ef.counter("exa_gateway_kv_replays_total", map[string]string{"result": "succeeded"})
			if !replay {
				require.Zero(t, m.Replicas[0].CachedBlocks)
				require.Equal(t, uint64(1), e.Clears)
				require.Zero(t, e.ReplayAttempts)
				require.Zero(t, succeeded)
				return
			}
			require.Equal(t, 3, m.Replicas[0].CachedBlocks, "%+v", e)
			require.Zero(t, e.Clears)
			require.Equal(t, uint64(1), e.ReplaySucceeded)
			require.Equal(t, uint64(1), e.ReplayedBatches)
			require.Equal(t, 1.0, succeeded)
			require.Equal(t, 1.0, ef.counter("exa_gateway_kv_replayed_batches_total", nil))
			require.Zero(t, ef.counter("exa_gateway_kv_replays_total", map[string]string{"result": "failed"}))
		})
	}
}

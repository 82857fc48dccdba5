package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log"
	"maps"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"
)

// replayServer is a ROUTER socket answering replay requests as vLLM's
// ZmqEventPublisher._service_replay does (vllm/distributed/kv_events.py):
// for a request (identity, empty, seq) it sends (identity, empty, seq,
// payload) for each buffered batch from seq on, then (identity, empty,
// 0xFF×8, empty). With topic set it adds the topic before seq, as
// llm-d-inference-sim after v0.10.2 does. hold makes it never answer.
type replayServer struct {
	sock     zmq4.Socket
	endpoint string
	buf      []batch
	topic    []byte
	hold     bool
	requests chan uint64
}

func newReplayServer(t *testing.T, host string, buf []batch, configure func(*replayServer)) *replayServer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	rs := &replayServer{sock: zmq4.NewRouter(ctx, zmq4.WithLogger(log.New(io.Discard, "", 0))), buf: buf, requests: make(chan uint64, 16)}
	if configure != nil {
		configure(rs)
	}
	require.NoError(t, rs.sock.Listen("tcp://"+host+":0"))
	rs.endpoint = "tcp://" + rs.sock.Addr().String()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			msg, err := rs.sock.Recv()
			if err != nil {
				return
			}
			if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
				continue
			}
			id, start := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
			rs.requests <- start
			if rs.hold {
				continue
			}
			send := func(seq uint64, payload []byte) {
				fr := [][]byte{id, {}}
				if rs.topic != nil {
					fr = append(fr, rs.topic)
				}
				fr = append(fr, binary.BigEndian.AppendUint64(nil, seq), payload)
				_ = rs.sock.Send(zmq4.NewMsgFrom(fr...))
			}
			for _, b := range rs.buf {
				if b.seq >= start {
					send(b.seq, b.payload)
				}
			}
			send(ReplayEnd, []byte{})
		}
	}()
	t.Cleanup(func() { cancel(); rs.sock.Close(); <-done })
	return rs
}

// replayStream is a recorded stream of one engine in vLLM's array
// encoding, where batches 2 to 4 matter: they extend, trim and extend
// the first chain, so an index without them differs.
func replayStream(t *testing.T) []batch {
	payloads := []any{
		arrayBatch(stored{hashes: []uint64{1, 2}, tokens: seqTokens(1, 32), bs: 16}.array()),
		arrayBatch(stored{hashes: []uint64{3}, parent: uint64(2), tokens: seqTokens(33, 16), bs: 16}.array()),
		arrayBatch(stored{hashes: []uint64{4}, parent: uint64(3), tokens: seqTokens(49, 16), bs: 16}.array()),
		arrayBatch(removedArray("GPU", 4)),
		arrayBatch(stored{hashes: []uint64{5}, parent: uint64(3), tokens: seqTokens(100, 16), bs: 16}.array()),
		arrayBatch(stored{hashes: []uint64{10, 11}, tokens: seqTokens(500, 32), bs: 16}.array()),
	}
	out := make([]batch, len(payloads))
	for i, p := range payloads {
		out[i] = batch{seq: uint64(i + 1), payload: pack(t, p)}
	}
	return out
}

const replayTopic = "kv@pod@m"

// runReplay feeds the stream's batches except those in skip to a
// Translator whose engine's replay endpoint is ep, and returns the
// engine's blocks in the index and its stats.
func runReplay(t *testing.T, stream []batch, skip func(seq uint64) bool, ep string, from []netip.Addr, o ReplayOptions) (map[uint64]bool, EngineStats) {
	t.Helper()
	idx := newFakeIndex()
	tr := NewTranslator(podResolver(idx, func(tg *Target) { tg.Replay, tg.ReplayFrom = ep, from }), Limits{})
	tr.SetReplay(o)
	for _, b := range stream {
		if skip == nil || !skip(b.seq) {
			tr.Handle("tcp://*:5557", frames(replayTopic, b.seq, b.payload))
		}
	}
	idx.mu.Lock()
	defer idx.mu.Unlock()
	return maps.Clone(idx.held["pod"]), statsOf(t, tr, replayTopic)
}

func gapAt2to4(seq uint64) bool { return seq >= 2 && seq <= 4 }

// TestReplayFillsGap: batches 2-4 lost on the live stream are replayed
// from vLLM's replay endpoint (and from the sim's topic variant): the
// index ends as after an uninterrupted run, with nothing cleared.
func TestReplayFillsGap(t *testing.T) {
	stream := replayStream(t)
	want, _ := runReplay(t, stream, nil, "", nil, ReplayOptions{})
	require.Len(t, want, 6) // 1, 2, 3 and 5 of the first chain (4 removed), 10 and 11
	without, _ := runReplay(t, stream, gapAt2to4, "", nil, ReplayOptions{})
	require.NotEqual(t, want, without, "the gap must matter")

	for _, topic := range []string{"", replayTopic} {
		t.Run("topic="+topic, func(t *testing.T) {
			rs := newReplayServer(t, "127.0.0.1", stream, func(rs *replayServer) {
				if topic != "" {
					rs.topic = []byte(topic)
				}
			})
			got, st := runReplay(t, stream, gapAt2to4, rs.endpoint, []netip.Addr{netip.MustParseAddr("127.0.0.1")}, ReplayOptions{})
			require.Equal(t, want, got)
			require.Equal(t, uint64(1), <-rs.requests, "asks from the last applied, to check it")
			require.Equal(t, uint64(1), st.Gaps)
			require.Equal(t, uint64(1), st.ReplayAttempts)
			require.Equal(t, uint64(1), st.ReplaySucceeded)
			require.Zero(t, st.ReplayFailed)
			require.Equal(t, uint64(3), st.ReplayedBatches)
			require.Zero(t, st.Clears)
			require.Zero(t, st.Skipped)
		})
	}
}

// TestReplayFailures: whenever the replay cannot give exactly the
// missing batches, the engine is cleared as without replay.
func TestReplayFailures(t *testing.T) {
	stream := replayStream(t)
	without, _ := runReplay(t, stream, gapAt2to4, "", nil, ReplayOptions{})
	lo := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	cases := []struct {
		name    string
		host    string
		from    []netip.Addr
		o       ReplayOptions
		server  func(*replayServer)
		wantErr string
	}{
		{name: "buffer no longer holds the range", host: "127.0.0.1", from: lo,
			server: func(rs *replayServer) { rs.buf = rs.buf[3:] }, wantErr: "where 1 was due"},
		{name: "buffer empty", host: "127.0.0.1", from: lo,
			server: func(rs *replayServer) { rs.buf = nil }, wantErr: "ended the replay before batch 1"},
		{name: "replayed sequence has a gap", host: "127.0.0.1", from: lo,
			server: func(rs *replayServer) { rs.buf = append(rs.buf[:2:2], rs.buf[3:]...) }, wantErr: "batch 4 where 3 was due"},
		{name: "slow replay", host: "127.0.0.1", from: lo, o: ReplayOptions{Timeout: 300 * time.Millisecond},
			server: func(rs *replayServer) { rs.hold = true }, wantErr: "no batch 1 within 300ms"},
		{name: "another host", host: "127.0.0.2", from: lo, wantErr: "not the engine's host"},
		{name: "over the batch bound", host: "127.0.0.1", from: lo, o: ReplayOptions{MaxBatches: 2}, wantErr: "a gap of 3 batches"},
		{name: "over the byte bound", host: "127.0.0.1", from: lo, o: ReplayOptions{MaxBytes: 40}, wantErr: "over 40 bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rs := newReplayServer(t, c.host, stream, c.server)
			got, st := runReplay(t, stream, gapAt2to4, rs.endpoint, c.from, c.o)
			require.Equal(t, without, got)
			require.Equal(t, uint64(1), st.ReplayAttempts)
			require.Equal(t, uint64(1), st.ReplayFailed)
			require.Zero(t, st.ReplaySucceeded)
			require.Zero(t, st.ReplayedBatches)
			require.Equal(t, uint64(1), st.Clears)
			require.Equal(t, uint64(1), st.Skipped)
			require.Contains(t, st.LastError, c.wantErr)
		})
	}
}

// TestReplayOffWithoutEndpoint: without SetReplay, or without the
// engine's Replay endpoint, nothing is asked.
func TestReplayOffWithoutEndpoint(t *testing.T) {
	stream := replayStream(t)
	rs := newReplayServer(t, "127.0.0.1", stream, nil)
	idx := newFakeIndex()
	tr := NewTranslator(podResolver(idx, func(tg *Target) { tg.Replay = rs.endpoint }), Limits{}) // no SetReplay
	for _, b := range stream {
		if !gapAt2to4(b.seq) {
			tr.Handle("tcp://*:5557", frames(replayTopic, b.seq, b.payload))
		}
	}
	st := statsOf(t, tr, replayTopic)
	require.Zero(t, st.ReplayAttempts)
	require.Equal(t, uint64(1), st.Clears)
	require.Empty(t, rs.requests)
}

// TestReplayAfterReconnect: a subscriber dialling a publisher that goes
// away and comes back misses what was published meanwhile; the gap its
// next message shows is filled from the replay endpoint.
func TestReplayAfterReconnect(t *testing.T) {
	stream := replayStream(t)
	want, _ := runReplay(t, stream, nil, "", nil, ReplayOptions{})
	rs := newReplayServer(t, "127.0.0.1", stream, nil)
	idx := newFakeIndex()
	tr := NewTranslator(func(s Source) (Target, error) {
		if s.Topic == "warm" {
			return Target{}, errors.New("a warm-up message")
		}
		return Target{Index: idx, Replica: "pod", Replay: rs.endpoint}, nil
	}, Limits{})
	tr.SetReplay(ReplayOptions{})
	ep := "tcp://127.0.0.1:" + strconv.Itoa(freePort(t))
	sub := NewSubscriber(tr, Options{Backoff: func(int) time.Duration { return 10 * time.Millisecond }})
	t.Cleanup(func() { sub.Close() })
	require.NoError(t, sub.Connect(ep))

	messages := func() uint64 {
		st, _ := tr.Stats()
		if len(st) == 0 {
			return 0
		}
		return st[0].Messages
	}
	publish := func(seqs ...uint64) {
		ctx, cancel := context.WithCancel(context.Background())
		pub := zmq4.NewPub(ctx)
		require.NoError(t, pub.Listen(ep))
		defer func() { cancel(); pub.Close() }()
		// Until the subscription reaches the publisher, its messages are
		// dropped: send unresolvable warm-ups until one is heard.
		_, g := tr.Stats()
		eventually(t, "the subscriber to hear the publisher", func() bool {
			require.NoError(t, pub.Send(zmq4.NewMsgFrom(frames("warm", 1, nil)...)))
			_, now := tr.Stats()
			return now.Unresolved > g.Unresolved
		})
		before := messages()
		for _, s := range seqs {
			require.NoError(t, pub.Send(zmq4.NewMsgFrom(frames(replayTopic, s, stream[s-1].payload)...)))
		}
		eventually(t, "the messages", func() bool { return messages() >= before+uint64(len(seqs)) })
	}
	publish(1)    // then the publisher goes away: 2-4 are lost
	publish(5, 6) // the subscriber reconnects
	idx.mu.Lock()
	got := maps.Clone(idx.held["pod"])
	idx.mu.Unlock()
	require.Equal(t, want, got)
	st := statsOf(t, tr, replayTopic)
	require.Equal(t, uint64(1), st.ReplaySucceeded)
	require.Equal(t, uint64(3), st.ReplayedBatches)
	require.Zero(t, st.Clears)
}

// TestReplayNotForRestartAfterLastSeq: a sequence number going back from
// the last possible one (0xFFFFFFFFFFFFFFFF) is a restart, not a gap, and
// is not replayed. Before, last+1 wrapped to 0 so any later number looked
// past it: the restart was counted, and the replay endpoint asked for the
// batches from 0.
func TestReplayNotForRestartAfterLastSeq(t *testing.T) {
	idx := newFakeIndex()
	tr := NewTranslator(podResolver(idx, func(tg *Target) { tg.Replay = "tcp://127.0.0.1:1" }), Limits{})
	tr.SetReplay(ReplayOptions{})
	asked := 0
	tr.replayOf().dial = func(context.Context, string, []netip.Addr) (zmq4.Socket, error) {
		asked++
		return nil, errors.New("not dialled in this test")
	}
	payload := pack(t, arrayBatch(storedRun(1, 1)))
	tr.Handle("tcp://*:5557", frames(replayTopic, ^uint64(0), payload))
	tr.Handle("tcp://*:5557", frames(replayTopic, 3, payload))
	st := statsOf(t, tr, replayTopic)
	require.Equal(t, uint64(1), st.Restarts)
	require.Zero(t, st.Gaps)
	require.Zero(t, st.ReplayAttempts, "a restart replayed")
	require.Zero(t, asked)
	require.Equal(t, uint64(1), st.Skipped)
}

// TestReplayRestartThatLooksLikeAGap: an engine that restarts numbers its
// batches from 0 again; when the subscriber missed the new incarnation's
// first batches, the first it hears may be past the last it applied from
// the old one, which looks like a gap. The replay endpoint then serves
// the new incarnation's batches, and applying them kept the old
// incarnation's blocks, which the restarted engine no longer holds and
// will never remove (found in review). The replay now asks from the last
// batch applied and checks it is the one applied: here it is not, so the
// engine is cleared as for a restart.
func TestReplayRestartThatLooksLikeAGap(t *testing.T) {
	old := []batch{
		{seq: 1, payload: pack(t, arrayBatch(storedRun(1, 2)))},
		{seq: 2, payload: pack(t, arrayBatch(storedRun(3, 1)))},
	}
	restarted := make([]batch, 4)
	for i := range restarted { // the new incarnation's batches 1 to 4
		restarted[i] = batch{seq: uint64(i + 1), payload: pack(t, arrayBatch(storedRun(uint64(100+10*i), 1)))}
	}
	rs := newReplayServer(t, "127.0.0.1", restarted, nil)
	idx := newFakeIndex()
	tr := NewTranslator(podResolver(idx, func(tg *Target) { tg.Replay = rs.endpoint }), Limits{})
	tr.SetReplay(ReplayOptions{})
	for _, b := range old {
		tr.Handle("tcp://*:5557", frames(replayTopic, b.seq, b.payload))
	}
	oldKeys := idx.keys("pod")
	require.Len(t, oldKeys, 3)
	tr.Handle("tcp://*:5557", frames(replayTopic, 4, restarted[3].payload)) // 1-3 of the new incarnation missed

	for _, k := range oldKeys {
		require.NotContains(t, idx.keys("pod"), k, "a block of the engine before its restart")
	}
	st := statsOf(t, tr, replayTopic)
	require.Equal(t, uint64(1), st.ReplayFailed)
	require.Contains(t, st.LastError, "batch 2 is not the one applied")
	require.Equal(t, uint64(1), st.Clears)
}

package kvevents

import (
	"net/netip"
	"os"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
)

// The replay figures of docs/kv-events.md ("Replay"), measured with
//
//	EXA_MEASURE_REPLAY=1 go test ./kvevents -run TestMeasureReplay -v
//
// They are printed, not asserted.
func TestMeasureReplay(t *testing.T) {
	if os.Getenv("EXA_MEASURE_REPLAY") == "" {
		t.Skip("set EXA_MEASURE_REPLAY=1 to measure")
	}
	lo := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	t.Run("time", func(t *testing.T) {
		// Batches of one BlockStored of 4 blocks of 16 tokens, chained.
		const n = 1024 + 2
		stream := make([]batch, n)
		for i := range stream {
			s := stored{hashes: []uint64{uint64(4*i + 1), uint64(4*i + 2), uint64(4*i + 3), uint64(4*i + 4)}, tokens: seqTokens(uint32(64*i), 64), bs: 16}
			if i > 0 {
				s.parent = uint64(4 * i)
			}
			stream[i] = batch{seq: uint64(i + 1), payload: pack(t, arrayBatch(s.array()))}
		}
		rs := newReplayServer(t, "127.0.0.1", stream, nil)
		t.Logf("payload %d bytes a batch", len(stream[1].payload))
		for _, gap := range []int{1, 100, 1024} {
			var ds []time.Duration
			for range 7 {
				idx := newFakeIndex()
				tr := NewTranslator(podResolver(idx, func(tg *Target) { tg.Replay, tg.ReplayFrom = rs.endpoint, lo }), Limits{})
				tr.SetReplay(ReplayOptions{})
				tr.Handle("e", frames(replayTopic, 1, stream[0].payload))
				last := stream[gap+1]
				start := time.Now()
				tr.Handle("e", frames(replayTopic, last.seq, last.payload))
				ds = append(ds, time.Since(start))
				st := statsOf(t, tr, replayTopic)
				if st.ReplayedBatches != uint64(gap) || st.Clears != 0 {
					t.Fatalf("gap %d: %+v", gap, st)
				}
				<-rs.requests
			}
			slices.Sort(ds)
			t.Logf("gap of %4d batches: replayed and applied in median %v (min %v, max %v, 7 runs)", gap, ds[3], ds[0], ds[6])
		}
	})
	t.Run("memory", func(t *testing.T) {
		// At the byte bound: 1024 batches of 32 KiB, after the one heard.
		stream := make([]batch, 1025)
		for i := range stream {
			stream[i] = batch{seq: uint64(i + 1), payload: make([]byte, 32<<10)}
		}
		rs := newReplayServer(t, "127.0.0.1", stream, nil)
		r := &replayer{o: ReplayOptions{}.withDefaults()}
		r.dial = r.dialDealer
		before := heapNow()
		got, err := r.fetch(rs.endpoint, lo, 2, 1025, xxhash.Sum64(stream[0].payload))
		if err != nil {
			t.Fatal(err)
		}
		held := heapNow()
		t.Logf("%d batches of 32 KiB (%d MiB, the byte bound) held: heap +%.1f MiB", len(got), DefaultReplayMaxBytes>>20, float64(held-before)/(1<<20))
		runtime.KeepAlive(got)
	})
}

package kvevents

import (
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/keys"
)

// fakeIndex is a model of the gateway's index: the set of keys each
// replica holds, with no capacity.
type fakeIndex struct {
	mu    sync.Mutex
	held  map[string]map[uint64]bool
	known map[string]bool // replicas that exist; nil means all
}

func newFakeIndex() *fakeIndex { return &fakeIndex{held: map[string]map[uint64]bool{}} }

func (f *fakeIndex) ApplyEvent(name string, ev gateway.CacheEvent) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.known != nil && !f.known[name] {
		return fmt.Errorf("%w: %q", gateway.ErrUnknownReplica, name)
	}
	h := f.held[name]
	if h == nil {
		h = map[uint64]bool{}
		f.held[name] = h
	}
	switch ev.Kind {
	case gateway.BlocksStored:
		for _, k := range ev.Blocks {
			h[k] = true
		}
	case gateway.BlocksRemoved:
		for _, k := range ev.Blocks {
			delete(h, k)
		}
	case gateway.AllCleared:
		clear(h)
	}
	return nil
}

func (f *fakeIndex) keys(name string) []uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.held[name]))
}

func sortedKey(k gateway.Key) []uint64 { return slices.Sorted(slices.Values(k)) }

const (
	topicA = "kv@10.0.0.1:8000@m"
	topicB = "kv@10.0.0.2:8000@m"
)

// podResolver sends each kv@<pod>@<model> topic to replica <pod>.
func podResolver(idx Index, mod func(*Target)) Resolver {
	return func(s Source) (Target, error) {
		if s.Pod == "" {
			return Target{}, fmt.Errorf("no pod in topic %q", s.Topic)
		}
		t := Target{Index: idx, Replica: s.Pod}
		if mod != nil {
			mod(&t)
		}
		return t, nil
	}
}

// feed sends payloads as consecutive messages of topic from seq on.
type feeder struct {
	t   testing.TB
	tr  *Translator
	seq map[string]uint64
}

func newFeeder(t testing.TB, tr *Translator) *feeder {
	return &feeder{t: t, tr: tr, seq: map[string]uint64{}}
}

func (f *feeder) send(topic string, batch any) {
	f.seq[topic]++
	f.tr.Handle("tcp://*:5557", frames(topic, f.seq[topic], pack(f.t, batch)))
}

func statsOf(t *testing.T, tr *Translator, topic string) EngineStats {
	t.Helper()
	st, _ := tr.Stats()
	for _, s := range st {
		if s.Source.Topic == topic {
			return s
		}
	}
	t.Fatalf("no stats for %q", topic)
	return EngineStats{}
}

func mustKey(t testing.TB, name string, tokens []uint32) gateway.Key {
	t.Helper()
	k, err := keys.AppendExact(nil, name, tokens, 16)
	require.NoError(t, err)
	return k
}

// TestTranslateChain: a root event then a child event give the keys the
// request path computes for the whole prompt, under the model's name or
// the LoRA adapter's; removals and clears follow.
func TestTranslateChain(t *testing.T) {
	for _, enc := range []string{"arrays", "maps"} {
		t.Run(enc, func(t *testing.T) {
			idx := newFakeIndex()
			tr := NewTranslator(podResolver(idx, nil), Limits{})
			f := newFeeder(t, tr)
			batch := func(evs ...stored) any {
				var out []any
				for _, e := range evs {
					if enc == "arrays" {
						out = append(out, e.array())
					} else {
						out = append(out, e.mapped())
					}
				}
				if enc == "arrays" {
					return arrayBatch(out...)
				}
				return mapBatch(out...)
			}
			prompt := seqTokens(1000, 64)
			f.send(topicA, batch(stored{hashes: []uint64{101, 102}, tokens: prompt[:32], bs: 16, medium: "GPU"}))
			f.send(topicA, batch(stored{hashes: []uint64{103, 104}, parent: uint64(102), tokens: prompt[32:], bs: 16, medium: "GPU"}))
			want := mustKey(t, "m", prompt)
			require.Equal(t, sortedKey(want), idx.keys("10.0.0.1:8000"))

			lora := stored{hashes: []uint64{201}, tokens: prompt[:16], bs: 16, lora: "sql-adapter"}
			f.send(topicA, batch(lora))
			require.Contains(t, idx.keys("10.0.0.1:8000"), mustKey(t, "sql-adapter", prompt[:16])[0])

			if enc == "arrays" {
				f.send(topicA, arrayBatch(removedArray("GPU", 104, 103, 999)))
			} else {
				f.send(topicA, mapBatch(removedMap(nil, 104, 103, 999)))
			}
			require.Equal(t, sortedKey(append(want[:2:2], mustKey(t, "sql-adapter", prompt[:16])[0])), idx.keys("10.0.0.1:8000"))
			st := statsOf(t, tr, topicA)
			require.Equal(t, 3, st.Mapped)
			require.Equal(t, uint64(5), st.StoredBlocks)
			require.Equal(t, uint64(2), st.RemovedBlocks)
			require.Equal(t, uint64(4), st.Applied)
			require.Zero(t, st.Dropped)

			if enc == "arrays" {
				f.send(topicA, arrayBatch(clearedArray()))
			} else {
				f.send(topicA, mapBatch(clearedMap()))
			}
			require.Empty(t, idx.keys("10.0.0.1:8000"))
			st = statsOf(t, tr, topicA)
			require.Zero(t, st.Mapped)
			require.Zero(t, st.Clears, "the engine's own clear is not one of ours")
			require.Equal(t, "10.0.0.1:8000", st.Replica)
		})
	}
}

// TestTranslateSequence: a gap or a restart clears the engine's blocks
// (and only that engine's), and is counted.
func TestTranslateSequence(t *testing.T) {
	idx := newFakeIndex()
	tr := NewTranslator(podResolver(idx, nil), Limits{})
	send := func(topic string, seq uint64, base uint32) {
		tr.Handle("e", frames(topic, seq, pack(t, arrayBatch(stored{hashes: []uint64{uint64(base)}, tokens: seqTokens(base, 16), bs: 16}.array()))))
	}
	send(topicA, 7, 1) // the first sequence number seen may be anything
	send(topicA, 8, 2)
	send(topicB, 1, 3)
	require.Len(t, idx.keys("10.0.0.1:8000"), 2)

	send(topicA, 10, 4) // gap: 9 is lost
	require.Empty(t, idx.keys("10.0.0.1:8000"), "a gap clears the engine and its batch is not applied")
	require.Len(t, idx.keys("10.0.0.2:8000"), 1, "other engines keep their blocks")
	st := statsOf(t, tr, topicA)
	require.Equal(t, uint64(1), st.Gaps)
	require.Equal(t, uint64(1), st.Clears)
	require.Equal(t, uint64(1), st.Skipped)
	send(topicA, 11, 7) // the next message follows the skipped one
	require.Equal(t, []uint64{mustKey(t, "m", seqTokens(7, 16))[0]}, idx.keys("10.0.0.1:8000"))

	send(topicA, 1, 5) // restart
	require.Empty(t, idx.keys("10.0.0.1:8000"))
	st = statsOf(t, tr, topicA)
	require.Equal(t, uint64(1), st.Restarts)
	require.Equal(t, uint64(2), st.Clears)
	require.Equal(t, uint64(2), st.Skipped)
	require.Zero(t, st.Mapped)
	send(topicA, 2, 8)
	require.Equal(t, []uint64{mustKey(t, "m", seqTokens(8, 16))[0]}, idx.keys("10.0.0.1:8000"))

	send(topicA, 2, 6) // a repeated number is a restart too
	require.Equal(t, uint64(2), statsOf(t, tr, topicA).Restarts)
	require.Empty(t, idx.keys("10.0.0.1:8000"), "a repeated number clears and applies nothing")
}

// TestTranslateGapBatchNotApplied: the issue-21 attack. A rogue message
// with a wrong sequence number under an engine's topic used to clear the
// engine and then apply the rogue batch; now it only clears.
func TestTranslateGapBatchNotApplied(t *testing.T) {
	idx := newFakeIndex()
	tr := NewTranslator(podResolver(idx, nil), Limits{})
	msg := func(seq uint64, base uint32) [][]byte {
		return frames(topicA, seq, pack(t, arrayBatch(stored{hashes: []uint64{uint64(base)}, tokens: seqTokens(base, 16), bs: 16}.array())))
	}
	tr.Handle("e", msg(1, 1))
	tr.Handle("e", msg(1000, 99)) // rogue: any number but 2
	require.Empty(t, idx.keys("10.0.0.1:8000"))
	st := statsOf(t, tr, topicA)
	require.Equal(t, uint64(1), st.Skipped)
	require.Zero(t, st.StoredBlocks-1, "only the first message's block was ever stored")
}

// TestTranslateTopicVariants: sources resolving to one engine share its
// state (a variant is no new engine with its own sequence numbers); a
// source naming the engine with another model is refused, and so are
// sources beyond MaxTopicsPerEngine.
func TestTranslateTopicVariants(t *testing.T) {
	idx := newFakeIndex()
	tr := NewTranslator(func(s Source) (Target, error) {
		if s.Pod == "" {
			return Target{}, fmt.Errorf("no pod")
		}
		return Target{Index: idx, Replica: s.Pod}, nil // model from the topic
	}, Limits{})
	ev := func(base uint32) []byte {
		return pack(t, arrayBatch(stored{hashes: []uint64{uint64(base)}, tokens: seqTokens(base, 16), bs: 16}.array()))
	}
	tr.Handle("e", frames("kv@p@m", 1, ev(1)))
	tr.Handle("e", frames("kv@p@m", 2, ev(2)))
	// Another model under the engine's pod: refused, applies nothing.
	for i := range 10 {
		tr.Handle("e", frames("kv@p@other", uint64(i+1), ev(50)))
	}
	st, _ := tr.Stats()
	require.Len(t, st, 1, "one engine")
	require.Equal(t, uint64(10), st[0].Rejected)
	require.Equal(t, uint64(2), st[0].Messages)
	require.Equal(t, sortedKey(append(mustKey(t, "m", seqTokens(1, 16)), mustKey(t, "m", seqTokens(2, 16))...)), idx.keys("p"))

	// The same engine on another endpoint: shares the sequence, so a
	// variant's own numbering is a gap, not a fresh engine.
	tr.Handle("f", frames("kv@p@m", 1, ev(3)))
	require.Empty(t, idx.keys("p"), "the variant's number does not follow the engine's: cleared, not applied")
	st, _ = tr.Stats()
	require.Len(t, st, 1)
	require.Equal(t, uint64(1), st[0].Restarts)

	// At most MaxTopicsPerEngine sources per engine.
	for i := range MaxTopicsPerEngine + 3 {
		tr.Handle(fmt.Sprintf("ep%d", i), frames("kv@p@m", uint64(100+i), ev(4)))
	}
	st, _ = tr.Stats()
	require.Len(t, st, 1)
	require.Equal(t, uint64(10+5), st[0].Rejected, "2 endpoints heard before, 2 more accepted, 5 refused")
	require.Contains(t, st[0].LastError, "already heard under 4 topics")

	// Reset forgets the sources: the engine may be heard elsewhere now.
	require.Equal(t, 1, tr.Reset(nil))
	tr.Handle("g", frames("kv@p@m", 1, ev(5)))
	require.Equal(t, []uint64{mustKey(t, "m", seqTokens(5, 16))[0]}, idx.keys("p"))
}

// TestTranslateFaults: each kind of fault is counted under its reason;
// faults that may hide a removal clear the engine, the others do not.
func TestTranslateFaults(t *testing.T) {
	root := stored{hashes: []uint64{1}, tokens: seqTokens(1, 16), bs: 16}
	for _, tc := range []struct {
		name    string
		batch   any
		reason  func(EngineStats) uint64
		cleared bool
		mapped  int
	}{
		{"orphan", arrayBatch(stored{hashes: []uint64{2}, parent: uint64(77), tokens: seqTokens(2, 16), bs: 16}.array()),
			func(s EngineStats) uint64 { return s.DroppedOrphan }, false, 1},
		{"unknown type", arrayBatch([]any{"BlockMoved", []any{1}}),
			func(s EngineStats) uint64 { return s.DroppedUnknown }, false, 1},
		{"malformed store", arrayBatch([]any{"BlockStored", []any{2}, nil, "tokens", 16}),
			func(s EngineStats) uint64 { return s.DroppedMalformed }, false, 1},
		{"malformed removal", arrayBatch([]any{"BlockRemoved", "hashes"}),
			func(s EngineStats) uint64 { return s.DroppedMalformed }, true, 0},
		{"unreadable tag", arrayBatch([]any{3.5, []any{1}}),
			func(s EngineStats) uint64 { return s.DroppedMalformed }, true, 0},
		{"CPU medium store", arrayBatch(stored{hashes: []uint64{2}, tokens: seqTokens(2, 16), bs: 16, medium: "CPU"}.array()),
			func(s EngineStats) uint64 { return s.DroppedMedium }, false, 1},
		{"CPU medium removal", arrayBatch(removedArray("CPU", 1)),
			func(s EngineStats) uint64 { return s.DroppedMedium }, false, 1},
		{"sliding window group", arrayBatch([]any{"BlockStored", []any{2}, nil, seqTokens(2, 16), 16, nil, "GPU", nil, nil, 1, "sliding_window", 128}),
			func(s EngineStats) uint64 { return s.DroppedMedium }, false, 1},
		{"block size", arrayBatch(stored{hashes: []uint64{2}, tokens: seqTokens(2, 32), bs: 32}.array()),
			func(s EngineStats) uint64 { return s.DroppedBlockSize }, false, 1},
		{"over limit", arrayBatch(removedArray(nil, slices.Collect(func(yield func(uint64) bool) {
			for i := range uint64(70000) {
				if !yield(i) {
					return
				}
			}
		})...)), func(s EngineStats) uint64 { return s.DroppedLimit }, true, 0},
		{"garbage payload", []byte{0xc1}, func(s EngineStats) uint64 { return s.MalformedMessages }, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			idx := newFakeIndex()
			tr := NewTranslator(podResolver(idx, nil), Limits{})
			tr.Handle("e", frames(topicA, 1, pack(t, arrayBatch(root.array()))))
			var payload []byte
			if b, ok := tc.batch.([]byte); ok {
				payload = b
			} else {
				payload = pack(t, tc.batch)
			}
			tr.Handle("e", frames(topicA, 2, payload))
			st := statsOf(t, tr, topicA)
			require.Equal(t, uint64(1), tc.reason(st), "%+v", st)
			require.Equal(t, tc.mapped, st.Mapped)
			if tc.cleared {
				require.Empty(t, idx.keys("10.0.0.1:8000"))
				require.Equal(t, uint64(1), st.Clears)
			} else {
				require.Len(t, idx.keys("10.0.0.1:8000"), 1)
				require.Zero(t, st.Clears)
			}
			require.NotEmpty(t, st.LastError+fmt.Sprint(tc.reason(st)))
		})
	}
}

func TestTranslateExtraKeys(t *testing.T) {
	idx := newFakeIndex()
	tr := NewTranslator(podResolver(idx, nil), Limits{})
	f := newFeeder(t, tr)
	ev := stored{hashes: []uint64{1, 2, 3}, tokens: seqTokens(1, 48), bs: 16, extra: []any{nil, []any{"img-hash"}, nil}}
	f.send(topicA, arrayBatch(ev.array()))
	require.Equal(t, []uint64{mustKey(t, "m", seqTokens(1, 16))[0]}, idx.keys("10.0.0.1:8000"),
		"blocks from the first with extra keys on are not keyed by tokens alone")
	require.Equal(t, 1, statsOf(t, tr, topicA).Mapped)
}

func TestTranslateOverflow(t *testing.T) {
	idx := newFakeIndex()
	tr := NewTranslator(podResolver(idx, func(tg *Target) { tg.MaxBlocks = 4 }), Limits{})
	f := newFeeder(t, tr)
	f.send(topicA, arrayBatch(stored{hashes: []uint64{1, 2, 3}, tokens: seqTokens(1, 48), bs: 16}.array()))
	f.send(topicA, arrayBatch(stored{hashes: []uint64{4, 5}, tokens: seqTokens(100, 32), bs: 16}.array()))
	st := statsOf(t, tr, topicA)
	require.Equal(t, uint64(1), st.Overflows)
	require.Equal(t, 2, st.Mapped)
	require.Equal(t, sortedKey(mustKey(t, "m", seqTokens(100, 32))), idx.keys("10.0.0.1:8000"))
}

func TestTranslateResolveAndReset(t *testing.T) {
	idx := newFakeIndex()
	idx.known = map[string]bool{"10.0.0.1:8000": true}
	resolves := 0
	tr := NewTranslator(func(s Source) (Target, error) {
		resolves++
		return podResolver(idx, nil)(s)
	}, Limits{})
	f := newFeeder(t, tr)
	ev := arrayBatch(stored{hashes: []uint64{1}, tokens: seqTokens(1, 16), bs: 16}.array())
	f.send("not-a-kv-topic", ev)
	tr.Handle("e", [][]byte{{1}})
	st, glob := tr.Stats()
	require.Equal(t, uint64(1), glob.Unresolved)
	require.Equal(t, uint64(1), glob.MalformedFrames)
	require.Contains(t, glob.LastError, "1 frames")
	require.Empty(t, st, "unresolved sources get no state")

	f.send(topicA, ev)
	f.send(topicA, arrayBatch(stored{hashes: []uint64{2}, parent: uint64(1), tokens: seqTokens(2, 16), bs: 16}.array()))
	require.Len(t, idx.keys("10.0.0.1:8000"), 2)
	require.Equal(t, 2, resolves, "once per engine (and once per message of an unresolved source)")

	require.Equal(t, 1, tr.Reset(func(s Source, tg Target) bool { return tg.Replica == "10.0.0.1:8000" }))
	require.Empty(t, idx.keys("10.0.0.1:8000"), "reset clears the index")
	f.seq[topicA] = 0 // the sequence is forgotten too: 1 again is no restart
	f.send(topicA, arrayBatch(stored{hashes: []uint64{3}, parent: uint64(1), tokens: seqTokens(3, 16), bs: 16}.array()))
	s := statsOf(t, tr, topicA)
	require.Equal(t, 3, resolves, "resolved again after Reset")
	require.Equal(t, uint64(1), s.DroppedOrphan, "the map is forgotten too")
	require.Zero(t, s.Restarts)
	require.Equal(t, uint64(1), s.Resets)

	// The replica goes away: the engine is resolved afresh.
	idx.known = map[string]bool{}
	f.send(topicA, ev)
	s = statsOf(t, tr, topicA)
	require.Equal(t, uint64(1), s.DroppedApply)
	require.Contains(t, s.LastError, "unknown replica")
	idx.known = map[string]bool{"10.0.0.1:8000": true}
	f.send(topicA, ev)
	require.Equal(t, 4, resolves, "resolved again once the replica failed")
	require.Len(t, idx.keys("10.0.0.1:8000"), 1)
}

// TestTranslateReplay: Replay hands over the keys the index holds for an
// engine, so a second copy of its replica can be filled; engines not
// matched are left out.
func TestTranslateReplay(t *testing.T) {
	idx := newFakeIndex()
	tr := NewTranslator(podResolver(idx, nil), Limits{})
	f := newFeeder(t, tr)
	f.send(topicA, arrayBatch(stored{hashes: []uint64{1, 2}, tokens: seqTokens(1, 32), bs: 16}.array()))
	f.send(topicA, arrayBatch(stored{hashes: []uint64{3}, parent: uint64(2), tokens: seqTokens(40, 16), bs: 16}.array()))
	f.send(topicA, arrayBatch(removedArray(nil, 3)))
	f.send(topicB, arrayBatch(stored{hashes: []uint64{9}, tokens: seqTokens(9, 16), bs: 16}.array()))
	copyIdx := newFakeIndex()
	n := tr.Replay(func(s Source, _ Target) bool { return s.Topic == topicA }, func(_ Source, tg Target, keys gateway.Key) {
		require.NoError(t, copyIdx.ApplyEvent(tg.Replica, gateway.CacheEvent{Kind: gateway.BlocksStored, Blocks: keys}))
	})
	require.Equal(t, 1, n)
	require.Equal(t, idx.keys("10.0.0.1:8000"), copyIdx.keys("10.0.0.1:8000"))
	require.Len(t, copyIdx.keys("10.0.0.1:8000"), 2, "the removed block is not replayed")
	require.Empty(t, copyIdx.keys("10.0.0.2:8000"))
}

func TestParseTopic(t *testing.T) {
	for _, tc := range []struct {
		topic, pod, model string
		ok                bool
	}{
		{"kv@10.0.0.1@llama", "10.0.0.1", "llama", true},
		{"kv@pod-a@meta-llama/Llama-3.1-8B", "pod-a", "meta-llama/Llama-3.1-8B", true},
		{"", "", "", false},
		{"kv@pod", "", "", false},
		{"kv@@m", "", "", false},
		{"kv@p@", "", "", false},
		{"kv@p@m@x", "", "", false},
		{"xx@p@m", "", "", false},
	} {
		pod, model, ok := ParseTopic(tc.topic)
		require.Equal(t, []any{tc.pod, tc.model, tc.ok}, []any{pod, model, ok}, tc.topic)
	}
}

// TestPropIndexWithinMap: whatever the stream (stores, removals, clears,
// lost and repeated messages, garbage), every key the index holds for an
// engine is in the engine's map, so any removal the engine announces can
// be applied, and the map stays within its bound.
func TestPropIndexWithinMap(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		idx := newFakeIndex()
		const bound = 12
		tr := NewTranslator(podResolver(idx, func(tg *Target) { tg.MaxBlocks = bound; tg.BlockSize = 2 }), Limits{})
		var seq uint64
		next := uint64(100)
		var live []uint64 // engine hashes the stream has stored
		for range rapid.IntRange(1, 60).Draw(rt, "messages") {
			var ev any
			switch rapid.IntRange(0, 5).Draw(rt, "kind") {
			case 0, 1, 2:
				n := rapid.IntRange(1, 4).Draw(rt, "blocks")
				var parent any
				if len(live) > 0 && rapid.Bool().Draw(rt, "child") {
					parent = rapid.SampledFrom(live).Draw(rt, "parent")
				}
				hs := make([]uint64, n)
				for i := range hs {
					hs[i] = next
					next++
				}
				live = append(live, hs...)
				ev = stored{hashes: hs, parent: parent, tokens: seqTokens(uint32(rapid.IntRange(0, 3).Draw(rt, "tok")), 2*n), bs: 2}.array()
			case 3:
				if len(live) == 0 {
					continue
				}
				ev = removedArray(nil, rapid.SampledFrom(live).Draw(rt, "removed"))
			case 4:
				ev = clearedArray()
			case 5:
				ev = []any{"BlockRemoved", "garbage"}
			}
			seq += uint64(rapid.SampledFrom([]int{1, 1, 1, 2, 0}).Draw(rt, "step"))
			tr.Handle("e", frames(topicA, seq, pack(rt, arrayBatch(ev))))

			tr.mu.Lock()
			e := tr.engines["10.0.0.1:8000"]
			tr.mu.Unlock()
			mapped := map[uint64]bool{}
			for _, k := range e.blocks {
				mapped[k] = true
			}
			if len(e.blocks) > bound {
				rt.Fatalf("map holds %d blocks, bound %d", len(e.blocks), bound)
			}
			for _, k := range idx.keys("10.0.0.1:8000") {
				if !mapped[k] {
					rt.Fatalf("index holds key %x the map does not", k)
				}
			}
		}
	})
}

// TestTranslateEngineBound: made-up topics get no state and cannot crowd
// out engines; resolvable engines are bounded too.
func TestTranslateEngineBound(t *testing.T) {
	idx := newFakeIndex()
	tr := NewTranslator(podResolver(idx, nil), Limits{})
	tr.maxEngines = 2
	ev := pack(t, arrayBatch(clearedArray()))
	for i := range 5000 {
		tr.Handle("e", frames(fmt.Sprintf("junk-%d", i), 1, ev))
	}
	for _, topic := range []string{topicA, topicB, "kv@10.0.0.3:8000@m"} {
		tr.Handle("e", frames(topic, 1, ev))
	}
	st, glob := tr.Stats()
	require.Len(t, st, 2)
	require.Equal(t, uint64(5001), glob.Unresolved)
	require.Contains(t, glob.LastError, "over 2 engines")
}

// TestTranslateConcurrent: engines fed from several goroutines at once,
// with Stats and Reset beside them (run with -race).
func TestTranslateConcurrent(t *testing.T) {
	idx := newFakeIndex()
	tr := NewTranslator(podResolver(idx, nil), Limits{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			topic := fmt.Sprintf("kv@pod-%d@m", g)
			for i := range 200 {
				ev := stored{hashes: []uint64{uint64(i + 1)}, tokens: seqTokens(uint32(i), 16), bs: 16}
				if i > 0 {
					ev.parent = uint64(i)
				}
				tr.Handle("e", frames(topic, uint64(i+1), pack(t, arrayBatch(ev.array()))))
			}
		}()
	}
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Add(1)
	go func() {
		defer bg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				tr.Stats()
				tr.Reset(func(s Source, _ Target) bool { return s.Pod == "pod-3" })
			}
		}
	}()
	wg.Wait()
	close(stop)
	bg.Wait()
	st, _ := tr.Stats()
	require.Len(t, st, 4)
	for _, s := range st {
		require.Equal(t, uint64(200), s.Messages)
	}
	for g := range 3 {
		require.Len(t, idx.keys(fmt.Sprintf("pod-%d", g)), 200)
	}
}

// TestTranslateOverflowOneEvent: an event of more blocks than the engine's
// MaxBlocks clears it and stores none of them. Before, the engine was
// cleared and then all the event's blocks were mapped, past the bound
// (up to Limits.MaxBlocks per event whatever Target.MaxBlocks).
func TestTranslateOverflowOneEvent(t *testing.T) {
	idx := newFakeIndex()
	tr := NewTranslator(podResolver(idx, func(tg *Target) { tg.MaxBlocks = 4 }), Limits{})
	f := newFeeder(t, tr)
	f.send(topicA, arrayBatch(storedRun(1, 2)))
	f.send(topicA, arrayBatch(storedRun(100, 6)))
	st := statsOf(t, tr, topicA)
	require.LessOrEqual(t, st.Mapped, 4, "the engine's map past its MaxBlocks")
	require.LessOrEqual(t, len(idx.keys("10.0.0.1:8000")), 4)
	require.Equal(t, uint64(1), st.Overflows)
}

// TestTranslateTargetWithoutModel: a source whose Target names no Model
// and whose topic names none (plain vLLM's empty topic) is refused and
// counted as unresolved, its error naming the field: its blocks would
// chain from the root of the empty name, which no request's key does, so
// the index would hold them matching nothing (found in review: they were
// applied, silently useless).
func TestTranslateTargetWithoutModel(t *testing.T) {
	idx := newFakeIndex()
	tr := NewTranslator(func(Source) (Target, error) { return Target{Index: idx, Replica: "r"}, nil }, Limits{})
	payload := pack(t, arrayBatch(stored{hashes: []uint64{1}, tokens: seqTokens(1, 16), bs: 16}.array()))
	tr.Handle("tcp://engine:5557", frames("", 1, payload))
	engines, glob := tr.Stats()
	require.Empty(t, idx.keys("r"), "no block keyed from the empty model name")
	require.Empty(t, engines)
	require.EqualValues(t, 1, glob.Unresolved)
	require.Contains(t, glob.LastError, "no Model")

	tr = NewTranslator(func(Source) (Target, error) { return Target{Index: idx, Replica: "r", Model: "m"}, nil }, Limits{})
	tr.Handle("tcp://engine:5557", frames("", 1, payload))
	require.Equal(t, sortedKey(mustKey(t, "m", seqTokens(1, 16))), idx.keys("r"), "a Target's Model names the root")
}

// TestTranslateRemoveWhileResolving: a message of a new source of an
// engine that Remove drops while the message waits for the engine's lock
// (its state found, not yet locked) goes to a new engine of the replica,
// one the Translator tracks: before, it revived the removed engine
// outside the Translator's engines, where neither Stats, Reset, Remove nor
// the MaxMapped bound reached it, so Reset left its blocks in the index
// for good (found in review).
func TestTranslateRemoveWhileResolving(t *testing.T) {
	idx := newFakeIndex()
	tr := NewTranslator(func(Source) (Target, error) { return Target{Index: idx, Replica: "r", Model: "m"}, nil }, Limits{})
	tr.Handle("ep", frames("t1", 1, pack(t, arrayBatch(stored{hashes: []uint64{1}, tokens: seqTokens(1, 16), bs: 16}.array()))))
	e := tr.engines["r"]
	require.NotNil(t, e)

	e.mu.Lock() // as Remove holds it: the next message of a new source waits for it
	done := make(chan struct{})
	go func() {
		defer close(done)
		tr.Handle("ep", frames("t2", 1, pack(t, arrayBatch(stored{hashes: []uint64{2}, tokens: seqTokens(100, 16), bs: 16}.array()))))
	}()
	waitLocked(t, "(*Translator).engine")
	tr.remove(e, "r") // Remove's work, done while the message waits
	e.unlock()
	<-done

	require.NotEmpty(t, idx.keys("r"), "the message was applied")
	engines, _ := tr.Stats()
	require.Len(t, engines, 1, "the engine that applied it is tracked")
	require.Equal(t, 1, tr.Reset(nil))
	require.Empty(t, idx.keys("r"), "Reset clears what it applied")
}

// waitLocked waits until a goroutine blocks on a mutex inside fn.
func waitLocked(t *testing.T, fn string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(30 * time.Second); ; runtime.Gosched() {
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "sync.(*Mutex).Lock") && strings.Contains(g, fn) {
				return
			}
		}
		require.False(t, time.Now().After(deadline), "no goroutine blocked in %s", fn)
	}
}

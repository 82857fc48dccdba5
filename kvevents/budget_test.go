package kvevents

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// storedRun is a BlockStored event of n blocks, hashes from first on,
// starting a chain.
func storedRun(first uint64, n int) any {
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = first + uint64(i)
	}
	return stored{hashes: hs, tokens: seqTokens(uint32(first), 16*n), bs: 16}.array()
}

// engineAt returns the Translator's state of the engine whose replica is
// pod.
func engineAt(tr *Translator, pod string) *engine {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.engines[pod]
}

// TestTranslateMappedTotal: all engines' maps share Limits.MaxMapped.
// Past it the engine holding the most, counting the newcomer's blocks, is
// cleared: another engine when it holds more, else the one storing.
func TestTranslateMappedTotal(t *testing.T) {
	const podA, podB = "10.0.0.1:8000", "10.0.0.2:8000"
	t.Run("the largest other engine is cleared", func(t *testing.T) {
		idx := newFakeIndex()
		tr := NewTranslator(podResolver(idx, nil), Limits{MaxMapped: 100})
		f := newFeeder(t, tr)
		f.send(topicA, arrayBatch(storedRun(1, 80)))
		f.send(topicB, arrayBatch(storedRun(1000, 20)))
		_, glob := tr.Stats()
		require.Equal(t, int64(100), glob.Mapped, "at the bound, nothing cleared")
		f.send(topicB, arrayBatch(storedRun(2000, 10)))
		a, b := statsOf(t, tr, topicA), statsOf(t, tr, topicB)
		require.Equal(t, uint64(1), a.BudgetClears)
		require.Equal(t, uint64(1), a.Clears)
		require.Zero(t, a.Mapped)
		require.Empty(t, idx.keys(podA), "its blocks left the index")
		require.Zero(t, b.BudgetClears)
		require.Equal(t, 30, b.Mapped)
		require.Len(t, idx.keys(podB), 30)
		_, glob = tr.Stats()
		require.Equal(t, int64(30), glob.Mapped)
		require.Equal(t, int64(100), glob.MaxMapped)
	})
	t.Run("the engine storing, when it would hold the most", func(t *testing.T) {
		idx := newFakeIndex()
		tr := NewTranslator(podResolver(idx, nil), Limits{MaxMapped: 100})
		f := newFeeder(t, tr)
		f.send(topicB, arrayBatch(storedRun(1000, 40)))
		f.send(topicA, arrayBatch(storedRun(1, 50)))
		f.send(topicA, arrayBatch(storedRun(100, 20))) // A would hold 70 of 110
		a, b := statsOf(t, tr, topicA), statsOf(t, tr, topicB)
		require.Equal(t, uint64(1), a.BudgetClears)
		require.Equal(t, 20, a.Mapped, "cleared, then its event stored")
		require.Zero(t, b.BudgetClears)
		require.Equal(t, 40, b.Mapped)
		_, glob := tr.Stats()
		require.Equal(t, int64(60), glob.Mapped)
	})
	t.Run("a busy engine clears itself after its message", func(t *testing.T) {
		idx := newFakeIndex()
		tr := NewTranslator(podResolver(idx, nil), Limits{MaxMapped: 100})
		f := newFeeder(t, tr)
		f.send(topicA, arrayBatch(storedRun(1, 80)))
		f.send(topicB, arrayBatch(storedRun(1000, 20)))
		a := engineAt(tr, podA)
		a.mu.Lock() // A is handling a message
		f.send(topicB, arrayBatch(storedRun(2000, 10)))
		require.True(t, a.shed.Load())
		require.Len(t, a.blocks, 80, "not cleared under its lock")
		a.mu.Unlock()
		f.send(topicA, arrayBatch(removedArray(nil, 1)))
		st := statsOf(t, tr, topicA)
		require.Equal(t, uint64(1), st.BudgetClears)
		require.Zero(t, st.Mapped)
		require.Empty(t, idx.keys(podA))
		_, glob := tr.Stats()
		require.Equal(t, int64(30), glob.Mapped)
	})
}

// TestPropMappedTotal: whatever engines store, remove, clear or skip, the
// Translator's count is the sum of the engines' maps, within MaxMapped
// (no engine is busy here), every engine's index
// holds only what its map does, and an engine is cleared for the total
// only when it held the most.
func TestPropMappedTotal(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		idx := newFakeIndex()
		limit := rapid.IntRange(1, 40).Draw(rt, "limit")
		tr := NewTranslator(podResolver(idx, func(tg *Target) { tg.MaxBlocks = 30; tg.BlockSize = 2 }), Limits{MaxMapped: limit})
		const engines, maxEvent = 3, 6
		seq := make([]uint64, engines)
		next := uint64(100)
		live := make([][]uint64, engines)
		for range rapid.IntRange(1, 80).Draw(rt, "messages") {
			i := rapid.IntRange(0, engines-1).Draw(rt, "engine")
			topic := fmt.Sprintf("kv@10.0.0.%d:8000@m", i+1)
			var ev any
			last := 0
			switch rapid.IntRange(0, 5).Draw(rt, "kind") {
			case 0, 1, 2:
				n := rapid.IntRange(1, maxEvent).Draw(rt, "blocks")
				var parent any
				if len(live[i]) > 0 && rapid.Bool().Draw(rt, "child") {
					parent = rapid.SampledFrom(live[i]).Draw(rt, "parent")
				}
				hs := make([]uint64, n)
				for j := range hs {
					hs[j] = next
					next++
				}
				live[i] = append(live[i], hs...)
				last = n
				ev = stored{hashes: hs, parent: parent, tokens: seqTokens(uint32(rapid.IntRange(0, 3).Draw(rt, "tok")), 2*n), bs: 2}.array()
			case 3:
				if len(live[i]) == 0 {
					continue
				}
				ev = removedArray(nil, rapid.SampledFrom(live[i]).Draw(rt, "removed"))
			case 4:
				ev = clearedArray()
			case 5:
				ev = []any{"BlockRemoved", "garbage"}
			}
			seq[i] += uint64(rapid.SampledFrom([]int{1, 1, 1, 1, 2}).Draw(rt, "step"))
			before := map[string]int{}
			for _, e := range tr.all() {
				before[e.tgt.Replica] = len(e.blocks)
			}
			clears := map[string]uint64{}
			st0, _ := tr.Stats()
			for _, s := range st0 {
				clears[s.Replica] = s.BudgetClears
			}
			tr.Handle("e", frames(topic, seq[i], pack(rt, arrayBatch(ev))))

			sum := 0
			st, glob := tr.Stats()
			for _, s := range st {
				sum += s.Mapped
				mapped := map[uint64]bool{}
				e := engineAt(tr, s.Replica)
				for _, k := range e.blocks {
					mapped[k] = true
				}
				for _, k := range idx.keys(s.Replica) {
					if !mapped[k] {
						rt.Fatalf("index of %s holds key %x its map does not", s.Replica, k)
					}
				}
				if s.BudgetClears > clears[s.Replica] {
					for r, n := range before {
						if n > before[s.Replica]+last && r != s.Replica {
							rt.Fatalf("%s (%d blocks) cleared for the total while %s held %d", s.Replica, before[s.Replica], r, n)
						}
					}
				}
			}
			if int64(sum) != glob.Mapped {
				rt.Fatalf("count %d, maps hold %d", glob.Mapped, sum)
			}
			if sum > limit {
				rt.Fatalf("maps hold %d, bound %d", sum, limit)
			}
		}
	})
}

// TestMappedTotalConcurrent: engines storing at once under a small
// MaxMapped (run with -race): the count stays the sum of the maps, every
// index holds only what its map does, and once every engine has handled
// a message after the others, the total is within the bound.
func TestMappedTotalConcurrent(t *testing.T) {
	idx := newFakeIndex()
	const limit = 100
	tr := NewTranslator(podResolver(idx, nil), Limits{MaxMapped: limit})
	var wg sync.WaitGroup
	const engines = 4
	for g := range engines {
		wg.Go(func() {
			topic := fmt.Sprintf("kv@pod-%d@m", g)
			for i := range 300 {
				tr.Handle("e", frames(topic, uint64(i+1), pack(t, arrayBatch(storedRun(uint64(g*100000+i*10), 1+i%7)))))
			}
		})
	}
	wg.Wait()
	// A last message from each engine, one at a time, settles any clear
	// left pending by an engine that was busy.
	for g := range engines {
		tr.Handle("e", frames(fmt.Sprintf("kv@pod-%d@m", g), 301, pack(t, arrayBatch(removedArray(nil, 1)))))
	}
	st, glob := tr.Stats()
	sum := 0
	clears := uint64(0)
	for _, s := range st {
		sum += s.Mapped
		clears += s.BudgetClears
		require.LessOrEqual(t, len(idx.keys(s.Replica)), s.Mapped, s.Replica)
	}
	require.Equal(t, int64(sum), glob.Mapped)
	require.LessOrEqual(t, sum, limit)
	require.NotZero(t, clears, "the bound was reached")
}

package kvevents

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// An event that overflows its engine's own MaxBlocks clears the engine,
// and its blocks still need room in MaxMapped (found in review: they were
// stored without it, the total past the bound in sequential use).
func TestMappedTotalReviewOverflowSkipsMakeRoom(t *testing.T) {
	idx := newFakeIndex()
	tr := NewTranslator(podResolver(idx, func(tg *Target) {
		if tg.Replica == "10.0.0.2:8000" {
			tg.MaxBlocks = 4
		}
	}), Limits{MaxMapped: 10})
	f := newFeeder(t, tr)
	f.send(topicA, arrayBatch(storedRun(1, 9)))
	f.send(topicB, arrayBatch(storedRun(1000, 1))) // 10 of 10
	f.send(topicB, arrayBatch(storedRun(2000, 4))) // B: 1+4 > 4 -> overflow clear, then 4 stored
	_, glob := tr.Stats()
	require.LessOrEqual(t, glob.Mapped, glob.MaxMapped, "sequential use, no engine busy")
}

// An orphan event, which stores nothing, clears no engine for room
// (found in review: room was made before the parent was looked up).
func TestMappedTotalReviewOrphanClearsOthers(t *testing.T) {
	idx := newFakeIndex()
	tr := NewTranslator(podResolver(idx, nil), Limits{MaxMapped: 10})
	f := newFeeder(t, tr)
	f.send(topicA, arrayBatch(storedRun(1, 8)))
	orphan := stored{hashes: []uint64{500, 501, 502, 503}, parent: uint64(999), tokens: seqTokens(5, 64), bs: 16}.array()
	f.send(topicB, arrayBatch(orphan))
	a, b := statsOf(t, tr, topicA), statsOf(t, tr, topicB)
	require.Equal(t, uint64(1), b.DroppedOrphan, "B's event stored nothing")
	require.Zero(t, a.BudgetClears, "A cleared for room nobody used")
}

// The blocks of an engine asked to shed count as gone for the next
// event's room (found in review: a later store cleared an honest engine
// that the pending shed made room for).
func TestMappedTotalReviewShedCascade(t *testing.T) {
	const podA = "10.0.0.1:8000"
	const topicC = "kv@10.0.0.3:8000@m"
	idx := newFakeIndex()
	tr := NewTranslator(podResolver(idx, nil), Limits{MaxMapped: 10})
	f := newFeeder(t, tr)
	f.send(topicA, arrayBatch(storedRun(1, 6)))
	f.send(topicB, arrayBatch(storedRun(1000, 3)))
	f.send(topicC, arrayBatch(storedRun(3000, 1)))
	a := engineAt(tr, podA)
	a.mu.Lock()                                    // A busy with a message
	f.send(topicB, arrayBatch(storedRun(2000, 2))) // A shed, B stores: 12
	require.True(t, a.shed.Load())
	f.send(topicC, arrayBatch(storedRun(4000, 1))) // room once A sheds: 6+1 <= 10
	a.mu.Unlock()
	b := statsOf(t, tr, topicB)
	require.Zero(t, b.BudgetClears, "B cleared although A's pending shed frees 6")
}

// A request to shed made while Replay (or Stats, or a refused source)
// holds the engine is honoured when it lets the engine go, not at the
// engine's next message, which may never come (found in review).
func TestMappedTotalReviewShedNeverHonoured(t *testing.T) {
	const podA = "10.0.0.1:8000"
	idx := newFakeIndex()
	tr := NewTranslator(podResolver(idx, nil), Limits{MaxMapped: 10})
	f := newFeeder(t, tr)
	f.send(topicA, arrayBatch(storedRun(1, 8)))
	f.send(topicB, arrayBatch(storedRun(1000, 2)))
	in, out := make(chan struct{}), make(chan struct{})
	go tr.Replay(func(s Source, _ Target) bool { return s.Topic == topicA }, func(Source, Target, []uint64) {
		close(in)
		<-out
	})
	<-in
	f.send(topicB, arrayBatch(storedRun(2000, 1))) // A busy in Replay -> shed
	close(out)
	a := engineAt(tr, podA)
	require.Eventually(t, func() bool {
		if !a.mu.TryLock() {
			return false
		}
		a.mu.Unlock()
		return true
	}, 1e9, 1e6)
	_, glob := tr.Stats()
	t.Logf("after Replay: mapped %d of %d, A shed=%v", glob.Mapped, glob.MaxMapped, a.shed.Load())
	f.send(topicB, arrayBatch(storedRun(3000, 1)))
	b := statsOf(t, tr, topicB)
	sa := statsOf(t, tr, topicA)
	t.Logf("A mapped %d clears %d; B mapped %d budget clears %d", sa.Mapped, sa.BudgetClears, b.Mapped, b.BudgetClears)
	require.Zero(t, b.BudgetClears, "B (would hold 4) cleared while A holds 8")
}

// R5: a request to shed that the total no longer needs when the engine
// is released clears nothing (found in review: a stale flag cleared the
// engine at its next message).
func TestMappedTotalReviewStaleShed(t *testing.T) {
	const podA = "10.0.0.1:8000"
	idx := newFakeIndex()
	tr := NewTranslator(podResolver(idx, nil), Limits{MaxMapped: 10})
	f := newFeeder(t, tr)
	f.send(topicA, arrayBatch(storedRun(1, 8)))
	f.send(topicB, arrayBatch(storedRun(1000, 2)))
	a := engineAt(tr, podA)
	a.mu.Lock() // e.g. Stats or Replay holds A
	f.send(topicB, arrayBatch(storedRun(2000, 1)))
	require.True(t, a.shed.Load(), "A asked to shed")
	f.send(topicB, arrayBatch(removedArray(nil, 1000, 1001))) // B: 1, total 9 of 10
	a.unlock()
	require.False(t, a.shed.Load())
	require.Zero(t, statsOf(t, tr, topicA).BudgetClears, "cleared with the total at 9 of 10")
	require.Equal(t, 8, statsOf(t, tr, topicA).Mapped)
}

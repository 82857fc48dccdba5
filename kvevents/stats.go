package kvevents

import (
	"cmp"
	"slices"
)

// EngineStats are one engine's counters, for /metrics. Counters only
// grow, across Reset too.
type EngineStats struct {
	// Source is the engine; Replica the replica its events go to (empty
	// while unresolved).
	Source  Source
	Replica string

	// Messages counts messages received; MalformedMessages those whose
	// payload was unreadable as a whole.
	Messages, MalformedMessages uint64
	// Events counts events received, Applied those applied to the index,
	// Dropped the others, broken down below.
	Events, Applied, Dropped uint64
	// Why events were dropped: malformed; of an unknown type; over a
	// limit; not indexed: about another medium than the GPU or a
	// non-full-attention KV-cache group (a removal from one too), or a
	// LoRA adapter named by lora_id alone; of another block size than the replica's requests;
	// stored under a parent we do not know (orphans); refused by the index.
	DroppedMalformed, DroppedUnknown, DroppedLimit, DroppedMedium,
	DroppedBlockSize, DroppedOrphan, DroppedApply uint64
	// StoredBlocks and RemovedBlocks count the blocks applied.
	StoredBlocks, RemovedBlocks uint64
	// Gaps counts sequence numbers skipped, Restarts sequence numbers
	// going back (an engine restart); Overflows times the engine's map
	// reached its bound. Clears counts the times the engine's blocks were
	// cleared from the index for any of these reasons or an unreadable
	// message (not counting the engine's own AllBlocksCleared).
	Gaps, Restarts, Overflows, Clears uint64
	// BudgetClears counts the times the engine was cleared because the
	// maps of all engines together reached Limits.MaxMapped while it held
	// the most (part of Clears).
	BudgetClears uint64
	// Skipped counts messages not applied because they showed a gap or a
	// restart: nothing vouches for a batch that does not follow the last.
	Skipped uint64
	// Rejected counts messages refused because their source named the
	// engine with another model or block size than it is heard with, or
	// because the engine was already heard under MaxTopicsPerEngine
	// sources.
	Rejected uint64
	// ReplayAttempts counts the gaps the engine's replay endpoint was
	// asked to fill (Target.Replay, Translator.SetReplay); of them,
	// ReplaySucceeded those it filled, its batches then applied before
	// the message that showed the gap, and ReplayFailed those it could
	// not (its buffer no longer held them, timeout, a fault, a gap too
	// large), which cleared the engine as a gap does without replay.
	// ReplayedBatches counts the batches recovered.
	ReplayAttempts, ReplaySucceeded, ReplayFailed, ReplayedBatches uint64
	// Resets counts the Translator.Reset calls that cleared the engine.
	Resets uint64
	// Mapped is the number of engine block hashes currently mapped.
	Mapped int
	// LastError describes the last fault, if any.
	LastError string
}

// GlobalStats count messages no engine can be charged with.
type GlobalStats struct {
	// MalformedFrames counts messages without the three frames (topic,
	// 8-byte sequence number, payload).
	MalformedFrames uint64
	// Unresolved counts messages whose source the Resolver refused.
	Unresolved uint64
	// Mapped is the number of engine block hashes all engines' maps
	// hold; MaxMapped its bound (Limits.MaxMapped).
	Mapped, MaxMapped int64
	// LastError describes the last of these faults.
	LastError string
}

// Stats returns every engine's counters, ordered by the endpoint and topic
// it was first heard under (Source),
// and the counters of messages no engine is charged with.
func (t *Translator) Stats() ([]EngineStats, GlobalStats) {
	t.mu.Lock()
	glob := t.glob
	t.mu.Unlock()
	glob.Mapped, glob.MaxMapped = t.mapped.Load(), int64(t.lim.MaxMapped)
	all := t.all()
	out := make([]EngineStats, 0, len(all))
	for _, e := range all {
		e.mu.Lock()
		s := e.st
		s.Source = e.src
		if e.resolved {
			s.Replica = e.tgt.Replica
		}
		s.Mapped = len(e.blocks)
		e.unlock()
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b EngineStats) int {
		return cmp.Or(cmp.Compare(a.Source.Endpoint, b.Source.Endpoint), cmp.Compare(a.Source.Topic, b.Source.Topic))
	})
	return out, glob
}

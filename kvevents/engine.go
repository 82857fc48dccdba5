package kvevents

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/keys"
)

// One engine's state and the application of its events.

// engine is one source's state, guarded by mu.
type engine struct {
	mu       sync.Mutex
	src      Source
	tgt      Target
	resolved bool
	root     uint64 // Root of the model name
	bs       int
	max      int

	seen bool
	last uint64
	// lastSum is the XXH64 of message last's payload, kept while the
	// engine has a Replay endpoint: a replay starts with that batch, to
	// tell a gap from a restart (replayGap).
	lastSum uint64
	blocks  map[uint64]uint64 // engine hash → our key
	// unindexed has bit g set while KV-cache group g (below 64) is known,
	// from its last BlockStored naming its kind, not to be indexed (a
	// sliding-window or Mamba group): its removals do not concern the
	// blocks mapped, which another group holds under the same hashes.
	unindexed uint64
	keys      gateway.Key // scratch
	gone      gateway.Key // scratch: keys a stored event's hashes named before
	dec       *Decoder

	applyFn func(*Event, error)
	st      EngineStats
	topics  int // sources resolved to the engine; guarded by Translator.mu

	tr *Translator
	// counted is len(blocks) as last added to Translator.mapped; read
	// without mu by the other engines (makeRoom).
	counted atomic.Int64
	// shed asks the engine to clear itself at the end of the message it
	// is handling: another engine needed room in MaxMapped while this one
	// held the most and was busy (makeRoom).
	shed atomic.Bool
}

// account brings the Translator's count of mapped blocks up to date with
// the engine's map; called after every change of it, with mu held.
func (e *engine) account() {
	n := int64(len(e.blocks))
	if d := n - e.counted.Swap(n); d != 0 {
		e.tr.mapped.Add(d)
	}
}

// budgetClear clears the engine for the room another engine (or itself)
// needs in MaxMapped; with mu held.
func (e *engine) budgetClear() {
	if !e.resolved || len(e.blocks) == 0 {
		return
	}
	e.st.BudgetClears++
	e.clear(true)
}

// unlock releases mu, first clearing the engine if another engine asked
// it to shed while mu was held (makeRoom) and the total is still past
// MaxMapped. A request that comes between the check and the release is
// honoured by taking mu again if it is free; else its holder honours it
// when it releases mu.
func (e *engine) unlock() {
	for {
		if e.shed.Swap(false) && e.tr.mapped.Load() > int64(e.tr.lim.MaxMapped) {
			e.budgetClear()
		}
		e.mu.Unlock()
		if !e.shed.Load() || !e.mu.TryLock() {
			return
		}
	}
}

// same reports whether a source resolved to tgt may share the resolved
// engine's state: its events chain from the same root in blocks of the
// same size.
func (e *engine) same(src Source, tgt Target) bool {
	model := tgt.Model
	if model == "" {
		model = src.Model
	}
	bs := tgt.BlockSize
	if bs == 0 {
		bs = DefaultBlockSize
	}
	return model == e.tgt.Model && bs == e.bs
}

// refuse counts a message refused from a source of the engine.
func (e *engine) refuse(why string) {
	e.st.Rejected++
	e.st.LastError = why
}

func (e *engine) bind(tgt Target) {
	e.tgt, e.resolved = tgt, true
	if tgt.Model == "" {
		e.tgt.Model = e.src.Model
	}
	e.root = keys.ExactRoot(e.tgt.Model)
	e.bs = tgt.BlockSize
	if e.bs == 0 {
		e.bs = DefaultBlockSize
	}
	e.max = tgt.MaxBlocks
	if e.max == 0 {
		e.max = DefaultMaxMapped
	}
	e.blocks = map[uint64]uint64{}
	e.unindexed = 0
	e.account()
}

func (e *engine) handle(t *Translator, seq uint64, payload []byte) {
	e.st.Messages++
	if e.seen && seq != e.last+1 {
		if seq <= e.last {
			e.st.Restarts++
		} else {
			e.st.Gaps++
		}
	}
	if e.seen && seq > e.last && seq-e.last > 1 && e.replayGap(t, seq) { // not last+1: it wraps
		if !e.resolved { // the replica went away during the replay
			return
		}
	} else if e.seen && seq != e.last+1 {
		// The batch cannot be verified: neither applied nor trusted to
		// follow anything; the engine starts over from the next message.
		e.clear(true)
		e.last = seq
		e.sum(t, payload)
		e.st.Skipped++
		return
	}
	e.seen, e.last = true, seq
	e.sum(t, payload)
	if err := e.dec.Decode(payload, e.applyFn); err != nil {
		e.st.MalformedMessages++
		e.st.LastError = err.Error()
		e.clear(true) // events after the fault are lost
	}
}

// sum keeps the XXH64 of the payload of message e.last, when a replay
// may need it.
func (e *engine) sum(t *Translator, payload []byte) {
	if e.tgt.Replay != "" && t.replayOf() != nil {
		e.lastSum = xxhash.Sum64(payload)
	}
}

// replayGap asks the engine's replay endpoint for the batches between the
// last applied and seq, and applies them in order. It returns false,
// having applied nothing, when the engine has no replay endpoint, replay
// is off, or the endpoint could not give exactly the missing batches in
// time (counted ReplayFailed); the caller then clears the engine. The
// endpoint must first give again the last batch heard, unchanged: an
// engine that restarted numbers its batches from 0 again, and the first
// heard of its new life may be past the last of the old one, which looks
// like a gap; its replay is then of the new life, whose cache does not
// hold the old one's blocks.
func (e *engine) replayGap(t *Translator, seq uint64) bool {
	r := t.replayOf()
	if r == nil || e.tgt.Replay == "" {
		return false
	}
	e.st.ReplayAttempts++
	got, err := r.fetch(e.tgt.Replay, e.tgt.ReplayFrom, e.last+1, seq-1, e.lastSum)
	if err != nil {
		e.st.ReplayFailed++
		e.st.LastError = err.Error()
		return false
	}
	e.st.ReplaySucceeded++
	for _, b := range got {
		if !e.resolved {
			return true
		}
		e.last = b.seq
		e.sum(t, b.payload)
		e.st.ReplayedBatches++
		if err := e.dec.Decode(b.payload, e.applyFn); err != nil {
			// As for a live message: events after the fault are lost.
			e.st.MalformedMessages++
			e.st.LastError = err.Error()
			e.clear(true)
		}
	}
	return true
}

// clear drops the engine's blocks from its index and its map; counted
// when counted is true.
func (e *engine) clear(counted bool) {
	if !e.resolved {
		return
	}
	if counted {
		e.st.Clears++
	}
	if len(e.blocks) > 0 {
		e.blocks = map[uint64]uint64{} // not clear(): give back a grown map's memory
		e.account()
	}
	if err := e.tgt.Index.ApplyEvent(e.tgt.Replica, gateway.CacheEvent{Kind: gateway.AllCleared}); err != nil {
		e.applyFailed(err)
	}
}

func (e *engine) applyFailed(err error) {
	e.st.LastError = err.Error()
	if errors.Is(err, gateway.ErrUnknownReplica) {
		// The replica is gone, and its blocks with it: resolve afresh.
		e.resolved, e.seen = false, false
		e.blocks = nil
		e.account()
	}
}

func (e *engine) drop(r *uint64, err error) {
	e.st.Dropped++
	*r++
	if err != nil {
		e.st.LastError = err.Error()
	}
}

var gpu = []byte("GPU")

// onGPU reports whether blocks of this medium are the engine's prefix
// cache proper: vLLM's GPU tier, or unspecified. Blocks offloaded to CPU
// or disk (vLLM's offloading connector) are not indexed.
func onGPU(medium []byte) bool { return len(medium) == 0 || bytes.EqualFold(medium, gpu) }

// fullAttention reports whether a KV-cache group of this kind holds
// blocks a prompt prefix can reuse: unspecified, full, MLA or sink full
// attention (vLLM's vllm/v1/kv_cache_interface.py get_kv_cache_spec_kind,
// read in copies of recent vLLM rather than at a pinned commit:
// SinkFullAttentionSpec is a FullAttentionSpec, cached by a subclass of
// FullAttentionManager). Sliding-window
// and other groups of hybrid models are not indexed.
func fullAttention(kind []byte) bool {
	switch string(kind) {
	case "", "full_attention", "mla_attention", "sink_full_attention":
		return true
	}
	return false
}

func (e *engine) apply(ev *Event, err error) {
	if !e.resolved { // the replica went away during this batch
		return
	}
	e.st.Events++
	if err != nil {
		switch {
		case errors.Is(err, ErrUnknownEvent):
			// A kind of event we do not know (newer vLLM): not ours to apply.
			e.drop(&e.st.DroppedUnknown, err)
			return
		case errors.Is(err, ErrLimit):
			e.drop(&e.st.DroppedLimit, err)
		default:
			e.drop(&e.st.DroppedMalformed, err)
		}
		if ev.Kind != BlockStored {
			// A removal or a clear we cannot read, or an event we cannot
			// tell: the index may now hold blocks the engine dropped.
			e.clear(true)
		}
		return
	}
	switch ev.Kind {
	case BlockStored:
		e.stored(ev)
	case BlockRemoved:
		if !onGPU(ev.Medium) || e.unindexedGroup(ev) {
			e.drop(&e.st.DroppedMedium, nil)
			return
		}
		ks := e.keys[:0]
		for _, h := range ev.Hashes {
			if k, ok := e.blocks[h]; ok {
				delete(e.blocks, h)
				ks = append(ks, k)
			}
		}
		e.keys = ks
		e.account()
		if len(ks) > 0 {
			if err := e.tgt.Index.ApplyEvent(e.tgt.Replica, gateway.CacheEvent{Kind: gateway.BlocksRemoved, Blocks: ks}); err != nil {
				e.drop(&e.st.DroppedApply, err)
				e.applyFailed(err)
				return
			}
		}
		e.st.Applied++
		e.st.RemovedBlocks += uint64(len(ks))
	case AllBlocksCleared:
		e.clear(false)
		e.st.Applied++
	}
}

// unindexedGroup reports whether the event's KV-cache group is known not
// to be indexed. vLLM (block_pool.py, at vllm-project/vllm 0181ea3173e5)
// keys cached blocks by hash and group: a hybrid model stores a block in
// every group under one hash, and a sliding window removes it from its
// group while the full-attention group still holds it. A group not heard
// of, or no group (one group, older vLLM), may be the indexed one.
func (e *engine) unindexedGroup(ev *Event) bool {
	return ev.HasGroup && uint64(ev.Group) < 64 && e.unindexed&(1<<ev.Group) != 0
}

func (e *engine) stored(ev *Event) {
	if ev.HasGroup && uint64(ev.Group) < 64 && len(ev.SpecKind) > 0 {
		if fullAttention(ev.SpecKind) {
			e.unindexed &^= 1 << ev.Group
		} else {
			e.unindexed |= 1 << ev.Group
		}
	}
	switch {
	case !onGPU(ev.Medium):
		e.drop(&e.st.DroppedMedium, nil)
		return
	case !fullAttention(ev.SpecKind):
		e.drop(&e.st.DroppedMedium, nil)
		return
	case ev.LoRAID != 0 && len(ev.LoRA) == 0:
		// vLLM before lora_name hashed an adapter's blocks with its id:
		// keyed from the model's root they would match the base model's
		// requests, and requests name the adapter, not its id.
		e.drop(&e.st.DroppedMedium, fmt.Errorf("BlockStored of lora_id %d without lora_name: the adapter's blocks cannot be keyed as its requests are", ev.LoRAID))
		return
	case ev.BlockSize != e.bs:
		e.drop(&e.st.DroppedBlockSize, fmt.Errorf("%w: BlockStored block_size %d, the replica's requests are keyed in blocks of %d",
			ErrMalformed, ev.BlockSize, e.bs))
		return
	}
	n := ev.Plain
	if len(e.blocks)+n > e.max {
		e.st.Overflows++
		e.clear(true)
		if n > e.max {
			e.drop(&e.st.DroppedLimit, fmt.Errorf("%w: BlockStored of %d blocks, over the engine's bound of %d (Target.MaxBlocks)", ErrLimit, n, e.max))
			return
		}
	}
	if ev.HasParent {
		if _, ok := e.blocks[ev.Parent]; !ok {
			e.drop(&e.st.DroppedOrphan, nil)
			return
		}
	}
	if n > 0 && !e.tr.makeRoom(e, n) {
		e.drop(&e.st.DroppedLimit, fmt.Errorf("%w: %d blocks stored would take all engines' maps past %d blocks (Limits.MaxMapped)", ErrLimit, n, e.tr.lim.MaxMapped))
		return
	}
	parent := e.root
	if len(ev.LoRA) > 0 {
		parent = keys.ExactRootHash(xxhash.Sum64(ev.LoRA))
	}
	ks := e.keys[:0]
	if ev.HasParent {
		k, ok := e.blocks[ev.Parent]
		if !ok { // makeRoom cleared the engine itself
			e.drop(&e.st.DroppedOrphan, nil)
			return
		}
		// Storing the parent again refreshes it in the index's LRU order
		// ahead of its new children.
		parent = k
		ks = append(ks, k)
	}
	if n == 0 {
		e.st.Applied++
		return
	}
	off := len(ks)
	ks = keys.AppendChained(ks, parent, ev.Tokens[:n*e.bs], e.bs)
	e.keys = ks
	// A hash stored again under another key (an engine whose hashes are
	// not chained, as SGLang's hash(tuple(page_tokens)) was: one page at
	// two places) no longer names its old key, which must leave the index
	// with it, or no removal could ever reach it.
	gone := e.gone[:0]
	for i, h := range ev.Hashes[:n] {
		if old, ok := e.blocks[h]; ok && old != ks[off+i] {
			gone = append(gone, old)
		}
		e.blocks[h] = ks[off+i]
	}
	e.gone = gone
	e.account()
	if err := e.tgt.Index.ApplyEvent(e.tgt.Replica, gateway.CacheEvent{Kind: gateway.BlocksStored, Blocks: ks}); err != nil {
		e.drop(&e.st.DroppedApply, err)
		e.applyFailed(err)
		return
	}
	if len(gone) > 0 { // after the store: an old key may be one of ks
		if err := e.tgt.Index.ApplyEvent(e.tgt.Replica, gateway.CacheEvent{Kind: gateway.BlocksRemoved, Blocks: gone}); err != nil {
			e.drop(&e.st.DroppedApply, err)
			e.applyFailed(err)
			return
		}
	}
	e.st.Applied++
	e.st.StoredBlocks += uint64(n)
}

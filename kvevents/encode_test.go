package kvevents

import (
	"encoding/binary"

	"github.com/vmihailenco/msgpack/v5"
)

// Test encoders for both wire encodings, after llm-d-inference-sim v0.10.2
// pkg/kv-cache/kv_cache_sender.go (arrays by default, maps with
// --use-vllm-map-event-format) and vLLM's msgspec structs (maps, with the
// batch a map too since vLLM dropped array_like).

// stored describes a BlockStored event for the encoders.
type stored struct {
	hashes []uint64
	parent any // nil, uint64 or []byte
	tokens []uint32
	bs     int
	lora   any // nil or string
	medium any // nil or string
	extra  []any
	// loraID, group and kind (kv_cache_spec_kind) are sent when not nil.
	loraID, group, kind any
}

func (s stored) array() []any {
	hs := make([]any, len(s.hashes))
	for i, h := range s.hashes {
		hs[i] = h
	}
	ev := []any{"BlockStored", hs, s.parent, s.tokens, s.bs, s.loraID, s.medium, s.lora}
	if s.extra != nil || s.group != nil || s.kind != nil {
		ev = append(ev, s.extra)
	}
	if s.group != nil || s.kind != nil {
		ev = append(ev, s.group, s.kind)
	}
	return ev
}

func (s stored) mapped() map[string]any {
	hs := make([]any, len(s.hashes))
	for i, h := range s.hashes {
		hs[i] = h
	}
	m := map[string]any{"type": "BlockStored", "block_hashes": hs, "parent_block_hash": s.parent,
		"token_ids": s.tokens, "block_size": s.bs, "medium": s.medium}
	if s.lora != nil {
		m["lora_name"] = s.lora
	}
	if s.extra != nil {
		m["extra_keys"] = s.extra
	}
	for k, v := range map[string]any{"lora_id": s.loraID, "group_idx": s.group, "kv_cache_spec_kind": s.kind} {
		if v != nil {
			m[k] = v
		}
	}
	return m
}

func removedArray(medium any, hashes ...uint64) []any {
	hs := make([]any, len(hashes))
	for i, h := range hashes {
		hs[i] = h
	}
	return []any{"BlockRemoved", hs, medium}
}

func removedMap(medium any, hashes ...uint64) map[string]any {
	hs := make([]any, len(hashes))
	for i, h := range hashes {
		hs[i] = h
	}
	return map[string]any{"type": "BlockRemoved", "block_hashes": hs, "medium": medium}
}

// removedGroup is a BlockRemoved of KV-cache group group, on the GPU, as
// vLLM sends it for hybrid models (arrays, or maps when mapped).
func removedGroup(mapped bool, group int, hashes ...uint64) any {
	if mapped {
		m := removedMap("GPU", hashes...)
		m["group_idx"] = group
		return m
	}
	return append(removedArray("GPU", hashes...), group)
}

func clearedArray() []any            { return []any{"AllBlocksCleared"} }
func clearedMap() map[string]any     { return map[string]any{"type": "AllBlocksCleared"} }
func arrayBatch(events ...any) []any { return []any{1712345678.25, events, 0} }
func mapBatch(events ...any) map[string]any {
	return map[string]any{"ts": 1712345678.25, "events": events, "data_parallel_rank": 0}
}

// fataler is testing.TB or *rapid.T.
type fataler interface {
	Helper()
	Fatal(args ...any)
}

func pack(t fataler, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func frames(topic string, seq uint64, payload []byte) [][]byte {
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	return [][]byte{[]byte(topic), s[:], payload}
}

// seqTokens returns n tokens base, base+1, ...
func seqTokens(base uint32, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = base + uint32(i)
	}
	return t
}

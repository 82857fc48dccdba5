package kvevents

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Events as recent vLLM sends them: vllm/distributed/kv_events.py and
// vllm/v1/core/block_pool.py (BlockStored with group_idx and
// kv_cache_spec_kind, BlockRemoved with group_idx) and
// vllm/v1/core/kv_cache_utils.py (generate_block_hash_extra_keys: the LoRA
// adapter's name, then multimodal identifiers, the cache salt and prompt
// embeddings), read at vllm-project/vllm 0181ea3173e5.

const repA = "10.0.0.1:8000" // topicA's replica

// encodings runs fn with a batch and an event encoder of each encoding.
func encodings(t *testing.T, fn func(t *testing.T, mapped bool, batch func(...any) any, enc func(stored) any)) {
	for _, mapped := range []bool{false, true} {
		name := "arrays"
		if mapped {
			name = "maps"
		}
		t.Run(name, func(t *testing.T) {
			batch := func(evs ...any) any {
				if mapped {
					return mapBatch(evs...)
				}
				return arrayBatch(evs...)
			}
			enc := func(s stored) any {
				if mapped {
					return s.mapped()
				}
				return s.array()
			}
			fn(t, mapped, batch, enc)
		})
	}
}

// TestTranslateHybridGroups: a hybrid model stores each block in every
// KV-cache group under the same hash, and removes it from each group on
// its own (BlockRemoved's group_idx). Removing it from the sliding-window
// group leaves it cached in the full-attention group, which is the one
// indexed: the index keeps it until that group removes it.
func TestTranslateHybridGroups(t *testing.T) {
	encodings(t, func(t *testing.T, mapped bool, batch func(...any) any, enc func(stored) any) {
		idx := newFakeIndex()
		tr := NewTranslator(podResolver(idx, nil), Limits{})
		f := newFeeder(t, tr)
		prompt := seqTokens(1, 48)
		full := stored{hashes: []uint64{1, 2, 3}, tokens: prompt, bs: 16, medium: "GPU", group: 0, kind: "full_attention"}
		// vLLM skips a sliding-window group's null blocks: its hashes name
		// the window's last blocks, its token_ids the whole range.
		window := stored{hashes: []uint64{2, 3}, tokens: prompt, bs: 16, medium: "GPU", group: 1, kind: "sliding_window"}
		f.send(topicA, batch(enc(full), enc(window)))
		want := mustKey(t, "m", prompt)
		require.Equal(t, sortedKey(want), idx.keys(repA))
		st := statsOf(t, tr, topicA)
		require.Zero(t, st.DroppedMalformed, "a sliding-window group's event is well formed: %s", st.LastError)
		require.Equal(t, uint64(1), st.DroppedMedium, "the sliding-window group is not indexed")

		f.send(topicA, batch(removedGroup(mapped, 1, 2, 3)))
		require.Equal(t, sortedKey(want), idx.keys(repA), "blocks the window dropped are still in the full-attention group")
		require.Equal(t, 3, statsOf(t, tr, topicA).Mapped)

		f.send(topicA, batch(removedGroup(mapped, 0, 3)))
		require.Equal(t, sortedKey(want[:2]), idx.keys(repA), "the full-attention group's removal applies")
		f.send(topicA, batch(removedGroup(mapped, 7, 2)))
		require.Equal(t, sortedKey(want[:1]), idx.keys(repA), "a group never heard of may be the indexed one: the removal applies")
		odd := window
		odd.group, odd.hashes = -1, []uint64{9}
		f.send(topicA, batch(enc(odd), removedGroup(mapped, -1, 9), removedGroup(mapped, 1<<40, 9)))
		require.Equal(t, sortedKey(want[:1]), idx.keys(repA), "groups vLLM would not name are taken, as unknown")
		if mapped {
			f.send(topicA, batch(removedMap("GPU", 1)))
		} else {
			f.send(topicA, batch(removedArray("GPU", 1)))
		}
		require.Empty(t, idx.keys(repA), "a removal without group_idx applies")
	})
}

// TestDecodeLongUnknownKeys: a map key longer than any field known is an
// unknown field, skipped like any other, in an event and in the batch.
func TestDecodeLongUnknownKeys(t *testing.T) {
	long := strings.Repeat("future_field_", 8)
	ev := removedMap("GPU", 7)
	ev[long] = []any{1, 2}
	b := mapBatch(ev)
	b[long] = "x"
	evs, err := decodeAll(t, NewDecoder(Limits{}), pack(t, b))
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.NoError(t, evs[0].err)
	require.Equal(t, []uint64{7}, evs[0].hashes)
}

// TestTranslateHashReused: an engine whose hashes are not chained (SGLang's
// python/sglang/srt/mem_cache/radix_cache.py _record_store_event hashed
// each page as hash(tuple(page_tokens)) before its chained
// hash_str_to_int64(node.hash_value)) stores one hash for the same page at
// two places of two prompts. The index never keeps a key its
// engine's map no longer names, which no removal could reach: the key the
// hash named before leaves the index when the hash is stored anew under
// another.
func TestTranslateHashReused(t *testing.T) {
	encodings(t, func(t *testing.T, _ bool, batch func(...any) any, enc func(stored) any) {
		idx := newFakeIndex()
		tr := NewTranslator(podResolver(idx, nil), Limits{})
		f := newFeeder(t, tr)
		page, other := seqTokens(1, 16), seqTokens(100, 16)
		f.send(topicA, batch(enc(stored{hashes: []uint64{7}, tokens: page, bs: 16})))
		f.send(topicA, batch(enc(stored{hashes: []uint64{8}, tokens: other, bs: 16}),
			enc(stored{hashes: []uint64{7}, parent: uint64(8), tokens: page, bs: 16})))
		second := mustKey(t, "m", append(slices.Clone(other), page...))
		require.Equal(t, sortedKey(second), idx.keys(repA), "the first place of hash 7 left the index")
		f.send(topicA, batch(removedArray("GPU", 7, 8)))
		require.Empty(t, idx.keys(repA), "no key is left that no removal can reach")
	})
}

// TestTranslateFullAttentionKinds: the kinds vLLM gives full-attention
// groups (vllm/v1/kv_cache_interface.py get_kv_cache_spec_kind; a
// SinkFullAttentionSpec is a FullAttentionSpec, its manager a
// FullAttentionManager) are indexed; the others are not.
func TestTranslateFullAttentionKinds(t *testing.T) {
	for kind, indexed := range map[string]bool{"full_attention": true, "mla_attention": true, "sink_full_attention": true,
		"sliding_window": false, "sliding_window_mla": false, "mamba": false, "chunked_local_attention": false,
		"encoder_only_attention": false, "cross_attention": false, "unknown": false} {
		idx := newFakeIndex()
		tr := NewTranslator(podResolver(idx, nil), Limits{})
		f := newFeeder(t, tr)
		prompt := seqTokens(1, 16)
		f.send(topicA, arrayBatch(stored{hashes: []uint64{1}, tokens: prompt, bs: 16, medium: "GPU", group: 0, kind: kind}.array()))
		if indexed {
			require.Equal(t, sortedKey(mustKey(t, "m", prompt)), idx.keys(repA), kind)
		} else {
			require.Empty(t, idx.keys(repA), kind)
		}
	}
}

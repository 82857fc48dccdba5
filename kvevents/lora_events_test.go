package kvevents

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTranslateLoRAExtraKeys: vLLM hashes a LoRA request's blocks with the
// adapter's name as an extra key, and names it in every block's
// extra_keys. The Translator keys those blocks from the adapter's root, as
// requests for the adapter are keyed; only keys besides the adapter's name
// (a multimodal input, a cache salt) end the blocks it can key.
func TestTranslateLoRAExtraKeys(t *testing.T) {
	encodings(t, func(t *testing.T, _ bool, batch func(...any) any, enc func(stored) any) {
		idx := newFakeIndex()
		tr := NewTranslator(podResolver(idx, nil), Limits{})
		f := newFeeder(t, tr)
		prompt := seqTokens(1, 64)
		lora := stored{hashes: []uint64{1, 2, 3}, tokens: prompt[:48], bs: 16, medium: "GPU", lora: "sql-adapter", loraID: 1,
			extra: []any{[]any{"sql-adapter"}, []any{"sql-adapter"}, []any{"sql-adapter", []any{"img", 3}}}}
		f.send(topicA, batch(enc(lora)))
		want := mustKey(t, "sql-adapter", prompt)
		require.Equal(t, sortedKey(want[:2]), idx.keys(repA), "the blocks keyed by the adapter's name alone")

		salted := stored{hashes: []uint64{4}, parent: uint64(2), tokens: prompt[32:48], bs: 16, medium: "GPU", lora: "sql-adapter", loraID: 1,
			extra: []any{[]any{"salt"}}}
		f.send(topicA, batch(enc(salted)))
		require.Equal(t, sortedKey(want[:2]), idx.keys(repA), "another key than the adapter's name is no plain block")
		require.Equal(t, 2, statsOf(t, tr, topicA).Mapped)
	})
}

// TestTranslateLoRAIDOnly: vLLM before lora_name named a LoRA request's
// blocks by lora_id alone, and hashed them with the adapter: they cannot
// be keyed as the adapter's requests are, and keyed from the model's
// name they would match the base model's requests. They are dropped.
func TestTranslateLoRAIDOnly(t *testing.T) {
	encodings(t, func(t *testing.T, _ bool, batch func(...any) any, enc func(stored) any) {
		idx := newFakeIndex()
		tr := NewTranslator(podResolver(idx, nil), Limits{})
		f := newFeeder(t, tr)
		prompt := seqTokens(1, 32)
		f.send(topicA, batch(enc(stored{hashes: []uint64{1}, tokens: prompt[:16], bs: 16, loraID: 3})))
		require.Empty(t, idx.keys(repA), "an adapter's blocks are not the base model's")
		st := statsOf(t, tr, topicA)
		require.Equal(t, uint64(1), st.DroppedMedium)
		require.Contains(t, st.LastError, "lora_id 3")

		f.send(topicA, batch(enc(stored{hashes: []uint64{2}, tokens: prompt[16:], bs: 16, loraID: 0})))
		require.Equal(t, sortedKey(mustKey(t, "m", prompt[16:])), idx.keys(repA), "lora_id 0 is no adapter")
	})
}

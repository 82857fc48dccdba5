package keys

import (
	"math/rand/v2"
	"testing"
)

// Run: go test -run '^$' -bench . -benchmem -count 6 ./keys

func BenchmarkPrefixKey64KiB(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	raw := make([]byte, 64<<10)
	for i := range raw {
		raw[i] = byte('a' + rng.IntN(26))
	}
	s := string(raw)
	buf := make(Key, 0, len(s)/TextBlockBytes+1)
	b.Run("streamed", func(b *testing.B) {
		b.SetBytes(int64(len(s)))
		b.ReportAllocs()
		for b.Loop() {
			buf = defaultHasher.appendPrefix(buf[:0], s, "", "")
		}
	})
	// per-block: the same blocks, each hashed by its own XXH64 call and
	// chained, as block sizes that are not a multiple of 32 are: the
	// same-run baseline of the streamed path.
	b.Run("per-block", func(b *testing.B) {
		b.SetBytes(int64(len(s)))
		b.ReportAllocs()
		for b.Loop() {
			buf = appendBlocks(buf[:0], chain(0, tagSystem), s, TextBlockBytes)
		}
	})
}

// BenchmarkTokenKey64KiB hashes 16,384 tokens (64 KiB) in vLLM-sized blocks
// of 16 tokens.
func BenchmarkTokenKey64KiB(b *testing.B) {
	tokens := make([]uint32, 16<<10)
	for i := range tokens {
		tokens[i] = uint32(i * 2654435761)
	}
	buf := make(Key, 0, len(tokens)/16)
	b.SetBytes(int64(4 * len(tokens)))
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = AppendTokens(buf[:0], tokens, 16)
	}
}

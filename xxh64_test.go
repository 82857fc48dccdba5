package gateway

import (
	"testing"

	"github.com/cespare/xxhash/v2"
	"pgregory.net/rapid"
)

// TestXXH64Block64MatchesLibrary: the unrolled 64-byte XXH64 gives exactly
// the library's value.
func TestXXH64Block64MatchesLibrary(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		b := rapid.SliceOfN(rapid.Byte(), 64, 64).Draw(t, "block")
		if got, want := xxh64Block64(string(b)), xxhash.Sum64(b); got != want {
			t.Fatalf("xxh64Block64 = %x, xxhash.Sum64 = %x", got, want)
		}
	})
}

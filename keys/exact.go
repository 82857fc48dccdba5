package keys

import (
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// The keys of the exact index. Engines and requests must hash a token
// sequence the same way, so both sides call AppendKey (requests) or the
// Translator, which uses the same functions (events):
//
//   - a block's key is AppendTokens's: XXH64 of its token ids as
//     little-endian uint32s, chained on its parent's key;
//   - the first block's parent is ExactRoot(name), where name is the LoRA
//     adapter the request targets, or else the base model name, so two
//     adapters (or two models) on one engine never share a key, as their
//     KV caches never share a block.
//
// An engine's own block hashes are never trusted as keys: they depend on
// its hash function and seed (sha256, builtin hash, PYTHONHASHSEED), which
// a router cannot reproduce in general.

// ExactRoot returns the chain root of the keys of name: a LoRA adapter name, or
// a base model name. Distinct names give distinct roots.
func ExactRoot(name string) uint64 { return ExactRootHash(xxhash.Sum64String(name)) }

// ExactRootHash is ExactRoot of a name whose XXH64 hash is nameHash.
func ExactRootHash(nameHash uint64) uint64 {
	var k [1]uint64
	ids := [1]uint64{nameHash}
	return AppendHashes(Key(k[:0]), ids[:])[0]
}

// ExactName is the name whose root a request's or an event's blocks chain
// from: the LoRA adapter if there is one, else the model.
func ExactName(model, lora string) string {
	if lora != "" {
		return lora
	}
	return model
}

// AppendExact appends to dst the keys of tokens cut into blocks of blockTokens
// tokens, chained from ExactRoot(name): full blocks only, so fewer tokens than
// a block append nothing. It is the request side of the exact index (the
// Translator keys engine events the same way). It does not allocate when
// dst has room for one more key than it appends. A blockTokens below 1 is
// an error wrapping ErrInvalid.
func AppendExact(dst Key, name string, tokens []uint32, blockTokens int) (Key, error) {
	if blockTokens < 1 {
		return dst, fmt.Errorf("%w: token block size %d, want at least 1", ErrInvalid, blockTokens)
	}
	return AppendChained(dst, ExactRoot(name), tokens, blockTokens), nil
}

// AppendChained appends the keys of the full blocks of tokens chained from
// parent, a block's key or an ExactRoot: the engine side of the exact
// index, whose events name a block's parent. blockTokens must be positive. AppendTokens continues the
// chain of the key it is given, so it is given dst with the parent as its
// last element, which is then dropped.
func AppendChained(dst Key, parent uint64, tokens []uint32, blockTokens int) Key {
	start := len(dst)
	dst, _ = AppendTokens(append(dst, parent), tokens, blockTokens)
	copy(dst[start:], dst[start+1:])
	return dst[:len(dst)-1]
}

package kvevents

import (
	"fmt"

	"github.com/cespare/xxhash/v2"

	"github.com/examlops/gateway"
)

// The keys of the exact index. Engines and requests must hash a token
// sequence the same way, so both sides call AppendKey (requests) or the
// Translator, which uses the same functions (events):
//
//   - a block's key is gateway.AppendTokens's: XXH64 of its token ids as
//     little-endian uint32s, chained on its parent's key;
//   - the first block's parent is Root(name), where name is the LoRA
//     adapter the request targets, or else the base model name, so two
//     adapters (or two models) on one engine never share a key, as their
//     KV caches never share a block.
//
// An engine's own block hashes are never trusted as keys: they depend on
// its hash function and seed (sha256, builtin hash, PYTHONHASHSEED), which
// a router cannot reproduce in general.

// Root returns the chain root of the keys of name: a LoRA adapter name, or
// a base model name. Distinct names give distinct roots.
func Root(name string) uint64 { return rootOf(xxhash.Sum64String(name)) }

func rootOf(nameHash uint64) uint64 {
	var k [1]uint64
	ids := [1]uint64{nameHash}
	return gateway.AppendHashes(gateway.Key(k[:0]), ids[:])[0]
}

// KeyName is the name whose root a request's or an event's blocks chain
// from: the LoRA adapter if there is one, else the model.
func KeyName(model, lora string) string {
	if lora != "" {
		return lora
	}
	return model
}

// AppendKey appends to dst the keys of tokens cut into blocks of blockSize
// tokens, chained from Root(name): full blocks only, so fewer tokens than
// a block append nothing. It is the request side of the exact index (the
// Translator keys engine events the same way). It does not allocate when
// dst has room for one more key than it appends. A blockSize below 1 is
// an error.
func AppendKey(dst gateway.Key, name string, tokens []uint32, blockSize int) (gateway.Key, error) {
	if blockSize < 1 {
		return dst, fmt.Errorf("%w: block size %d, want at least 1", gateway.ErrInvalid, blockSize)
	}
	return appendChain(dst, Root(name), tokens, blockSize), nil
}

// KeyFromTokens is AppendKey into a new Key.
func KeyFromTokens(name string, tokens []uint32, blockSize int) (gateway.Key, error) {
	return AppendKey(nil, name, tokens, blockSize)
}

// appendChain appends the keys of the full blocks of tokens chained from
// parent. blockSize must be positive. gateway.AppendTokens continues the
// chain of the key it is given, so it is given dst with the parent as its
// last element, which is then dropped.
func appendChain(dst gateway.Key, parent uint64, tokens []uint32, blockSize int) gateway.Key {
	start := len(dst)
	dst, _ = gateway.AppendTokens(append(dst, parent), tokens, blockSize)
	copy(dst[start:], dst[start+1:])
	return dst[:len(dst)-1]
}

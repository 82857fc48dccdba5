package gateway

import (
	"encoding/binary"
	"fmt"
	"math/bits"

	"github.com/cespare/xxhash/v2"
)

// DefaultBlockSize is the number of bytes per block that PrefixKey uses:
// 64 bytes, about 16 tokens of English text, the size of a vLLM KV block.
const DefaultBlockSize = 64

// Key identifies a request prefix as a chain of block hashes: Key[i] covers
// the content of blocks 0..i, so two keys agree on their first n elements
// exactly when their first n blocks have the same content. A nil or empty
// Key cannot be routed.
//
// Keys are built by PrefixKey, Hasher, KeyFromTokens or KeyFromHashes; the
// Append forms reuse a caller's buffer and do not allocate when it is large
// enough.
type Key []uint64

// chain folds a block's own hash into its parent's: the result identifies
// the whole prefix ending in that block. It is a 128-bit multiply-fold, the
// mixer of wyhash and rapidhash, with both inputs folded back in so that it
// stays injective in each argument even where the product is zero.
func chain(parent, block uint64) uint64 {
	hi, lo := bits.Mul64(parent^0xa0761d6478bd642f, block^0xe7037ed1a0b428db)
	return hi ^ lo ^ parent ^ bits.RotateLeft64(block, 32)
}

// Segment tags keep "ab"+"c" and "a"+"bc" apart: each segment starts by
// chaining its tag, so blocks never straddle segments.
const (
	tagSystem  = 0x53595354454d0001
	tagSession = 0x53455353494f0002
	tagRAG     = 0x5241470000000003
	tagTokens  = 0x544f4b454e530004
	tagHashes  = 0x4841534845530005
)

// Hasher cuts text segments into fixed-size blocks and chains their hashes.
// When the block size is a multiple of 32 bytes, as DefaultBlockSize is, a
// segment's full blocks are hashed in one streaming pass (see
// prefix_stream.go); each value still covers its block, every byte before
// it, and the parent's value.
// A Hasher is immutable and safe for concurrent use. Its zero value is not
// valid; use NewHasher.
type Hasher struct {
	blockSize int
}

// NewHasher returns a Hasher that cuts segments into blocks of blockSize
// bytes. A blockSize below 1 is an error wrapping ErrInvalidBlockSize.
func NewHasher(blockSize int) (*Hasher, error) {
	if blockSize < 1 {
		return nil, fmt.Errorf("%w: block size %d, want at least 1", ErrInvalidBlockSize, blockSize)
	}
	return &Hasher{blockSize: blockSize}, nil
}

// BlockSize returns the number of bytes per block.
func (h *Hasher) BlockSize() int { return h.blockSize }

var defaultHasher = &Hasher{blockSize: DefaultBlockSize}

// PrefixKey returns the Key of a prompt made of a system prompt, a session
// id and a RAG context, chained in that order with DefaultBlockSize blocks.
// Empty segments are skipped, so PrefixKey("", "", "") is empty.
func PrefixKey(system, session, rag string) Key {
	return defaultHasher.AppendKey(nil, system, session, rag)
}

// Key returns the Key of system, session and rag, chained in that order.
func (h *Hasher) Key(system, session, rag string) Key {
	return h.AppendKey(nil, system, session, rag)
}

// AppendKey appends the block hashes of system, session and rag to dst and
// returns the extended Key. It does not allocate when dst has room.
func (h *Hasher) AppendKey(dst Key, system, session, rag string) Key {
	dst = h.AppendSegment(dst, tagSystem, system)
	dst = h.AppendSegment(dst, tagSession, session)
	return h.AppendSegment(dst, tagRAG, rag)
}

// AppendSegment appends the blocks of one more segment to the chain in dst.
// tag separates kinds of segment (any constant of the caller's; two segments
// with the same text and different tags hash differently). An empty segment
// appends nothing. Callers building keys from a conversation, one message at
// a time, use it with the message's role as tag.
func (h *Hasher) AppendSegment(dst Key, tag uint64, segment string) Key {
	if len(segment) == 0 {
		return dst
	}
	parent := uint64(0)
	if len(dst) > 0 {
		parent = dst[len(dst)-1]
	}
	parent = chain(parent, tag)
	if h.blockSize%32 == 0 && len(segment) >= h.blockSize {
		var n int
		dst, n = appendStreamed(dst, parent, segment, h.blockSize)
		parent, segment = dst[len(dst)-1], segment[n:]
	}
	return appendBlocks(dst, parent, segment, h.blockSize)
}

// appendBlocks appends the chain values of segment's blocks, each block
// hashed on its own with XXH64 and chained on its parent: the path for
// block sizes that are not a multiple of 32 bytes, and for a segment's
// last, partial block.
func appendBlocks(dst Key, parent uint64, segment string, blockSize int) Key {
	for len(segment) > 0 {
		n := min(blockSize, len(segment))
		parent = chain(parent, xxhash.Sum64String(segment[:n]))
		dst = append(dst, parent)
		segment = segment[n:]
	}
	return dst
}

// KeyFromTokens returns the Key of a token sequence cut into blocks of
// blockSize tokens, the way vLLM and SGLang hash KV blocks: full blocks
// only, each chained on its parent. Fewer tokens than one block give an
// empty Key. A blockSize below 1 is an error wrapping ErrInvalidBlockSize.
func KeyFromTokens(tokens []uint32, blockSize int) (Key, error) {
	return AppendTokenKey(nil, tokens, blockSize)
}

// AppendTokenKey is KeyFromTokens appending to dst; it does not allocate
// when dst has room.
func AppendTokenKey(dst Key, tokens []uint32, blockSize int) (Key, error) {
	if blockSize < 1 {
		return dst, fmt.Errorf("%w: block size %d, want at least 1", ErrInvalidBlockSize, blockSize)
	}
	parent := chain(0, tagTokens)
	var buf [256]byte
	for len(tokens) >= blockSize {
		block := tokens[:blockSize]
		var d xxhash.Digest
		d.Reset()
		for len(block) > 0 {
			n := min(len(block), len(buf)/4)
			for i, t := range block[:n] {
				binary.LittleEndian.PutUint32(buf[4*i:], t)
			}
			d.Write(buf[:4*n])
			block = block[n:]
		}
		parent = chain(parent, d.Sum64())
		dst = append(dst, parent)
		tokens = tokens[blockSize:]
	}
	return dst, nil
}

// KeyFromHashes returns the Key of a list of already-hashed block ids, such
// as the hash_ids of a Mooncake trace. The ids are chained again, so small
// integers work and two lists share a Key prefix exactly as far as they
// agree.
func KeyFromHashes(ids []uint64) Key {
	return AppendHashKey(nil, ids)
}

// AppendHashKey is KeyFromHashes appending to dst; it does not allocate when
// dst has room. A non-empty dst is continued, as AppendSegment continues
// it: AppendHashKey(KeyFromHashes(a), b) is KeyFromHashes of a then b.
func AppendHashKey(dst Key, ids []uint64) Key {
	parent := chain(0, tagHashes)
	if len(dst) > 0 {
		parent = dst[len(dst)-1]
	}
	for _, id := range ids {
		parent = chain(parent, id)
		dst = append(dst, parent)
	}
	return dst
}

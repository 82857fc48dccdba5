package keys

import (
	"fmt"
	"math/bits"

	"github.com/cespare/xxhash/v2"
)

// TextBlockBytes is the number of bytes per block that PrefixKey and the
// OpenAI-body keys use by default: 64 bytes, about 16 tokens of English
// text, the size of a vLLM KV block.
const TextBlockBytes = 64

// Key identifies a request prefix as a chain of block hashes: Key[i] covers
// the content of blocks 0..i, so two keys agree on their first n elements
// exactly when their first n blocks have the same content. It is the same
// type as gateway.Key.
type Key = []uint64

// chain folds a block's own hash into its parent's: the result identifies
// the whole prefix ending in that block. It is a 128-bit multiply-fold, the
// mixer of wyhash and rapidhash, with both inputs folded back in so that it
// stays injective in each argument even where the product is zero.
func chain(parent, block uint64) uint64 {
	hi, lo := bits.Mul64(parent^0xa0761d6478bd642f, block^0xe7037ed1a0b428db)
	return hi ^ lo ^ parent ^ bits.RotateLeft64(block, 32)
}

// Segment is the role of a stretch of prompt text in a Key. Each segment
// starts by chaining its role's tag, so the same text in two roles hashes
// differently, "ab"+"c" and "a"+"bc" stay apart, and a block never
// straddles two segments. The zero value is SegmentSystem. Values past
// SegmentPrompt are roles of the caller's own, each tagged apart.
type Segment uint8

// The roles of text in a prompt, in the order PrefixKey and the HTTP
// gateway chain them: system, session, RAG context, then the conversation.
const (
	SegmentSystem    Segment = iota // system (or developer) instructions
	SegmentSession                  // a session or conversation id
	SegmentRAG                      // the id of a retrieved context
	SegmentUser                     // a user message
	SegmentAssistant                // an assistant message
	SegmentTool                     // a tool or function result
	SegmentOther                    // a message in any other role
	SegmentPrompt                   // a completions prompt
	numSegments
)

// Tags of the segments, and of the roots of token and hash keys. The first
// three and the last two are the values PrefixKey, AppendTokens and
// AppendHashes have always used, so keys built before roles existed stay
// valid.
const (
	tagSystem    = 0x53595354454d0001 // "SYSTEM"
	tagSession   = 0x53455353494f0002 // "SESSIO"
	tagRAG       = 0x5241470000000003 // "RAG"
	tagTokens    = 0x544f4b454e530004 // "TOKENS"
	tagHashes    = 0x4841534845530005 // "HASHES"
	tagUser      = 0x5553455200000006 // "USER"
	tagAssistant = 0x4153534953540007 // "ASSIST"
	tagTool      = 0x544f4f4c00000008 // "TOOL"
	tagOther     = 0x4f54484552000009 // "OTHER"
	tagPrompt    = 0x50524f4d5054000a // "PROMPT"
	tagCustom    = 0x524f4c4500000000 // "ROLE", ORed with a caller's Segment
)

var segmentTags = [numSegments]uint64{tagSystem, tagSession, tagRAG, tagUser, tagAssistant, tagTool, tagOther, tagPrompt}

// tag returns the chain tag of a segment's role.
func (s Segment) tag() uint64 {
	if s < numSegments {
		return segmentTags[s]
	}
	return tagCustom | uint64(s)
}

// Hasher cuts text segments into fixed-size blocks and chains their hashes.
// When the block size is a multiple of 32 bytes, as TextBlockBytes is, a
// segment's full blocks are hashed in one streaming pass (see
// prefix_stream.go); each value still covers its block, every byte before
// it, and the parent's value.
// A Hasher is immutable and safe for concurrent use. Its zero value is not
// valid; use NewHasher.
type Hasher struct {
	blockSize int
}

// NewHasher returns a Hasher that cuts segments into blocks of blockBytes
// bytes. A blockBytes below 1 is an error wrapping ErrInvalid.
func NewHasher(blockBytes int) (*Hasher, error) {
	if blockBytes < 1 {
		return nil, fmt.Errorf("%w: text block size %d bytes, want at least 1", ErrInvalid, blockBytes)
	}
	return &Hasher{blockSize: blockBytes}, nil
}

var defaultHasher = &Hasher{blockSize: TextBlockBytes}

// PrefixKey returns the Key of a prompt made of a system prompt, a session
// id and a RAG context, chained in that order (SegmentSystem,
// SegmentSession, SegmentRAG) with TextBlockBytes blocks. Empty segments
// are skipped, so PrefixKey("", "", "") is empty. The HTTP gateway builds
// the same key for a request with that system prompt and X-Session-ID and
// X-RAG-Context headers, before the conversation's messages.
func PrefixKey(system, session, rag string) Key {
	return defaultHasher.appendPrefix(nil, system, session, rag)
}

// appendPrefix appends PrefixKey's segments to dst.
func (h *Hasher) appendPrefix(dst Key, system, session, rag string) Key {
	dst = h.AppendSegment(dst, SegmentSystem, system)
	dst = h.AppendSegment(dst, SegmentSession, session)
	return h.AppendSegment(dst, SegmentRAG, rag)
}

// AppendSegment appends the blocks of text, in the role s, to the chain in
// dst and returns the extended Key. Empty text appends nothing. Callers
// building keys from a conversation, one message at a time, append each
// message in its role. It does not allocate when dst has room.
func (h *Hasher) AppendSegment(dst Key, s Segment, text string) Key {
	if len(text) == 0 {
		return dst
	}
	parent := uint64(0)
	if len(dst) > 0 {
		parent = dst[len(dst)-1]
	}
	parent = chain(parent, s.tag())
	if h.blockSize%32 == 0 && len(text) >= h.blockSize {
		var n int
		dst, n = appendStreamed(dst, parent, text, h.blockSize)
		parent, text = dst[len(dst)-1], text[n:]
	}
	return appendBlocks(dst, parent, text, h.blockSize)
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

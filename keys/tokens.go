package keys

import (
	"encoding/binary"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// AppendTokens appends to dst the keys of a token sequence cut into blocks
// of blockTokens tokens, the way vLLM and SGLang hash KV blocks: full blocks
// only (fewer tokens than one block append nothing), each block's token ids
// hashed with XXH64 as little-endian uint32s and chained on its parent. The
// first block's parent is dst's last element, or a fixed root when dst is
// empty. A blockTokens below 1 is an error wrapping ErrInvalid. It does not
// allocate when dst has room.
func AppendTokens(dst Key, tokens []uint32, blockTokens int) (Key, error) {
	if blockTokens < 1 {
		return dst, fmt.Errorf("%w: token block size %d, want at least 1", ErrInvalid, blockTokens)
	}
	parent := chain(0, tagTokens)
	if len(dst) > 0 {
		parent = dst[len(dst)-1]
	}
	var buf [256]byte
	for len(tokens) >= blockTokens {
		block := tokens[:blockTokens]
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
		tokens = tokens[blockTokens:]
	}
	return dst, nil
}

// AppendHashes appends to dst the keys of already-hashed block ids, such
// as the hash_ids of a Mooncake trace. The ids are chained again, so small
// integers work and two lists share a Key prefix exactly as far as they
// agree. The first id's parent is dst's last element, or a fixed root when
// dst is empty: AppendHashes(AppendHashes(nil, a), b) is AppendHashes(nil,
// a then b). It does not allocate when dst has room.
func AppendHashes(dst Key, ids []uint64) Key {
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

package keys

import (
	"encoding/binary"
	"math/bits"
	"slices"
	"unsafe"
)

// Streamed block hashing, the fast path of Hasher for block sizes that are
// a multiple of 32 bytes (TextBlockBytes among them).
//
// Hashing each 64-byte block with its own XXH64 call spends about half the
// time setting up and finishing the hash rather than mixing bytes. Instead
// a segment is run through XXH64's four-lane stripe rounds once, the lanes
// seeded with the parent's chain value, and at every block boundary the
// lanes are folded into that block's value as XXH64 folds them at its end
// (rotate-add, then the length and XXH64's avalanche). The value of block i
// is so a function of the seed and of every byte of the segment up to the
// end of block i: it identifies the whole prefix, as the chain does, and
// two segments agree on a block's value exactly as far as their bytes
// agree (up to 64-bit collisions).

const (
	prime1 uint64 = 11400714785074694791
	prime2 uint64 = 14029467366897019727
	prime3 uint64 = 1609587929392839161
)

func round(acc, input uint64) uint64 {
	acc += input * prime2
	acc = bits.RotateLeft64(acc, 31)
	return acc * prime1
}

// fold returns the value of the lanes after n bytes: XXH64's end without
// its merge rounds.
func fold(v1, v2, v3, v4 uint64, n int) uint64 {
	h := bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) +
		bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18) + uint64(n)
	h ^= h >> 33
	h *= prime2
	h ^= h >> 29
	h *= prime3
	h ^= h >> 32
	return h
}

// appendStreamed appends the values of the full blocks of segment,
// streaming it from seed, and returns them with the number of bytes they
// cover. blockSize is a multiple of 32.
func appendStreamed(dst Key, seed uint64, segment string, blockSize int) (Key, int) {
	b := unsafe.Slice(unsafe.StringData(segment), len(segment))
	nb := len(b) / blockSize
	// Room for a partial last block too, which the caller appends.
	dst = slices.Grow(dst, (len(b)+blockSize-1)/blockSize)[:len(dst)+nb]
	out := dst[len(dst)-nb:]
	v1, v2, v3, v4 := seed+prime1+prime2, seed+prime2, seed, seed-prime1
	if blockSize == 64 { // the default: two stripes a block, unrolled
		for i := range out {
			s := b[i*64 : i*64+64 : i*64+64]
			v1 = round(v1, binary.LittleEndian.Uint64(s[0:8]))
			v2 = round(v2, binary.LittleEndian.Uint64(s[8:16]))
			v3 = round(v3, binary.LittleEndian.Uint64(s[16:24]))
			v4 = round(v4, binary.LittleEndian.Uint64(s[24:32]))
			v1 = round(v1, binary.LittleEndian.Uint64(s[32:40]))
			v2 = round(v2, binary.LittleEndian.Uint64(s[40:48]))
			v3 = round(v3, binary.LittleEndian.Uint64(s[48:56]))
			v4 = round(v4, binary.LittleEndian.Uint64(s[56:64]))
			out[i] = fold(v1, v2, v3, v4, (i+1)*64)
		}
		return dst, nb * 64
	}
	for i := range out {
		blk := b[i*blockSize : (i+1)*blockSize]
		for ; len(blk) >= 32; blk = blk[32:] {
			v1 = round(v1, binary.LittleEndian.Uint64(blk[0:8]))
			v2 = round(v2, binary.LittleEndian.Uint64(blk[8:16]))
			v3 = round(v3, binary.LittleEndian.Uint64(blk[16:24]))
			v4 = round(v4, binary.LittleEndian.Uint64(blk[24:32]))
		}
		out[i] = fold(v1, v2, v3, v4, (i+1)*blockSize)
	}
	return dst, nb * blockSize
}

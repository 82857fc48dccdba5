package gateway

import "math/bits"

// xxh64Block64 is XXH64 with seed 0 of exactly 64 bytes: the same value as
// xxhash.Sum64(b[:64]), written out for this one length so the compiler
// keeps it in registers. Hashing a prompt is mostly hashing 64-byte
// blocks, and at that size a general call's setup costs as much as the
// arithmetic. The algorithm is Yann Collet's XXH64 specification.
func xxh64Block64(b string) uint64 {
	const (
		p1 uint64 = 11400714785074694791
		p2 uint64 = 14029467366897019727
		p3 uint64 = 1609587929392839161
		p4 uint64 = 9650029242287828579
	)
	_ = b[63]
	u := func(i int) uint64 {
		return uint64(b[i]) | uint64(b[i+1])<<8 | uint64(b[i+2])<<16 | uint64(b[i+3])<<24 |
			uint64(b[i+4])<<32 | uint64(b[i+5])<<40 | uint64(b[i+6])<<48 | uint64(b[i+7])<<56
	}
	round := func(acc, in uint64) uint64 {
		return bits.RotateLeft64(acc+in*p2, 31) * p1
	}
	prime1, prime2 := p1, p2 // variables: seed arithmetic wraps mod 2^64
	v1, v2, v3, v4 := prime1+prime2, prime2, uint64(0), -prime1
	v1, v2, v3, v4 = round(v1, u(0)), round(v2, u(8)), round(v3, u(16)), round(v4, u(24))
	v1, v2, v3, v4 = round(v1, u(32)), round(v2, u(40)), round(v3, u(48)), round(v4, u(56))
	h := bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
	for _, v := range [4]uint64{v1, v2, v3, v4} {
		h = (h^round(0, v))*p1 + p4
	}
	h += 64
	h ^= h >> 33
	h *= p2
	h ^= h >> 29
	h *= p3
	h ^= h >> 32
	return h
}

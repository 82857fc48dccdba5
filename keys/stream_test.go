package keys

import (
	"encoding/binary"
	"math/bits"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// refStreamed is the streamed block value written out plainly: XXH64's
// lanes over data from scratch, seeded with seed, folded at the end.
func refStreamed(seed uint64, data []byte) uint64 {
	const p1, p2, p3 = 11400714785074694791, 14029467366897019727, 1609587929392839161
	v := [4]uint64{seed + p1 + p2, seed + p2, seed, seed - p1}
	for off := 0; off < len(data); off += 8 {
		lane := (off / 8) % 4
		v[lane] = bits.RotateLeft64(v[lane]+binary.LittleEndian.Uint64(data[off:])*p2, 31) * p1
	}
	h := bits.RotateLeft64(v[0], 1) + bits.RotateLeft64(v[1], 7) + bits.RotateLeft64(v[2], 12) + bits.RotateLeft64(v[3], 18)
	h += uint64(len(data))
	h = (h ^ h>>33) * p2
	h = (h ^ h>>29) * p3
	return h ^ h>>32
}

// TestPropStreamedMatchesReference: for block sizes that are multiples of
// 32, block i's value is the reference hash of the segment's bytes up to
// the end of block i, seeded by the segment's chain start; a trailing
// partial block is chained on the last full one.
func TestPropStreamedMatchesReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bs := 32 * rapid.IntRange(1, 4).Draw(t, "stripes")
		n := rapid.IntRange(1, 6*bs).Draw(t, "length")
		seg := string(rapid.SliceOfN(rapid.Byte(), n, n).Draw(t, "segment"))
		h, err := NewHasher(bs)
		require.NoError(t, err)
		got := h.AppendSegment(nil, SegmentRAG, seg)
		seed := chain(0, tagRAG)
		full := len(seg) / bs
		require.Len(t, got, (len(seg)+bs-1)/bs)
		for i := range full {
			require.Equal(t, refStreamed(seed, []byte(seg[:(i+1)*bs])), got[i], "block %d", i)
		}
		if full < len(got) {
			parent := seed
			if full > 0 {
				parent = got[full-1]
			}
			want := appendBlocks(nil, parent, seg[full*bs:], bs)
			require.Equal(t, want, got[full:])
		}
	})
}

// TestStreamedAllocatesNothing: the streamed path appends in place when the
// buffer has room.
func TestStreamedAllocatesNothing(t *testing.T) {
	seg := string(make([]byte, 4096+17))
	buf := make(Key, 0, 128)
	allocs := testing.AllocsPerRun(100, func() {
		buf = defaultHasher.appendPrefix(buf[:0], seg, "s", "")
	})
	require.Zero(t, allocs)
	require.Len(t, buf, 4096/TextBlockBytes+2)
}

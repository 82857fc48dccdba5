package refengine

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestPropSplitEqualsColocated checks the engine on random token prompts
// of any length: the split output equals the co-located one, and the
// transfer holds two float32 vectors a position.
func TestPropSplitEqualsColocated(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		prompt := rapid.SliceOfN(rapid.Uint32Range(0, uint32(Default.Vocab-1)), 1, 64).Draw(t, "prompt")
		n := rapid.IntRange(1, 24).Draw(t, "tokens")
		co := Default.Colocated(prompt, n)
		sp, kvBytes, err := Default.Split(prompt, n)
		require.NoError(t, err)
		require.Equal(t, co, sp)
		require.Len(t, co, n)
		require.Equal(t, 8+8*Default.Dim*len(prompt), kvBytes)
	})
}

// TestComparisonIsSensitive: the identical-output check can fail. A lossy
// KV transfer (float32 truncated to bfloat16) changes the output of some
// prompts, so the comparison is not vacuous.
func TestComparisonIsSensitive(t *testing.T) {
	differ := 0
	for i := range 64 {
		prompt := PromptOf([]uint64{uint64(i), uint64(i * i), 7, uint64(i + 3)}, Default.Vocab)
		co := Default.Colocated(prompt, 16)
		wire := Default.Prefill(prompt).Marshal()
		for off := 8; off < len(wire); off += 4 {
			binary.LittleEndian.PutUint16(wire[off:], 0) // drop the low mantissa bits
		}
		c, err := UnmarshalKV(wire)
		require.NoError(t, err)
		if !slices.Equal(co, Default.Decode(c, prompt[len(prompt)-1], 16)) {
			differ++
		}
	}
	assert.Positive(t, differ, "a lossy transfer must change some outputs")
}

func TestUnmarshalKVRejectsMalformed(t *testing.T) {
	good := Default.Prefill([]uint32{1, 2, 3}).Marshal()
	zeroDim := slices.Clone(good)
	binary.LittleEndian.PutUint32(zeroDim, 0)
	tests := map[string][]byte{
		"empty":       nil,
		"short":       good[:5],
		"truncated":   good[:len(good)-1],
		"extra byte":  append(slices.Clone(good), 0),
		"zero dim":    zeroDim,
		"header only": good[:8],
	}
	for name, b := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := UnmarshalKV(b)
			require.ErrorIs(t, err, ErrKVFormat)
			assert.Regexp(t, `^refengine: `, err.Error())
		})
	}
	c, err := UnmarshalKV(good)
	require.NoError(t, err)
	assert.Equal(t, Default.Prefill([]uint32{1, 2, 3}), c)
	assert.Equal(t, 3, c.Positions())
}

// FuzzUnmarshalKV: any bytes either decode to a cache that marshals back
// to the same bytes, or are an error wrapping ErrKVFormat; never a panic.
func FuzzUnmarshalKV(f *testing.F) {
	f.Add(Default.Prefill([]uint32{1, 2, 3}).Marshal())
	f.Add([]byte{})
	f.Add([]byte{1, 0, 0, 0, 255, 255, 255, 255})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := UnmarshalKV(b)
		if err != nil {
			require.ErrorIs(t, err, ErrKVFormat)
			return
		}
		require.Equal(t, b, c.Marshal())
	})
}

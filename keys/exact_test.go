package keys

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestChainMatchesAppendTokens: below the root, keys chain exactly as
// AppendTokens does (same block digest, same chain function), so
// the exact index differs from AppendTokens only by its salted root.
func TestChainMatchesAppendTokens(t *testing.T) {
	for _, n := range []int{2, 3, 17, 40} {
		tokens := seqTokens(7, n*16+5)
		want, err := AppendTokens(nil, tokens, 16)
		require.NoError(t, err)
		got := AppendChained(nil, want[0], tokens[16:], 16)
		require.Equal(t, want[1:], got, "%d blocks", n)
	}
}

func TestAppendKey(t *testing.T) {
	tokens := seqTokens(1, 100)
	k, err := AppendExact(nil, "m", tokens, 16)
	require.NoError(t, err)
	require.Len(t, k, 6, "full blocks only")

	short, err := AppendExact(nil, "m", tokens[:40], 16)
	require.NoError(t, err)
	require.Equal(t, k[:2], short, "a prefix's key is a prefix of the key")

	other, err := AppendExact(nil, "adapter", tokens, 16)
	require.NoError(t, err)
	for i := range k {
		require.NotEqual(t, k[i], other[i], "names salt every block")
	}
	require.NotEqual(t, ExactRoot("a"), ExactRoot("b"))
	require.NotEqual(t, ExactRoot(""), ExactRoot("a"))

	// Continuing from block 2's key gives the rest of the key.
	require.Equal(t, k[2:], AppendChained(nil, k[1], tokens[32:], 16))

	none, err := AppendExact(nil, "m", tokens[:15], 16)
	require.NoError(t, err)
	require.Empty(t, none)

	_, err = AppendExact(nil, "m", tokens, 0)
	require.ErrorIs(t, err, ErrInvalid)
	require.Contains(t, err.Error(), "block size 0")
}

func TestAppendKeyDoesNotAllocate(t *testing.T) {
	tokens := seqTokens(1, 4096)
	buf := make(Key, 0, 512)
	allocs := testing.AllocsPerRun(100, func() {
		k, err := AppendExact(buf[:0], "model", tokens, 16)
		if err != nil || len(k) != 256 {
			t.Fatal(err, len(k))
		}
	})
	require.Zero(t, allocs)
}

// seqTokens returns n token ids counting up from base.
func seqTokens(base uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

// TestBadBlockSizes: every builder given a block size below 1 returns an
// error wrapping ErrInvalid that names the size and its unit, and leaves
// dst as it was.
func TestBadBlockSizes(t *testing.T) {
	buf := Key{7}
	for name, call := range map[string]func() (Key, error){
		"NewHasher 0":      func() (Key, error) { _, err := NewHasher(0); return nil, err },
		"NewHasher -3":     func() (Key, error) { _, err := NewHasher(-3); return nil, err },
		"AppendTokens 0":   func() (Key, error) { return AppendTokens(buf, []uint32{1, 2}, 0) },
		"AppendTokens -16": func() (Key, error) { return AppendTokens(buf, []uint32{1, 2}, -16) },
		"AppendExact 0":    func() (Key, error) { return AppendExact(buf, "m", []uint32{1, 2}, 0) },
		"AppendExact -1":   func() (Key, error) { return AppendExact(buf, "m", []uint32{1, 2}, -1) },
	} {
		k, err := call()
		require.ErrorIs(t, err, ErrInvalid, name)
		size := name[strings.LastIndexByte(name, ' ')+1:]
		require.ErrorContains(t, err, "block size "+size, name)
		if k != nil {
			require.Equal(t, Key{7}, k, name)
		}
	}
}

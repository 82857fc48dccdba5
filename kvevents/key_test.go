package kvevents

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
)

// TestChainMatchesAppendTokens: below the root, keys chain exactly as
// gateway.AppendTokens does (same block digest, same chain function), so
// the exact index differs from AppendTokens only by its salted root.
func TestChainMatchesAppendTokens(t *testing.T) {
	for _, n := range []int{2, 3, 17, 40} {
		tokens := seqTokens(7, n*16+5)
		want, err := gateway.AppendTokens(nil, tokens, 16)
		require.NoError(t, err)
		got := appendChain(nil, want[0], tokens[16:], 16)
		require.Equal(t, want[1:], got, "%d blocks", n)
	}
}

func TestAppendKey(t *testing.T) {
	tokens := seqTokens(1, 100)
	k, err := KeyFromTokens("m", tokens, 16)
	require.NoError(t, err)
	require.Len(t, k, 6, "full blocks only")

	short, err := KeyFromTokens("m", tokens[:40], 16)
	require.NoError(t, err)
	require.Equal(t, k[:2], short, "a prefix's key is a prefix of the key")

	other, err := KeyFromTokens("adapter", tokens, 16)
	require.NoError(t, err)
	for i := range k {
		require.NotEqual(t, k[i], other[i], "names salt every block")
	}
	require.NotEqual(t, Root("a"), Root("b"))
	require.NotEqual(t, Root(""), Root("a"))

	// Continuing from block 2's key gives the rest of the key.
	require.Equal(t, k[2:], appendChain(nil, k[1], tokens[32:], 16))

	none, err := KeyFromTokens("m", tokens[:15], 16)
	require.NoError(t, err)
	require.Empty(t, none)

	_, err = AppendKey(nil, "m", tokens, 0)
	require.ErrorIs(t, err, gateway.ErrInvalid)
	require.Contains(t, err.Error(), "block size 0")
}

func TestAppendKeyDoesNotAllocate(t *testing.T) {
	tokens := seqTokens(1, 4096)
	buf := make(gateway.Key, 0, 512)
	allocs := testing.AllocsPerRun(100, func() {
		k, err := AppendKey(buf[:0], "model", tokens, 16)
		if err != nil || len(k) != 256 {
			t.Fatal(err, len(k))
		}
	})
	require.Zero(t, allocs)
}

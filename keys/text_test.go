package keys

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// commonPrefix returns how many leading elements a and b share.
func commonPrefix(a, b Key) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// blockDesc is the reference description of one block: its bytes and, for
// the first block of a segment, the segment's tag.
type blockDesc struct {
	first bool
	tag   uint64
	data  string
}

// refBlocks cuts segments into the blocks a Hasher of block size bs hashes,
// without hashing: the naive model the prefix property is checked against.
func refBlocks(bs int, tags []uint64, segs []string) []blockDesc {
	var out []blockDesc
	for i, s := range segs {
		for off := 0; off < len(s); off += bs {
			out = append(out, blockDesc{first: off == 0, tag: tags[i], data: s[off:min(off+bs, len(s))]})
		}
	}
	return out
}

func refAgree(a, b []blockDesc) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// drawSegmentN draws a segment of up to maxLen bytes over a two-letter
// alphabet, so that blocks often agree.
func drawSegmentN(t *rapid.T, label string, maxLen int) string {
	n := rapid.IntRange(0, maxLen).Draw(t, label+"Len") // rapid's own lengths stay short
	return rapid.StringOfN(rapid.RuneFrom([]rune("ab")), n, n, -1).Draw(t, label)
}

// blockSizes covers the per-block path (1..8) and the streamed path
// (multiples of 32, TextBlockBytes among them).
var blockSizes = []int{1, 2, 3, 5, 8, 32, TextBlockBytes, 96}

// TestPropKeySharesExactlyAgreeingBlocks: two keys share exactly as many
// leading elements as their leading blocks (content and segment boundaries)
// agree, and differ at every position after that.
func TestPropKeySharesExactlyAgreeingBlocks(t *testing.T) {
	tags := []uint64{tagSystem, tagSession, tagRAG}
	rapid.Check(t, func(t *rapid.T) {
		bs := rapid.SampledFrom(blockSizes).Draw(t, "blockSize")
		h, err := NewHasher(bs)
		require.NoError(t, err)
		var a, b [3]string
		for i := range a {
			a[i] = drawSegmentN(t, "a", 4*bs)
			// b shares a random prefix of a's segment, then goes its own way.
			cut := rapid.IntRange(0, len(a[i])).Draw(t, "cut")
			b[i] = a[i][:cut] + drawSegmentN(t, "bsuffix", 3*bs)
		}
		ka := h.appendPrefix(nil, a[0], a[1], a[2])
		kb := h.appendPrefix(nil, b[0], b[1], b[2])
		ra, rb := refBlocks(bs, tags, a[:]), refBlocks(bs, tags, b[:])
		require.Len(t, ka, len(ra))
		require.Len(t, kb, len(rb))
		want := refAgree(ra, rb)
		require.Equal(t, want, commonPrefix(ka, kb), "a=%q b=%q", a, b)
		for j := want; j < min(len(ka), len(kb)); j++ {
			require.NotEqual(t, ka[j], kb[j], "element %d after divergence at %d", j, want)
		}
	})
}

// TestSegmentsDoNotStraddle: blocks never straddle segments, so moving a
// boundary changes the key even when the concatenated text is the same.
func TestSegmentsDoNotStraddle(t *testing.T) {
	for _, bs := range []int{1, 2, TextBlockBytes} {
		h, err := NewHasher(bs)
		require.NoError(t, err)
		tests := []struct {
			name string
			a, b [3]string
		}{
			{"system|session", [3]string{"ab", "c", ""}, [3]string{"a", "bc", ""}},
			{"session|rag", [3]string{"x", "ab", "c"}, [3]string{"x", "a", "bc"}},
			{"system|rag skipping session", [3]string{"ab", "", "c"}, [3]string{"a", "", "bc"}},
			{"same text, other segment", [3]string{"abc", "", ""}, [3]string{"", "abc", ""}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				ka := h.appendPrefix(nil, tt.a[0], tt.a[1], tt.a[2])
				kb := h.appendPrefix(nil, tt.b[0], tt.b[1], tt.b[2])
				assert.NotEqual(t, ka, kb)
				assert.NotEqual(t, ka[len(ka)-1], kb[len(kb)-1], "the last element identifies the whole prefix")
			})
		}
	}
	// With one-byte blocks "ab"+"c" and "a"+"bc" agree on block "a" only.
	h, _ := NewHasher(1)
	assert.Equal(t, 1, commonPrefix(h.appendPrefix(nil, "ab", "c", ""), h.appendPrefix(nil, "a", "bc", "")))
}

func TestPrefixKeyBlocks(t *testing.T) {
	tests := []struct {
		name                string
		system, session, rg string
		want                int
	}{
		{"all empty", "", "", "", 0},
		{"one byte", "x", "", "", 1},
		{"one block", strings.Repeat("x", TextBlockBytes), "", "", 1},
		{"block and a byte", strings.Repeat("x", TextBlockBytes+1), "", "", 2},
		{"three segments", "s", "t", "u", 3},
		{"4 KiB prompt", strings.Repeat("y", 4096), "", "", 4096 / TextBlockBytes},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := PrefixKey(tt.system, tt.session, tt.rg)
			assert.Len(t, k, tt.want)
			assert.Equal(t, defaultHasher.appendPrefix(nil, tt.system, tt.session, tt.rg), k)
		})
	}
	h, err := NewHasher(7)
	require.NoError(t, err)
	assert.Equal(t, 7, h.blockSize)
}

// TestPropAppendContinuesChain: appending segments to an existing key gives
// the key of the whole prompt, so keys can be built incrementally.
func TestPropAppendContinuesChain(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bs := rapid.SampledFrom(blockSizes).Draw(t, "bs")
		h, _ := NewHasher(bs)
		sys, sess, rag := drawSegmentN(t, "sys", 4*bs), drawSegmentN(t, "sess", 4*bs), drawSegmentN(t, "rag", 4*bs)
		whole := h.appendPrefix(nil, sys, sess, rag)
		part := h.appendPrefix(nil, sys, "", "")
		part = h.appendPrefix(part, "", sess, "")
		part = h.appendPrefix(part, "", "", rag)
		require.Equal(t, whole, part)
		seg := h.AppendSegment(nil, SegmentSystem, sys)
		seg = h.AppendSegment(seg, SegmentSession, sess)
		seg = h.AppendSegment(seg, SegmentRAG, rag)
		require.Equal(t, whole, seg)
	})
}

// TestPropTokenKeys: token keys use full blocks only, chain on their
// parent, and two token sequences share exactly as many elements as their
// leading full blocks agree.
func TestPropTokenKeys(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bs := rapid.IntRange(1, 8).Draw(t, "bs")
		a := rapid.SliceOfN(rapid.Uint32Range(0, 3), 0, 60).Draw(t, "a")
		cut := rapid.IntRange(0, len(a)).Draw(t, "cut")
		b := append(append([]uint32(nil), a[:cut]...), rapid.SliceOfN(rapid.Uint32Range(0, 3), 0, 30).Draw(t, "bsuffix")...)
		ka, err := AppendTokens(nil, a, bs)
		require.NoError(t, err)
		kb, err := AppendTokens(nil, b, bs)
		require.NoError(t, err)
		require.Len(t, ka, len(a)/bs, "full blocks only")
		full, err := AppendTokens(nil, a[:len(a)/bs*bs], bs)
		require.NoError(t, err)
		require.Equal(t, full, ka, "a partial last block adds nothing")
		want := 0
		for want < len(a)/bs && want < len(b)/bs && slices.Equal(a[want*bs:(want+1)*bs], b[want*bs:(want+1)*bs]) {
			want++
		}
		require.Equal(t, want, commonPrefix(ka, kb))
		for j := want; j < min(len(ka), len(kb)); j++ {
			require.NotEqual(t, ka[j], kb[j])
		}
	})
}

// TestPropHashKeys: hash-id keys share exactly as many elements as their
// id lists agree.
func TestPropHashKeys(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := rapid.SliceOfN(rapid.Uint64Range(0, 3), 0, 20).Draw(t, "a")
		cut := rapid.IntRange(0, len(a)).Draw(t, "cut")
		b := append(append([]uint64(nil), a[:cut]...), rapid.SliceOfN(rapid.Uint64Range(0, 3), 0, 20).Draw(t, "bsuffix")...)
		ka, kb := AppendHashes(nil, a), AppendHashes(nil, b)
		require.Len(t, ka, len(a))
		want := 0
		for want < len(a) && want < len(b) && a[want] == b[want] {
			want++
		}
		require.Equal(t, want, commonPrefix(ka, kb))
		for j := want; j < min(len(ka), len(kb)); j++ {
			require.NotEqual(t, ka[j], kb[j])
		}
	})
}

// TestPropHashKeyContinues: appending ids to a hash key continues its
// chain, so a key can be built in parts (a prompt, then its answer).
func TestPropHashKeyContinues(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := rapid.SliceOfN(rapid.Uint64Range(0, 3), 0, 10).Draw(t, "a")
		b := rapid.SliceOfN(rapid.Uint64Range(0, 3), 0, 10).Draw(t, "b")
		require.Equal(t, AppendHashes(nil, append(slices.Clone(a), b...)), AppendHashes(AppendHashes(nil, a), b))
	})
}

// TestKeyKindsDoNotCollide: the same content as text, tokens or hash ids
// gives different keys.
func TestKeyKindsDoNotCollide(t *testing.T) {
	tk, err := AppendTokens(nil, []uint32{1, 2, 3, 4}, 4)
	require.NoError(t, err)
	hk := AppendHashes(nil, []uint64{1})
	h, _ := NewHasher(16)
	txt := h.appendPrefix(nil, "\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00\x04\x00\x00\x00", "", "")
	assert.NotEqual(t, tk[0], hk[0])
	assert.NotEqual(t, tk[0], txt[0])
	assert.NotEqual(t, hk[0], txt[0])
}

// TestChainNoZeroCollapse: Key[i] must identify blocks 0..i. A bare
// multiply-fold is zero whenever one operand is zero, so a block whose
// hash is the fold's constant would erase its parent. Regression test for
// BUG 2 (fixed in 09e6776).
func TestChainNoZeroCollapse(t *testing.T) {
	const blockConst = 0xe7037ed1a0b428db
	a := AppendHashes(nil, []uint64{1, blockConst, 7})
	b := AppendHashes(nil, []uint64{2, blockConst, 7})
	require.NotEqual(t, a[0], b[0])
	assert.NotEqual(t, a[1], b[1], "prefixes differing in block 0 must differ at element 1")
	assert.NotEqual(t, a[2], b[2], "prefixes differing in block 0 must differ at element 2")
	assert.NotEqual(t, chain(1, blockConst), chain(2, blockConst))
	assert.NotEqual(t, chain(0xa0761d6478bd642f, 1), chain(0xa0761d6478bd642f, 2))
}

// TestAppendKeysAllocateNothing: with a big enough buffer the Append forms
// allocate nothing.
func TestAppendKeysAllocateNothing(t *testing.T) {
	h, err := NewHasher(TextBlockBytes)
	require.NoError(t, err)
	prompt := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 100)
	tokens := make([]uint32, 4096)
	for i := range tokens {
		tokens[i] = uint32(i * 7919)
	}
	ids := make([]uint64, 512)
	for i := range ids {
		ids[i] = uint64(i)
	}
	buf := make(Key, 0, 4096)
	tests := []struct {
		name string
		fn   func()
	}{
		{"AppendSegment", func() { buf = h.appendPrefix(buf[:0], prompt, "sess-42", prompt) }},
		{"AppendSegment", func() { buf = h.AppendSegment(buf[:0], 99, prompt) }},
		{"AppendTokens/16", func() { buf, _ = AppendTokens(buf[:0], tokens, 16) }},
		{"AppendTokens/1000", func() { buf, _ = AppendTokens(buf[:0], tokens, 1000) }},
		{"AppendHashes", func() { buf = AppendHashes(buf[:0], ids) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.fn()
			require.NotEmpty(t, buf)
			assert.Zero(t, testing.AllocsPerRun(100, tt.fn))
		})
	}
}

// TestKeyValuesPinned: the values of token, hash and text keys are those
// the package computed before keys had roles (commit c18edf1, via
// KeyFromTokens, KeyFromHashes and PrefixKey), so indexes and keys built
// by earlier versions, such as kvevents', stay valid.
func TestKeyValuesPinned(t *testing.T) {
	toks := make([]uint32, 100)
	for i := range toks {
		toks[i] = uint32(i*7919 + 13)
	}
	for _, tc := range []struct {
		bs   int
		want Key
	}{
		{16, Key{0x6754b68614a6f7b2, 0x50a7e53218643bff, 0x6160c77823bab841, 0x3f7e43c08fcdb378, 0x3c0107a0f1716a9d, 0xfc5f75e24aee909}},
		{64, Key{0x33dab3c71d44d8f0}},
		{100, Key{0xc2c467f07012be42}},
	} {
		got, err := AppendTokens(nil, toks, tc.bs)
		require.NoError(t, err)
		assert.Equal(t, tc.want, got, "block size %d", tc.bs)
	}
	assert.Equal(t, Key{0x86daa3ceffc0d71, 0x468a2364c816bb5b, 0xe2ee7656e588419b}, AppendHashes(nil, []uint64{1, 2, 3}))
	assert.Equal(t, Key{0x28c119f1a8896b15, 0x83e91af713427ea, 0xca4eb0de8877a4fc}, PrefixKey("You are a helpful assistant.", "sess-42", "doc-hash"))
}

// TestAppendContinues: AppendTokens and AppendHashes continue the chain of
// the key they are given, so a key built a piece at a time equals the key
// built at once; the first piece starts from the fixed root.
func TestAppendContinues(t *testing.T) {
	toks := make([]uint32, 64)
	for i := range toks {
		toks[i] = uint32(i)
	}
	whole, err := AppendTokens(nil, toks, 16)
	require.NoError(t, err)
	half, err := AppendTokens(nil, toks[:32], 16)
	require.NoError(t, err)
	rest, err := AppendTokens(half, toks[32:], 16)
	require.NoError(t, err)
	assert.Equal(t, whole, rest)
	assert.Equal(t, AppendHashes(nil, []uint64{1, 2, 3, 4}), AppendHashes(AppendHashes(nil, []uint64{1, 2}), []uint64{3, 4}))
}

// TestSegmentRoles: every role tags its segment apart, roles of the
// caller's own included, and the same text in one role is the same key.
func TestSegmentRoles(t *testing.T) {
	seen := map[uint64]Segment{}
	for s := range Segment(255) {
		k := defaultHasher.AppendSegment(nil, s, "same text")
		require.Len(t, k, 1)
		if prev, ok := seen[k[0]]; ok {
			t.Fatalf("roles %d and %d hash alike", prev, s)
		}
		seen[k[0]] = s
		assert.Equal(t, k, defaultHasher.AppendSegment(nil, s, "same text"))
	}
}

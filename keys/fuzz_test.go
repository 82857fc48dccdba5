package keys

import (
	"encoding/binary"
	"errors"
	"slices"
	"testing"
)

// Fuzz targets of prefix-key building: request text, token ids and hash
// ids reach it from clients, so every input must give a key (or, for a bad
// block size, ErrInvalid) without panicking, and the chain
// property must hold: two keys share exactly as many leading elements as
// their leading blocks agree, and differ at every position after that.
// The seeds are below (f.Add); run one with, e.g.,
//
//	go test -run '^$' -fuzz '^FuzzHasherSegments$' -fuzztime 1m ./keys

// agreeAfter fails t unless a and b share exactly want leading elements
// and differ at every later position both have.
func agreeAfter(t *testing.T, a, b Key, want int) {
	t.Helper()
	if got := commonPrefix(a, b); got != want {
		t.Fatalf("keys share %d leading elements, want %d", got, want)
	}
	for j := want; j < min(len(a), len(b)); j++ {
		if a[j] == b[j] {
			t.Fatalf("element %d equal after divergence at %d", j, want)
		}
	}
}

// FuzzHasherSegments: Hasher.AppendSegment and PrefixKey on any block size
// and segments. A second key, built from a's segments cut at cut and
// continued with other, checks the chain property against the plain block
// model refBlocks.
func FuzzHasherSegments(f *testing.F) {
	f.Add(TextBlockBytes, "You are a helpful assistant.", "session-42", "", "other", 10)
	f.Add(1, "ab", "c", "", "bc", 1)
	f.Add(32, string(make([]byte, 100)), "", string(make([]byte, 64)), "\x00", 64)
	f.Add(3, "abcabcabc", "abc", "abcd", "abd", 5)
	f.Add(0, "x", "", "", "", 0)
	f.Add(-7, "x", "y", "z", "", 0)
	f.Add(96, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "", "", "b", 95)
	f.Add(1<<40, "huge block size", "", "", "", 3)
	f.Fuzz(func(t *testing.T, bs int, sys, sess, rag, other string, cut int) {
		h, err := NewHasher(bs)
		if bs < 1 {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("NewHasher(%d) = %v, want ErrInvalid", bs, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("NewHasher(%d): %v", bs, err)
		}
		roles := []Segment{SegmentSystem, SegmentSession, SegmentRAG}
		tags := []uint64{tagSystem, tagSession, tagRAG}
		a := []string{sys, sess, rag}
		ka := h.appendPrefix(nil, sys, sess, rag)
		ra := refBlocks(bs, tags, a)
		if len(ka) != len(ra) {
			t.Fatalf("key has %d elements, want %d blocks", len(ka), len(ra))
		}
		if bs == TextBlockBytes && !slices.Equal(PrefixKey(sys, sess, rag), ka) {
			t.Fatal("PrefixKey differs from a Hasher of TextBlockBytes")
		}
		var seg Key
		for i, s := range a {
			seg = h.AppendSegment(seg, roles[i], s)
		}
		if !slices.Equal(seg, ka) {
			t.Fatal("AppendSegment by segment differs from Key")
		}
		buf := make(Key, 0, len(ka)+1)
		if got := h.appendPrefix(buf, sys, sess, rag); !slices.Equal(got, ka) || (len(got) > 0 && &got[0] != &buf[:1][0]) {
			t.Fatal("appending into a buffer with room differs or reallocated")
		}

		// b: each segment of a cut at cut (mod its length + 1), then other.
		b := make([]string, 3)
		for i, s := range a {
			c := cut % (len(s) + 1)
			if c < 0 {
				c = -c
			}
			b[i] = s[:c] + other
		}
		kb := h.appendPrefix(nil, b[0], b[1], b[2])
		rb := refBlocks(bs, tags, b)
		if len(kb) != len(rb) {
			t.Fatalf("key has %d elements, want %d blocks", len(kb), len(rb))
		}
		agreeAfter(t, ka, kb, refAgree(ra, rb))
	})
}

// tokensOf reads raw as little-endian uint32 token ids.
func tokensOf(raw []byte) []uint32 {
	out := make([]uint32, len(raw)/4)
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(raw[4*i:])
	}
	return out
}

// FuzzAppendTokens: AppendTokens on any block size and tokens (raw bytes
// read as little-endian uint32). The key has one element per full block;
// appending into a buffer with room gives the same key; a prefix of the
// tokens keys a prefix of the key, and continuing it with the rest (cut
// at a block boundary) keys the whole; changing token at gives keys that
// agree exactly on the blocks before it.
func FuzzAppendTokens(f *testing.F) {
	f.Add(16, []byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123"), 20)
	f.Add(1, []byte{1, 0, 0, 0, 2, 0, 0, 0}, 1)
	f.Add(65, make([]byte, 4*200), 130)
	f.Add(0, []byte{1, 2, 3, 4}, 0)
	f.Add(-1, []byte{}, 0)
	f.Add(1<<40, []byte{1, 2, 3, 4}, 0)
	f.Fuzz(func(t *testing.T, bs int, raw []byte, at int) {
		tokens := tokensOf(raw)
		k, err := AppendTokens(nil, tokens, bs)
		if bs < 1 {
			if !errors.Is(err, ErrInvalid) || len(k) != 0 {
				t.Fatalf("AppendTokens(nil, block size %d) = %v, %v; want ErrInvalid", bs, k, err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(k) != len(tokens)/bs {
			t.Fatalf("%d elements for %d tokens in blocks of %d", len(k), len(tokens), bs)
		}
		buf := make(Key, 0, len(k)+1)
		if got, err := AppendTokens(buf, tokens, bs); err != nil || !slices.Equal(got, k) {
			t.Fatal("AppendTokens into a buffer differs from AppendTokens(nil, ...)")
		}
		if len(tokens) == 0 {
			return
		}
		at %= len(tokens)
		if at < 0 {
			at = -at
		}
		pre, err := AppendTokens(nil, tokens[:at], bs)
		if err != nil || !slices.Equal(pre, k[:at/bs]) {
			t.Fatalf("the first %d tokens do not key the first %d elements", at, at/bs)
		}
		if cut := at / bs * bs; cut > 0 {
			whole, err := AppendTokens(slices.Clone(k[:cut/bs]), tokens[cut:], bs)
			if err != nil || !slices.Equal(whole, k) {
				t.Fatalf("continuing the key of the first %d tokens with the rest differs from the whole", cut)
			}
		}
		changed := slices.Clone(tokens)
		changed[at]++
		kc, err := AppendTokens(nil, changed, bs)
		if err != nil {
			t.Fatal(err)
		}
		agreeAfter(t, k, kc, min(at/bs, len(k)))
	})
}

// idsOf reads raw as little-endian uint64 hash ids.
func idsOf(raw []byte) []uint64 {
	out := make([]uint64, len(raw)/8)
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(raw[8*i:])
	}
	return out
}

// FuzzAppendHashes: AppendHashes on any hash ids (raw bytes read as
// little-endian uint64). One element per id; continuing a key with
// AppendHashes is keying the concatenation; changing id at gives keys
// that agree exactly on the ids before it.
func FuzzAppendHashes(f *testing.F) {
	f.Add([]byte("0123456789abcdef0123456789abcdef"), 2)
	f.Add(make([]byte, 64), 3)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 0)
	f.Add([]byte{}, 0)
	f.Fuzz(func(t *testing.T, raw []byte, at int) {
		ids := idsOf(raw)
		k := AppendHashes(nil, ids)
		if len(k) != len(ids) {
			t.Fatalf("%d elements for %d ids", len(k), len(ids))
		}
		if len(ids) == 0 {
			return
		}
		at %= len(ids)
		if at < 0 {
			at = -at
		}
		if got := AppendHashes(AppendHashes(nil, ids[:at]), ids[at:]); !slices.Equal(got, k) {
			t.Fatalf("AppendHashes(AppendHashes(nil, ids[:%d]), ids[%d:]) differs from AppendHashes(nil, ids)", at, at)
		}
		changed := slices.Clone(ids)
		changed[at]++
		agreeAfter(t, k, AppendHashes(nil, changed), at)
	})
}

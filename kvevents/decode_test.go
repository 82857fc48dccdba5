package kvevents

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

// got is a decoded event, copied out of the Decoder's buffers.
type got struct {
	kind      Kind
	hashes    []uint64
	parent    uint64
	hasParent bool
	tokens    []uint32
	bs        int
	lora      string
	medium    string
	plain     int
	err       error
}

func decodeAll(t testing.TB, d *Decoder, payload []byte) ([]got, error) {
	t.Helper()
	var out []got
	err := d.Decode(payload, func(ev *Event, err error) {
		if err != nil {
			out = append(out, got{kind: ev.Kind, err: err})
			return
		}
		out = append(out, got{kind: ev.Kind, hashes: orNil(ev.Hashes), parent: ev.Parent, hasParent: ev.HasParent,
			tokens: orNil(ev.Tokens), bs: ev.BlockSize, lora: string(ev.LoRA), medium: string(ev.Medium), plain: ev.Plain})
	})
	return out, err
}

func orNil[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return slices.Clone(s)
}

func TestDecodeBothEncodings(t *testing.T) {
	sha := bytes.Repeat([]byte{0xab}, 24)
	sha = append(sha, 1, 2, 3, 4, 5, 6, 7, 8)
	root := stored{hashes: []uint64{11, 12}, parent: nil, tokens: seqTokens(100, 32), bs: 16, medium: "GPU"}
	child := stored{hashes: []uint64{13}, parent: uint64(12), tokens: seqTokens(200, 16), bs: 16, medium: "GPU", lora: "adapter-a"}
	zeroParent := stored{hashes: []uint64{14}, parent: uint64(0), tokens: seqTokens(300, 16), bs: 16, medium: "GPU"}
	byteParent := stored{hashes: []uint64{15}, parent: sha, tokens: seqTokens(400, 16), bs: 16}
	want := []got{
		{kind: BlockStored, hashes: []uint64{11, 12}, tokens: seqTokens(100, 32), bs: 16, medium: "GPU", plain: 2},
		{kind: BlockStored, hashes: []uint64{13}, parent: 12, hasParent: true, tokens: seqTokens(200, 16), bs: 16, medium: "GPU", lora: "adapter-a", plain: 1},
		{kind: BlockStored, hashes: []uint64{14}, tokens: seqTokens(300, 16), bs: 16, medium: "GPU", plain: 1},
		{kind: BlockStored, hashes: []uint64{15}, parent: 0x0102030405060708, hasParent: true, tokens: seqTokens(400, 16), bs: 16, plain: 1},
		{kind: BlockRemoved, hashes: []uint64{11, 13}, medium: "GPU", plain: 2},
		{kind: AllBlocksCleared, plain: 0},
	}
	for _, tc := range []struct {
		name    string
		payload any
	}{
		{"arrays", arrayBatch(root.array(), child.array(), zeroParent.array(), byteParent.array(), removedArray("GPU", 11, 13), clearedArray())},
		{"maps", mapBatch(root.mapped(), child.mapped(), zeroParent.mapped(), byteParent.mapped(), removedMap("GPU", 11, 13), clearedMap())},
		{"array batch of map events", arrayBatch(root.mapped(), child.mapped(), zeroParent.mapped(), byteParent.mapped(), removedMap("GPU", 11, 13), clearedMap())},
		{"map batch of array events", mapBatch(root.array(), child.array(), zeroParent.array(), byteParent.array(), removedArray("GPU", 11, 13), clearedArray())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			evs, err := decodeAll(t, NewDecoder(Limits{}), pack(t, tc.payload))
			require.NoError(t, err)
			require.Equal(t, want, evs)
		})
	}
}

func TestDecodeHashForms(t *testing.T) {
	neg := int64(-5)
	for _, tc := range []struct {
		name string
		h    any
		want uint64
	}{
		{"fixint", 7, 7},
		{"uint64 max", uint64(1<<64 - 1), 1<<64 - 1},
		{"negative (Python hash())", neg, uint64(1<<64 - 5)},
		{"int8 negative", int8(-1), 1<<64 - 1},
		{"32 bytes (sha256)", append(bytes.Repeat([]byte{0xff}, 24), 0, 0, 0, 0, 0, 0, 1, 0), 256},
		{"3 bytes", []byte{1, 0, 0}, 0x10000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			evs, err := decodeAll(t, NewDecoder(Limits{}), pack(t, arrayBatch([]any{"BlockRemoved", []any{tc.h}, nil})))
			require.NoError(t, err)
			require.Len(t, evs, 1)
			require.NoError(t, evs[0].err)
			require.Equal(t, []uint64{tc.want}, evs[0].hashes)
		})
	}
}

func TestDecodeExtraKeys(t *testing.T) {
	s := stored{hashes: []uint64{1, 2, 3}, tokens: seqTokens(0, 48), bs: 16, extra: []any{nil, []any{"mm-hash", 3}, nil}}
	for _, p := range []any{arrayBatch(s.array()), mapBatch(s.mapped())} {
		evs, err := decodeAll(t, NewDecoder(Limits{}), pack(t, p))
		require.NoError(t, err)
		require.Equal(t, 1, evs[0].plain, "blocks before the first with extra keys")
	}
}

// TestDecodeTrailingFields: newer vLLM appends fields (group_idx,
// kv_cache_spec_kind...), older omits trailing defaults; both decode.
func TestDecodeTrailingFields(t *testing.T) {
	short := []any{"BlockStored", []any{1}, nil, seqTokens(0, 4), 4}
	long := []any{"BlockStored", []any{1}, nil, seqTokens(0, 4), 4, nil, "GPU", nil, nil, 0, "full_attention", nil, "future", []any{1, 2}}
	removed := []any{"BlockRemoved", []any{1}, "GPU", 0, "future"}
	cleared := []any{"AllBlocksCleared", "GPU"}
	evs, err := decodeAll(t, NewDecoder(Limits{}), pack(t, arrayBatch(short, long, removed, cleared)))
	require.NoError(t, err)
	require.Len(t, evs, 4)
	for _, e := range evs {
		require.NoError(t, e.err)
	}
}

// TestDecodeBadEvents: a bad event is reported with the field and value
// and skipped; the events around it still decode.
func TestDecodeBadEvents(t *testing.T) {
	good := stored{hashes: []uint64{1}, tokens: seqTokens(0, 16), bs: 16}.array()
	for _, tc := range []struct {
		name string
		ev   any
		is   error
		msg  string
	}{
		{"unknown array tag", []any{"BlockMoved", []any{1}}, ErrUnknownEvent, `"BlockMoved"`},
		{"unknown map tag", map[string]any{"type": "BlockMoved", "block_hashes": []any{1}}, ErrUnknownEvent, `"BlockMoved"`},
		{"tag not a string", []any{7, []any{1}}, ErrMalformed, "event type is a integer"},
		{"map without type", map[string]any{"block_hashes": []any{1}}, ErrMalformed, `no "type"`},
		{"empty array", []any{}, ErrMalformed, "empty event"},
		{"event is a string", "BlockStored", ErrMalformed, "event is a string"},
		{"hashes not an array", []any{"BlockRemoved", "x", nil}, ErrMalformed, "block_hashes is a string"},
		{"hash a float", []any{"BlockRemoved", []any{1.5}, nil}, ErrMalformed, "block_hashes[0] is a float"},
		{"hash empty bytes", []any{"BlockRemoved", []any{[]byte{}}, nil}, ErrMalformed, "block_hashes[0] is a 0-byte"},
		{"hash over-long bytes", []any{"BlockRemoved", []any{make([]byte, 65)}, nil}, ErrMalformed, "65-byte"},
		{"parent a bool", []any{"BlockStored", []any{1}, true, seqTokens(0, 16), 16}, ErrMalformed, "parent_block_hash is a bool"},
		{"token negative", []any{"BlockStored", []any{1}, nil, append([]any{-1}, anys(seqTokens(0, 15))...), 16}, ErrMalformed, "token_ids[0] is -1"},
		{"token too big", []any{"BlockStored", []any{1}, nil, append([]any{uint64(1) << 32}, anys(seqTokens(0, 15))...), 16}, ErrMalformed, "token_ids[0] is 4294967296"},
		{"token past int64", []any{"BlockStored", []any{1}, nil, append([]any{uint64(1) << 63}, anys(seqTokens(0, 15))...), 16}, ErrMalformed, "token_ids[0] is 9223372036854775808,"},
		{"block size past int64", []any{"BlockStored", []any{1}, nil, []any{}, uint64(1) << 63}, ErrMalformed, "block_size is 9223372036854775808,"},
		{"token a string", []any{"BlockStored", []any{1}, nil, []any{"a"}, 1}, ErrMalformed, "token_ids[0] is a string"},
		{"token nil", []any{"BlockStored", []any{1}, nil, []any{nil}, 1}, ErrMalformed, "token_ids[0] is a nil"},
		{"block size zero", []any{"BlockStored", []any{1}, nil, []any{}, 0}, ErrMalformed, "block_size is 0"},
		{"block size a string", []any{"BlockStored", []any{1}, nil, []any{}, "16"}, ErrMalformed, "block_size is a string"},
		{"token count mismatch", []any{"BlockStored", []any{1, 2}, nil, seqTokens(0, 16), 16}, ErrMalformed, "16 token_ids for 2 blocks of 16"},
		{"missing block size", []any{"BlockStored", []any{1}, nil, seqTokens(0, 16)}, ErrMalformed, "no block_size"},
		{"medium an int", []any{"BlockRemoved", []any{1}, 3}, ErrMalformed, "medium is a integer"},
		{"lora name too long", []any{"BlockStored", []any{1}, nil, seqTokens(0, 16), 16, nil, nil, strings.Repeat("x", 300)}, ErrLimit, "lora_name of 300 bytes"},
		{"map key not a string", map[any]any{1: 2, "type": "AllBlocksCleared"}, ErrMalformed, "non-string"},
		{"too many hashes", []any{"BlockRemoved", anys(seqTokens(0, 1000)), nil}, ErrLimit, "1000 block_hashes, limit 100"},
		{"too many tokens", []any{"BlockStored", []any{1}, nil, seqTokens(0, 2000), 2000}, ErrLimit, "2000 token_ids, limit 1000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDecoder(Limits{MaxBlocks: 100, MaxTokens: 1000})
			evs, err := decodeAll(t, d, pack(t, arrayBatch(good, tc.ev, good)))
			require.NoError(t, err)
			require.Len(t, evs, 3)
			require.NoError(t, evs[0].err)
			require.ErrorIs(t, evs[1].err, tc.is)
			require.Contains(t, evs[1].err.Error(), tc.msg)
			require.NoError(t, evs[2].err)
			require.Equal(t, []uint64{1}, evs[2].hashes)
		})
	}
}

func anys[T any](v []T) []any {
	out := make([]any, len(v))
	for i, x := range v {
		out[i] = x
	}
	return out
}

// TestDecodeBadBatches: a payload that is not a readable batch fails as a
// whole with a message naming what was wrong.
func TestDecodeBadBatches(t *testing.T) {
	good := pack(t, arrayBatch(clearedArray()))
	deep := bytes.Repeat([]byte{0x91}, 100000) // 100k nested one-element arrays
	deep = append(deep, 0xc0)
	for _, tc := range []struct {
		name    string
		payload []byte
		is      error
		msg     string
	}{
		{"empty", nil, ErrMalformed, "EOF"},
		{"garbage code", []byte{0xc1, 0, 0}, ErrMalformed, "invalid msgpack code 0xc1"},
		{"a string", pack(t, "hello"), ErrMalformed, "batch is a string"},
		{"short array", pack(t, []any{1.0}), ErrMalformed, "array of 1 elements"},
		{"ts a string", pack(t, []any{"x", []any{}}), ErrMalformed, "batch ts is a string"},
		{"events a map", pack(t, []any{1.0, map[string]any{}}), ErrMalformed, "batch events is a map"},
		{"map without events", pack(t, map[string]any{"ts": 1.0}), ErrMalformed, "no events"},
		{"truncated", good[:len(good)-1], ErrMalformed, "EOF"},
		{"trailing bytes", append(slices.Clone(good), 0xc0), ErrMalformed, "1 trailing bytes"},
		{"claims 2^32-1 events", []byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff}, ErrLimit, "4294967295 events"},
		{"claims 2^32-1 hashes", []byte{0x92, 0x00, 0x91, 0x93, 0xac, 'B', 'l', 'o', 'c', 'k', 'R', 'e', 'm', 'o', 'v', 'e', 'd', 0xdd, 0xff, 0xff, 0xff, 0xff}, ErrMalformed, "EOF"},
		{"claims a 4 GiB string", []byte{0x92, 0x00, 0x91, 0x91, 0xdb, 0xff, 0xff, 0xff, 0xff}, ErrMalformed, "EOF"},
		{"deep nesting", append([]byte{0x92, 0x00, 0x91, 0x92, 0xb0, 'A', 'l', 'l', 'B', 'l', 'o', 'c', 'k', 's', 'C', 'l', 'e', 'a', 'r', 'e', 'd'}, deep...), ErrMalformed, "nested deeper than 32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeAll(t, NewDecoder(Limits{}), tc.payload)
			require.ErrorIs(t, err, tc.is)
			require.Contains(t, err.Error(), tc.msg)
		})
	}
}

// TestDecodeMillionElementArrays: arrays of 10^6 elements (hashes,
// events; 2·10^6 tokens, as a 10^6-token prompt is allowed) are refused
// as over the limits without the decoder holding them: its buffers stay
// small.
func TestDecodeMillionElementArrays(t *testing.T) {
	// bigArray is a msgpack array32 of n copies of the one-byte value v.
	bigArray := func(n int, v byte) []byte {
		b := []byte{0xdd, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
		return append(b, bytes.Repeat([]byte{v}, n)...)
	}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	head := []byte{0x93, 0x00, 0x91} // [ts=0, [one event], ...
	tail := []byte{0x00}             // ..., dp_rank=0]
	d := NewDecoder(Limits{})
	for _, p := range [][]byte{
		cat(head, []byte{0x93}, pack(t, "BlockRemoved"), bigArray(1_000_000, 0x01), []byte{0xc0}, tail),
		cat(head, []byte{0x95}, pack(t, "BlockStored"), []byte{0x91, 0x01, 0xc0}, bigArray(2_000_000, 0x01), pack(t, 2_000_000), tail),
		cat(head, []byte{0x84}, pack(t, "type"), pack(t, "BlockStored"), pack(t, "token_ids"), bigArray(1_000_000, 0x02),
			pack(t, "block_hashes"), bigArray(1_000_000, 0x03), pack(t, "block_size"), []byte{0x01}, tail),
	} {
		evs, err := decodeAll(t, d, p)
		require.NoError(t, err)
		require.Len(t, evs, 1)
		require.ErrorIs(t, evs[0].err, ErrLimit)
	}
	require.LessOrEqual(t, cap(d.ev.Hashes), DefaultMaxBlocks)
	require.LessOrEqual(t, cap(d.ev.Tokens), 2*DefaultMaxTokens)

	events := cat([]byte{0x93, 0x00}, bigArray(1_000_000, 0x90), tail) // a million empty events
	_, err := decodeAll(t, d, events)
	require.ErrorIs(t, err, ErrLimit)
	require.Contains(t, err.Error(), "1000000 events")
}

func TestFrames(t *testing.T) {
	topic, seq, payload, err := Frames(frames("kv@pod@model", 42, []byte{1}))
	require.NoError(t, err)
	require.Equal(t, "kv@pod@model", string(topic))
	require.Equal(t, uint64(42), seq)
	require.Equal(t, []byte{1}, payload)
	_, _, _, err = Frames([][]byte{{1}, {2}})
	require.ErrorIs(t, err, ErrMalformed)
	require.Contains(t, err.Error(), "2 frames")
	_, _, _, err = Frames([][]byte{{1}, {2, 3}, {4}})
	require.ErrorIs(t, err, ErrMalformed)
	require.Contains(t, err.Error(), "sequence frame of 2 bytes")
}

// TestDecodeDoesNotAllocate: decoding a batch allocates nothing once the
// buffers have grown.
func TestDecodeDoesNotAllocate(t *testing.T) {
	p := pack(t, mapBatch(stored{hashes: []uint64{1, 2}, tokens: seqTokens(0, 32), bs: 16, lora: "a", medium: "GPU"}.mapped(),
		removedArray("GPU", 1), clearedArray()))
	d := NewDecoder(Limits{})
	n := 0
	fn := func(ev *Event, err error) { n++ }
	allocs := testing.AllocsPerRun(100, func() {
		if err := d.Decode(p, fn); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs)
	require.Positive(t, n)
}

// TestDecodeDuplicateMapKeys: a map-encoded event naming a field twice is
// malformed. Before, each block_hashes or token_ids array was appended to
// the last, so a payload could pass MaxBlocks and MaxTokens (and the
// memory they bound in the Decoder's buffers) by repeating the key, each
// array within the limit.
func TestDecodeDuplicateMapKeys(t *testing.T) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	const reps, per = 10, 4 // 40 blocks of 1 token, limits 4 blocks and 8 tokens
	must(enc.EncodeArrayLen(2))
	must(enc.EncodeFloat64(1))
	must(enc.EncodeArrayLen(1))
	must(enc.EncodeMapLen(3 + 2*reps))
	must(enc.EncodeString("type"))
	must(enc.EncodeString("BlockStored"))
	must(enc.EncodeString("parent_block_hash"))
	must(enc.EncodeNil())
	must(enc.EncodeString("block_size"))
	must(enc.EncodeInt(1))
	for i := range reps {
		for _, key := range []string{"block_hashes", "token_ids"} {
			must(enc.EncodeString(key))
			must(enc.EncodeArrayLen(per))
			for j := range per {
				must(enc.EncodeInt(int64(1 + i*per + j)))
			}
		}
	}
	d := NewDecoder(Limits{MaxBlocks: per, MaxTokens: 2 * per})
	var hashes, tokens int
	var evErr error
	err := d.Decode(buf.Bytes(), func(ev *Event, err error) {
		hashes, tokens, evErr = len(ev.Hashes), len(ev.Tokens), err
	})
	require.NoError(t, err)
	require.ErrorIs(t, evErr, ErrMalformed, "an event with block_hashes and token_ids %d times each (%d hashes, %d tokens decoded)", reps, hashes, tokens)
	require.LessOrEqual(t, hashes, per)
	require.LessOrEqual(t, tokens, 2*per)
}

package kvevents

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// fuzzSeeds are well-formed and broken payloads of both encodings.
func fuzzSeeds(t fataler) [][]byte {
	root := stored{hashes: []uint64{1, 2}, tokens: seqTokens(1, 8), bs: 4, medium: "GPU"}
	child := stored{hashes: []uint64{3}, parent: uint64(2), tokens: seqTokens(9, 4), bs: 4, lora: "a"}
	sha := stored{hashes: []uint64{4}, parent: bytes.Repeat([]byte{7}, 32), tokens: seqTokens(1, 4), bs: 4,
		extra: []any{[]any{"mm", 1}}}
	return [][]byte{
		pack(t, arrayBatch(root.array(), child.array(), removedArray("GPU", 1, 3), clearedArray())),
		pack(t, mapBatch(root.mapped(), child.mapped(), sha.mapped(), removedMap(nil, 2), clearedMap())),
		pack(t, arrayBatch([]any{"BlockStored", []any{1}, nil, seqTokens(0, 4), 4, nil, "GPU", nil, nil, 0, "full_attention", nil})),
		pack(t, mapBatch(stored{hashes: []uint64{5}, parent: uint64(2), tokens: seqTokens(1, 8), bs: 4, lora: "a", loraID: 1,
			extra: []any{[]any{"a"}, []any{"a", "salt"}}}.mapped(), removedGroup(true, 1, 5))),
		pack(t, arrayBatch(stored{hashes: []uint64{6}, tokens: seqTokens(1, 8), bs: 4, group: 1, kind: "sliding_window"}.array(),
			removedGroup(false, 1, 2), stored{hashes: []uint64{7}, tokens: seqTokens(1, 4), bs: 4, loraID: 2}.array())),
		pack(t, arrayBatch([]any{"BlockMoved", 1}, []any{"BlockRemoved", "x"}, "event")),
		pack(t, mapBatch(map[string]any{"type": 5}, map[any]any{1: 2})),
		pack(t, []any{1.0}),
		{0x92, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff},
		{0x91, 0x91, 0x91, 0x91, 0x91, 0x91},
		{0xc1},
		nil,
	}
}

// FuzzDecode feeds arbitrary payloads to the Decoder and, as messages of
// an engine, to a Translator: no panic; every event delivered without an
// error is consistent; the decoder's buffers stay within its limits; and
// the index never holds a key its engine's map does not (so removals can
// always be applied).
func FuzzDecode(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s, uint8(1))
	}
	lim := Limits{MaxEvents: 64, MaxBlocks: 64, MaxTokens: 256}
	f.Fuzz(func(t *testing.T, payload []byte, step uint8) {
		d := NewDecoder(lim)
		_ = d.Decode(payload, func(ev *Event, err error) {
			if err != nil {
				return
			}
			switch ev.Kind {
			case BlockStored:
				if ev.BlockSize < 1 || fullAttention(ev.SpecKind) && len(ev.Tokens) != len(ev.Hashes)*ev.BlockSize {
					t.Fatalf("inconsistent BlockStored: %d tokens, %d hashes, block size %d", len(ev.Tokens), len(ev.Hashes), ev.BlockSize)
				}
				if ev.HasParent && ev.Parent == 0 {
					t.Fatal("parent 0 read as a parent")
				}
			case BlockRemoved, AllBlocksCleared:
			default:
				t.Fatalf("event of kind %v without an error", ev.Kind)
			}
			if ev.Plain < 0 || ev.Plain > len(ev.Hashes) {
				t.Fatalf("Plain %d of %d blocks", ev.Plain, len(ev.Hashes))
			}
		})
		if cap(d.ev.Hashes) > 2*lim.MaxBlocks || cap(d.ev.Tokens) > 2*lim.MaxTokens {
			t.Fatalf("buffers grew to %d hashes, %d tokens", cap(d.ev.Hashes), cap(d.ev.Tokens))
		}

		idx := newFakeIndex()
		tr := NewTranslator(podResolver(idx, func(tg *Target) { tg.BlockSize = 4; tg.MaxBlocks = 16 }), lim)
		root := pack(t, arrayBatch(stored{hashes: []uint64{1, 2}, tokens: seqTokens(1, 8), bs: 4}.array()))
		tr.Handle("e", frames(topicA, 1, root))
		tr.Handle("e", frames(topicA, 1+uint64(step%3), payload))
		tr.Handle("e", frames(topicA, 5, payload))
		e := tr.engines["10.0.0.1:8000"]
		mapped := map[uint64]bool{}
		for _, k := range e.blocks {
			mapped[k] = true
		}
		for _, k := range idx.keys("10.0.0.1:8000") {
			if !mapped[k] {
				t.Fatalf("index holds key %x the map does not", k)
			}
		}
		if len(e.blocks) > 16 {
			t.Fatalf("map of %d blocks over its bound", len(e.blocks))
		}
	})
}

// FuzzNextInt checks the integer fast path against the msgpack library:
// where nextInt reads an integer, the library reads the same value from
// the same number of bytes; where it does not, the library does not
// either (another kind of value, or a truncated one).
func FuzzNextInt(f *testing.F) {
	for _, v := range []any{0, 127, -1, -32, -33, 128, 255, 256, 65535, 65536, -129, -32769, uint64(1<<63 + 5),
		int64(-1 << 62), uint32(1 << 31), int32(-1 << 30), "x", nil, 1.5, []any{1}} {
		f.Add(pack(f, v))
	}
	f.Add([]byte{0xcf, 1, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		v, neg, size, ok := nextInt(b)
		br := bytes.NewReader(b)
		d := msgpack.NewDecoder(br) // reads br directly: what it leaves unread tells its size
		if !ok {
			if len(b) > 0 && kindOf(b[0]) == kInt {
				if _, err := d.DecodeUint64(); err == nil {
					t.Fatalf("nextInt refused % x, the library read it", b)
				}
			}
			return
		}
		if kindOf(b[0]) != kInt {
			t.Fatalf("nextInt read a %s", kindOf(b[0]))
		}
		lv, err := d.DecodeUint64()
		if err != nil {
			t.Fatalf("library: %v", err)
		}
		if lv != v {
			t.Fatalf("% x: nextInt %d, library %d", b, v, lv)
		}
		if used := len(b) - br.Len(); used != size {
			t.Fatalf("% x: nextInt took %d bytes, library %d", b, size, used)
		}
		li, err := msgpack.NewDecoder(bytes.NewReader(b)).DecodeInt64()
		if err != nil {
			t.Fatal(err)
		}
		if neg != (li < 0 && b[0] >= 0xd0 || b[0] >= 0xe0) {
			t.Fatalf("% x: neg %v, library %d", b, neg, li)
		}
	})
}

// FuzzDecodeTokens holds decodeTokens to encoding/json, which it
// replaces: any /tokenize answer is decoded as json.Unmarshal decodes it
// into struct{ Tokens *[]uint32 } (the same ids, or an error for both),
// except that decodeTokens refuses two "tokens" members and nesting deeper
// than jsonscan.MaxDepth; it asks need for no fewer ids than it returns,
// and never for more than the answer's bytes could carry.
func FuzzDecodeTokens(f *testing.F) {
	for _, s := range []string{`{"tokens":[1,2,3]}`, `{"tokens":[]}`, `{"tokens":null}`, `{}`, `{"tokens":[-1]}`,
		`{"tokens":[4294967296]}`, `{"count":3,"tokens":[7],"max_model_len":8}`, `[1,2]`, ``, `{"tokens":[1,2` + "\n",
		`{"TOKENS":[1]}`, `{"tokens":[1],"tokens":[2]}`, `{"tokens":[1,null,2]}`, `{"tokens":[1.0]}`, `{"tokens":[1e2]}`,
		`{"tokens":[ 1 , 2 ]} `, `{"tokens":"1"}`, `{"tokens":[01]}`, `{"tokens":[1]} x`, `null`, `{"tokens":[-0]}`,
		`{"tokens":["1"]}`, `{"a":"\u00e9\xff","tokens":[0]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		asked := -1
		toks, err := decodeTokens(b, func(n int) error { asked = n; return nil })
		var ref struct {
			Tokens *[]uint32 `json:"tokens"`
		}
		refErr := json.Unmarshal(b, &ref)
		if refErr == nil && ref.Tokens == nil {
			refErr = errors.New("no tokens")
		}
		if err != nil {
			if refErr == nil && !errors.Is(err, errTokensTwice) && !strings.Contains(err.Error(), "nesting deeper") {
				t.Fatalf("%q: refused (%v), encoding/json reads %v", b, err, *ref.Tokens)
			}
			return
		}
		if refErr != nil {
			t.Fatalf("%q: read %v, encoding/json refuses it: %v", b, toks, refErr)
		}
		if !slices.Equal(toks, *ref.Tokens) || toks == nil {
			t.Fatalf("%q: read %v, encoding/json %v", b, toks, *ref.Tokens)
		}
		if asked < len(toks) || 2*asked > len(b)+1 {
			t.Fatalf("%q: asked for %d ids, read %d", b, asked, len(toks))
		}
	})
}

// FuzzTokenizeBody holds appendTokenizeBody to encoding/json, which it
// replaces: the same bytes as an Encoder without HTML escaping writes
// (raw members compact, as the gateway passes them), of the length
// tokenizeBodySize said.
func FuzzTokenizeBody(f *testing.F) {
	f.Add("m", "hello", "")
	f.Add("m\"\\", "", `[{"role":"user","content":"x"}]`)
	f.Add("\u2028<&>", "a\x00\x1f\x7f\xff\xe2\x80\xa9\b\f\n\r\t", "")
	f.Fuzz(func(t *testing.T, model, prompt, messages string) {
		req := TokenizeRequest{Model: model, Prompt: prompt}
		if messages != "" {
			var buf bytes.Buffer
			if json.Compact(&buf, []byte(messages)) != nil {
				return
			}
			req.Messages = buf.Bytes()
			req.Tools = buf.Bytes()
		}
		got := appendTokenizeBody(nil, req)
		if len(got) != tokenizeBodySize(req) {
			t.Fatalf("%d bytes, size said %d", len(got), tokenizeBodySize(req))
		}
		var want bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(tokenizeBody(req)); err != nil {
			t.Fatal(err)
		}
		if w := bytes.TrimSuffix(want.Bytes(), []byte("\n")); !bytes.Equal(got, w) {
			t.Fatalf("wrote %s\nencoding/json %s", got, w)
		}
	})
}

// tokenizeBody is the /tokenize body as encoding/json would marshal it:
// the reference of FuzzTokenizeBody.
type tokenizeBody struct {
	Model              string          `json:"model"`
	Prompt             string          `json:"prompt,omitempty"`
	Messages           json.RawMessage `json:"messages,omitempty"`
	Tools              json.RawMessage `json:"tools,omitempty"`
	ChatTemplateKwargs json.RawMessage `json:"chat_template_kwargs,omitempty"`
}

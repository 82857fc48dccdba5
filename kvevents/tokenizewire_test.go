package kvevents

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"unicode/utf8"
)

// plainRunNaive is plainRun's specification: the length of s's prefix of
// bytes from 0x20 to 0x7f but '"' and '\\'.
func plainRunNaive(s string) int {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' {
			return i
		}
	}
	return len(s)
}

// TestPlainRunPairs: plainRun agrees with its specification on every word
// of eight bytes that holds any two byte values at any two positions, on
// a background of bytes next to the ones it must stop at (so that borrows
// between bytes are exercised), with 0 to 9 plain bytes before it and 0
// to 9 after it (the tail loop and a second word).
func TestPlainRunPairs(t *testing.T) {
	fills := []byte{' ', '!', '#', '[', ']', 'a', 0x7f, 0x40}
	if testing.Short() {
		fills = fills[:2] // -race -short in CI: the background bytes next to '"' and the lowest
	}
	var buf [8]byte
	for _, fill := range fills {
		for p := 0; p < 8; p++ {
			for q := p; q < 8; q++ {
				for a := 0; a < 256; a++ {
					for b := 0; b < 256; b++ {
						for i := range buf {
							buf[i] = fill
						}
						buf[p], buf[q] = byte(a), byte(b)
						s := string(buf[:])
						if got, want := plainRun(s), plainRunNaive(s); got != want {
							t.Fatalf("plainRun(%q) = %d, want %d", s, got, want)
						}
					}
				}
			}
		}
	}
	// Offsets into longer strings.
	for pre := 0; pre <= 9; pre++ {
		for post := 0; post <= 9; post++ {
			for c := 0; c < 256; c++ {
				b := make([]byte, 0, pre+1+post)
				for range pre {
					b = append(b, 'x')
				}
				b = append(b, byte(c))
				for range post {
					b = append(b, 'y')
				}
				s := string(b)
				if got, want := plainRun(s), plainRunNaive(s); got != want {
					t.Fatalf("plainRun(%q) = %d, want %d", s, got, want)
				}
			}
		}
	}
}

// TestPlainRunRandom: random strings of bytes drawn mostly from around
// the boundaries plainRun tests.
func TestPlainRunRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	edge := []byte{0, 1, 0x1f, 0x20, 0x21, '"', 0x23, '[', '\\', ']', 0x7e, 0x7f, 0x80, 0x81, 0xa0, 0xdf, 0xe0, 0xff}
	b := make([]byte, 64)
	n := 2_000_000
	if testing.Short() {
		n = 100_000
	}
	for range n {
		l := r.IntN(len(b) + 1)
		for i := range l {
			if r.IntN(4) == 0 {
				b[i] = edge[r.IntN(len(edge))]
			} else {
				b[i] = byte(0x20 + r.IntN(0x60))
			}
		}
		s := string(b[:l])
		if got, want := plainRun(s), plainRunNaive(s); got != want {
			t.Fatalf("plainRun(%q) = %d, want %d", s, got, want)
		}
	}
}

// TestDecodeTokensTricky: decodeTokens against json.Unmarshal on inputs
// chosen at the edges (name folding, escapes, nulls, numbers, trailers).
func TestDecodeTokensTricky(t *testing.T) {
	for _, s := range []string{
		`{"ToKeNs":[1]}`, "{\"to\u212aens\":[1]}", "{\"tokenſ\":[2]}", `{"tok\u0065ns":[3]}`, `{"tok\u0045NS":[3]}`,
		`{"tokens":[null]}`, `{"tokens":[ null , 5 ]}`, `{"tokens":[1,]}`, `{"tokens":[,1]}`, `{"tokens":[1] , "a":1}`,
		`{"tokens":[4294967295]}`, `{"tokens":[00]}`, `{"tokens":[1e0]}`, `{"tokens":[1E+0]}`, `{"tokens":[-1]}`,
		`{"tokens":[1],"a":"\ud800"}`, "{\"tokens\":[1],\"a\":\"\x01\"}", "{\"tokens\":[1]}\f", "{\"tokens\":[1]}\x00",
		`{"tokens":[1]}  `, ` {"tokens":[1]}`, "\ufeff{\"tokens\":[1]}", `{"tokens":nullx}`, `{"tokens":nul}`,
		`{"tokens":[true]}`, `{"tokens":[[1]]}`, `{"tokens":[{}]}`, `{"tokens":[""]}`, `{"tokens":{}}`, `{"tokens":1}`,
		`{"tokens":[1],"x":{"tokens":[2]}}`, `{"x":[1,2,3],"tokens":[4]}`, `{"tokens":[ 7 ]}`, `{"tokens":[7 8]}`,
		`{"tokens":[1],"":2}`, `{"\u0000tokens":[1]}`, "{\"tokens\xff\":[1]}", `{"tokens":[9999999999]}`,
		`{"tokens":[0000000001]}`, `{"tokens":[-0]}`, `{"tokens":[0.0]}`, `{"tokens":[01]}`, `{"tokens":[1.]}`,
		"{\"tokens\":[1,\n2,\r\n3,\t4]}", `{"tokens":[1],}`, `{"tokens":[1]`, `{"tokens":[1]}}`, `{"tokens":[1]}{}`,
		`{"tokens":["1"]}`, `{"tokens" :[]}`, `{"tokens": [] }`, `{"TOKENS":null}`, `{"a":"\"tokens\":[1]"}`,
	} {
		b := []byte(s)
		toks, err := decodeTokens(b, func(int) error { return nil })
		var ref struct {
			Tokens *[]uint32 `json:"tokens"`
		}
		refErr := json.Unmarshal(b, &ref)
		if refErr == nil && ref.Tokens == nil {
			refErr = errors.New("no tokens")
		}
		switch {
		case err != nil && refErr != nil:
		case err != nil:
			t.Errorf("%q: refused (%v), encoding/json reads %v", s, err, *ref.Tokens)
		case refErr != nil:
			t.Errorf("%q: read %v, encoding/json refuses it: %v", s, toks, refErr)
		case !slices.Equal(toks, *ref.Tokens):
			t.Errorf("%q: read %v, encoding/json %v", s, toks, *ref.Tokens)
		}
	}
}

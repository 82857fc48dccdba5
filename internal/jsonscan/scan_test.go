package jsonscan

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"pgregory.net/rapid"
)

// validAll reports whether the decoder accepts b as one JSON value.
func validAll(b []byte) bool {
	r := New(b)
	if r.Skip() != nil {
		return false
	}
	return r.End()
}

func TestJSONSyntax(t *testing.T) {
	tests := []string{
		`{}`, `[]`, `""`, `0`, `-0`, `1.5e10`, `-1E-3`, `true`, `false`, `null`, ` { "a" : [ 1 , 2 , { } ] } `,
		`"\u00e9\n\t\"\\\/"`, `"\ud83d\ude00"`, `"\ud83d"`,
		`{`, `}`, `[1,]`, `{"a":1,}`, `{"a" 1}`, `{1:2}`, `01`, `1.`, `.5`, `1e`, `-`, `+1`, `tru`, `nul`, `"abc`,
		"\"a\x01b\"", "\"\x01\\\"a\"", `"\x"`, `"\u12"`, `"\u12g4"`, `[1 2]`, `{"a":1}x`, `[[[[`, `"` + strings.Repeat("a", 100) + `\`, ``,
	}
	for _, in := range tests {
		t.Run(in, func(t *testing.T) {
			assert.Equal(t, json.Valid([]byte(in)), validAll([]byte(in)))
		})
	}
}

// The decoder accepts exactly what encoding/json accepts.
func TestJSONSyntaxMatchesEncodingJSON(t *testing.T) {
	pieces := []string{"{", "}", "[", "]", `"`, `\`, ":", ",", " ", "0", "1", "-", ".", "e", "+", "true", "false", "null",
		"a", "é", `\u00e9`, `\ud83d`, `\n`, "\x01", "\n", `"a"`, `"k":`, "u", "00"}
	rapid.Check(t, func(t *rapid.T) {
		parts := rapid.SliceOfN(rapid.SampledFrom(pieces), 0, 24).Draw(t, "parts")
		in := []byte(strings.Join(parts, ""))
		if got, want := validAll(in), json.Valid(in); got != want {
			t.Fatalf("%q: decoder says valid=%v, encoding/json %v", in, got, want)
		}
	})
}

func TestJSONDeepNesting(t *testing.T) {
	in := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
	assert.False(t, validAll([]byte(in)))
	at := strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth)
	assert.True(t, validAll([]byte(at)), "MaxDepth levels")
	assert.False(t, validAll([]byte("["+at+"]")), "MaxDepth+1 levels")
}

// decodeString decodes the JSON string s with a Reader.
func decodeString(s []byte) (string, bool) {
	r := New(s)
	if r.Peek() != '"' {
		return "", false
	}
	v, err := r.String()
	if err != nil || !r.End() {
		return "", false
	}
	return v, true
}

// FuzzString compares a Reader with encoding/json on JSON strings: the
// same accept/reject decision and the same decoded value (escapes,
// surrogates, invalid UTF-8 replaced by U+FFFD).
func FuzzString(f *testing.F) {
	for _, s := range []string{`""`, `"abc"`, `"\u00e9\n\t\"\\\/"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ud83d\u0041"`,
		`"\udc00\ud800"`, "\"caf\xc3\xa9\"", "\"\xff\xfe\"", "\"a\xc3\"", "\"\xed\xa0\x80\"", "\"\x01\"", `"\x"`, `"abc`,
		`"a\u12"`, "\"" + strings.Repeat("long ascii run ", 20) + "\\n\xe2\x82\xac\"", `"a" `} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, s []byte) {
		got, ok := decodeString(s)
		var want string
		werr := json.Unmarshal(s, &want)
		if ok != (werr == nil) {
			t.Fatalf("%q: Reader ok=%v, encoding/json error %v", s, ok, werr)
		}
		if ok && got != want {
			t.Fatalf("%q: Reader %q, encoding/json %q", s, got, want)
		}
		// Skipping accepts the same strings.
		r := New(s)
		if r.Peek() != '"' {
			return
		}
		if skipOK := r.Skip() == nil && r.End(); skipOK != ok {
			t.Fatalf("%q: Skip ok=%v, String ok=%v", s, skipOK, ok)
		}
	})
}

// FuzzValid compares a Reader's syntax check with json.Valid (within
// MaxDepth).
func FuzzValid(f *testing.F) {
	for _, s := range []string{`{}`, `[1,2,{"a":null}]`, `{"a":1,}`, `01`, `-0.5e+3`, `"\ud800"`, `tru`, ` [ ] `, `{"a" 1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if bytes.Count(b, []byte("["))+bytes.Count(b, []byte("{")) > MaxDepth {
			return
		}
		if got, want := validAll(b), json.Valid(b); got != want {
			t.Fatalf("%q: Reader valid=%v, json.Valid %v", b, got, want)
		}
	})
}

package httpgw

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
)

// This file decodes the few fields of an OpenAI request that routing
// needs, in one pass over the body and without reflection: a gateway reads
// every byte of every prompt, and encoding/json (which validates, then
// decodes, then decodes raw content again) costs several times more. The
// decoder checks the whole body's syntax (RFC 8259), so malformed JSON is
// still rejected, and ignores the fields it does not need.

// errSyntax is wrapped by every syntax error of the decoder.
var errSyntax = errors.New("invalid JSON")

// maxDepth bounds nesting, so hostile input cannot exhaust the stack.
const maxDepth = 512

type jsonReader struct {
	b     []byte
	i     int
	depth int
	buf   []byte // scratch for unescaping
}

func (r *jsonReader) errorf(format string, args ...any) error {
	return fmt.Errorf("%w at offset %d: %s", errSyntax, r.i, fmt.Sprintf(format, args...))
}

func (r *jsonReader) ws() {
	for r.i < len(r.b) {
		switch r.b[r.i] {
		case ' ', '\t', '\n', '\r':
			r.i++
		default:
			return
		}
	}
}

// peek returns the next non-space byte, or 0 at the end.
func (r *jsonReader) peek() byte {
	r.ws()
	if r.i >= len(r.b) {
		return 0
	}
	return r.b[r.i]
}

func (r *jsonReader) expect(c byte) error {
	if r.peek() != c {
		if r.i >= len(r.b) {
			return r.errorf("unexpected end of input, want %q", c)
		}
		return r.errorf("unexpected %q, want %q", r.b[r.i], c)
	}
	r.i++
	return nil
}

// object calls field for each member of an object; field must consume the
// member's value.
func (r *jsonReader) object(field func(key string) error) error {
	if err := r.expect('{'); err != nil {
		return err
	}
	if r.depth++; r.depth > maxDepth {
		return r.errorf("nesting deeper than %d", maxDepth)
	}
	defer func() { r.depth-- }()
	if r.peek() == '}' {
		r.i++
		return nil
	}
	for {
		if r.peek() != '"' {
			return r.errorf("want a member name")
		}
		key, err := r.str()
		if err != nil {
			return err
		}
		if err := r.expect(':'); err != nil {
			return err
		}
		if err := field(key); err != nil {
			return err
		}
		switch r.peek() {
		case ',':
			r.i++
		case '}':
			r.i++
			return nil
		default:
			return r.errorf("want ',' or '}' in object")
		}
	}
}

// array calls elem for each element of an array; elem must consume it.
func (r *jsonReader) array(elem func() error) error {
	if err := r.expect('['); err != nil {
		return err
	}
	if r.depth++; r.depth > maxDepth {
		return r.errorf("nesting deeper than %d", maxDepth)
	}
	defer func() { r.depth-- }()
	if r.peek() == ']' {
		r.i++
		return nil
	}
	for {
		if err := elem(); err != nil {
			return err
		}
		switch r.peek() {
		case ',':
			r.i++
		case ']':
			r.i++
			return nil
		default:
			return r.errorf("want ',' or ']' in array")
		}
	}
}

// skip consumes one value of any kind, checking its syntax.
func (r *jsonReader) skip() error {
	switch c := r.peek(); {
	case c == '{':
		return r.object(func(string) error { return r.skip() })
	case c == '[':
		return r.array(r.skip)
	case c == '"':
		return r.skipString()
	case c == 't':
		return r.literal("true")
	case c == 'f':
		return r.literal("false")
	case c == 'n':
		return r.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		return r.number()
	case c == 0:
		return r.errorf("unexpected end of input, want a value")
	default:
		return r.errorf("unexpected %q, want a value", c)
	}
}

// raw consumes one value and returns its text.
func (r *jsonReader) raw() (string, error) {
	r.ws()
	start := r.i
	if err := r.skip(); err != nil {
		return "", err
	}
	return string(r.b[start:r.i]), nil
}

func (r *jsonReader) literal(lit string) error {
	if !bytes.HasPrefix(r.b[r.i:], []byte(lit)) {
		return r.errorf("invalid literal, want %s", lit)
	}
	r.i += len(lit)
	return nil
}

// null consumes a null if one is next.
func (r *jsonReader) null() bool {
	if r.peek() == 'n' && r.literal("null") == nil {
		return true
	}
	return false
}

func (r *jsonReader) number() error {
	b, i := r.b, r.i
	digits := func() int {
		n := 0
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case digits() == 0:
		r.i = i
		return r.errorf("invalid number")
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			r.i = i
			return r.errorf("invalid number fraction")
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			r.i = i
			return r.errorf("invalid number exponent")
		}
	}
	r.i = i
	return nil
}

func (r *jsonReader) boolean() (bool, error) {
	switch r.peek() {
	case 't':
		return true, r.literal("true")
	case 'f':
		return false, r.literal("false")
	}
	return false, r.errorf("want true or false")
}

// skipString consumes a string, checking escapes and control characters.
func (r *jsonReader) skipString() error {
	_, err := r.strBytes(false)
	return err
}

// str consumes a string and returns its value.
func (r *jsonReader) str() (string, error) {
	b, err := r.strBytes(true)
	return string(b), err
}

// strBytes consumes a string; with decode it returns the unescaped value
// (valid until the next call), otherwise nil.
func (r *jsonReader) strBytes(decode bool) ([]byte, error) {
	if err := r.expect('"'); err != nil {
		return nil, err
	}
	start := r.i
	b := r.b
	// Fast path: find the closing quote, then check that the string has
	// no escapes (else decode it slowly) and no control characters.
	q := bytes.IndexByte(b[start:], '"')
	if q < 0 {
		q = len(b) - start
	}
	seg := b[start : start+q]
	if bs := bytes.IndexByte(seg, '\\'); bs >= 0 {
		if hasControl(seg[:bs]) {
			bs = 0 // the slow path finds and reports it
		}
		return r.strSlow(start, start+bs, decode)
	}
	if start+q == len(b) {
		r.i = len(b)
		return nil, r.errorf("unterminated string")
	}
	if hasControl(seg) {
		return r.strSlow(start, start, decode) // finds and reports it
	}
	r.i = start + q + 1
	return seg, nil
}

// hasControl reports whether b holds a byte below 0x20, eight bytes at a
// time.
func hasControl(b []byte) bool {
	for len(b) >= 8 {
		x := binary.LittleEndian.Uint64(b)
		if (x-0x2020202020202020)&^x&0x8080808080808080 != 0 {
			return true
		}
		b = b[8:]
	}
	for _, c := range b {
		if c < 0x20 {
			return true
		}
	}
	return false
}

func (r *jsonReader) strSlow(start, i int, decode bool) ([]byte, error) {
	b := r.b
	out := append(r.buf[:0], b[start:i]...)
	for i < len(b) {
		c := b[i]
		switch {
		case c == '"':
			r.i = i + 1
			r.buf = out
			if !decode {
				return nil, nil
			}
			return out, nil
		case c < 0x20:
			r.i = i
			return nil, r.errorf("control character in string")
		case c != '\\':
			out = append(out, c)
			i++
			continue
		}
		if i+1 >= len(b) {
			break
		}
		switch e := b[i+1]; e {
		case '"', '\\', '/':
			out = append(out, e)
			i += 2
		case 'b':
			out, i = append(out, '\b'), i+2
		case 'f':
			out, i = append(out, '\f'), i+2
		case 'n':
			out, i = append(out, '\n'), i+2
		case 'r':
			out, i = append(out, '\r'), i+2
		case 't':
			out, i = append(out, '\t'), i+2
		case 'u':
			r1, ok := hex4(b, i+2)
			if !ok {
				r.i = i
				return nil, r.errorf("invalid \\u escape")
			}
			i += 6
			if utf16.IsSurrogate(r1) {
				if r2, ok := hex4(b, i+2); ok && i+1 < len(b) && b[i] == '\\' && b[i+1] == 'u' {
					if dec := utf16.DecodeRune(r1, r2); dec != utf8.RuneError {
						r1 = dec
						i += 6
					} else {
						r1 = utf8.RuneError
					}
				} else {
					r1 = utf8.RuneError
				}
			}
			out = utf8.AppendRune(out, r1)
		default:
			r.i = i
			return nil, r.errorf("invalid escape \\%c", e)
		}
	}
	r.i = len(b)
	return nil, r.errorf("unterminated string")
}

func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var v rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			v = v<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			v = v<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return v, true
}

package kvevents

import (
	"bytes"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/examlops/gateway/internal/jsonscan"
)

// The /tokenize request body and answer, written and read without
// encoding/json so that each is made in one allocation of a size known
// before it is made, and charged to HTTPTokenizer's budget first:
// encoding/json's encoder grows a pooled buffer and copies it, and its
// decoder buffers the answer and grows the token slice by doubling, some
// 40 MiB a call for a 7 MiB prompt (TestMeasureTokenizeMemory).
// FuzzTokenizeBody and FuzzDecodeTokens hold both to encoding/json.

// tokenizeBodySize is the length of appendTokenizeBody's body for r.
func tokenizeBodySize(r TokenizeRequest) int {
	n := len(`{"model":}`) + jsonStringSize(r.Model)
	if r.Prompt != "" {
		n += len(`,"prompt":`) + jsonStringSize(r.Prompt)
	}
	for _, f := range rawMembers(r) {
		if len(f.raw) > 0 {
			n += len(`,"":`) + len(f.name) + len(f.raw)
		}
	}
	return n
}

// rawMember is a member of the body written as it came (JSON text).
type rawMember struct {
	name string
	raw  []byte
}

// rawMembers are r's members written as they came, in the body's order.
func rawMembers(r TokenizeRequest) [3]rawMember {
	return [3]rawMember{{"messages", r.Messages}, {"tools", r.Tools}, {"chat_template_kwargs", r.ChatTemplateKwargs}}
}

// appendTokenizeBody appends r's /tokenize body to dst: {"model", then
// "prompt" or "messages", "tools" and "chat_template_kwargs" when set}, as
// encoding/json marshals tokenizeBody without HTML escaping; the raw
// members are written as they are, where encoding/json would compact them.
func appendTokenizeBody(dst []byte, r TokenizeRequest) []byte {
	dst = append(dst, `{"model":`...)
	dst = appendJSONString(dst, r.Model)
	if r.Prompt != "" {
		dst = append(dst, `,"prompt":`...)
		dst = appendJSONString(dst, r.Prompt)
	}
	for _, f := range rawMembers(r) {
		if len(f.raw) > 0 {
			dst = append(dst, `,"`...)
			dst = append(dst, f.name...)
			dst = append(dst, `":`...)
			dst = append(dst, f.raw...)
		}
	}
	return append(dst, '}')
}

// jsonStringSize is the length of appendJSONString's string for s.
func jsonStringSize(s string) int {
	n := 2
	for i := 0; i < len(s); {
		plain := plainRun(s[i:])
		n += plain
		if i += plain; i == len(s) {
			break
		}
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\' || c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t':
				n += 2
			case c < 0x20:
				n += 6
			default:
				n++
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1, r == '\u2028', r == '\u2029':
			n += 6
		default:
			n += size
		}
		i += size
	}
	return n
}

// appendJSONString appends s as a JSON string, as encoding/json writes it
// without HTML escaping: short escapes for '"', '\\', \b, \f, \n, \r and
// \t, \u00XX for the other control characters, \ufffd for each byte of
// invalid UTF-8, and \u2028 and \u2029 escaped.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if i += plainRun(s[i:]); i == len(s) {
			break
		}
		c := s[i]
		if c < utf8.RuneSelf {
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// plainRun is the length of s's prefix of bytes written as they are
// without a look at the next: ASCII from 0x20, but '"' and '\\'. It
// tests eight bytes at a time.
func plainRun(s string) int {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	i := 0
	for ; i+8 <= len(s); i += 8 {
		x := uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
			uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
		quote, backslash := x^(ones*'"'), x^(ones*'\\')
		// A byte below 0x20, a zero byte of quote or of backslash, or a
		// byte from 0x80 sets its high bit here (x's high bits mask the
		// borrows of bytes from 0x80 and are tested themselves).
		if ((x-ones*0x20)|(quote-ones)|(backslash-ones))&^x&highs != 0 || x&highs != 0 {
			break
		}
	}
	for ; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' {
			break
		}
	}
	return i
}

// errTokensTwice is an answer with two "tokens" members, which
// encoding/json would read as the last of them.
var errTokensTwice = errors.New(`response has "tokens" twice`)

// decodeTokens reads a /tokenize answer, {"tokens": [...], ...}, as
// encoding/json decodes it into struct{ Tokens *[]uint32 } (the member's
// name matched without regard to case, null elements read as 0), except
// that two "tokens" members are an error. It first finds and checks the
// whole answer, then counts the ids and calls need with their number
// before it allocates them; an error of need is returned as it is,
// wrapped.
func decodeTokens(b []byte, need func(n int) error) ([]uint32, error) {
	r := jsonscan.New(b)
	from, to, seen := -1, -1, false
	err := r.ObjectBytes(func(name []byte) error {
		if !bytes.EqualFold(name, []byte("tokens")) {
			return r.Skip()
		}
		if seen {
			return errTokensTwice
		}
		seen = true
		if r.Null() {
			return nil
		}
		if r.Peek() != '[' {
			return fmt.Errorf(`response: "tokens" is not an array`)
		}
		from = r.Offset()
		if err := r.Skip(); err != nil {
			return err
		}
		to = r.Offset()
		return nil
	})
	switch {
	case errors.Is(err, errTokensTwice):
		return nil, err
	case err != nil:
		return nil, fmt.Errorf("response: %w", err)
	case !r.End():
		return nil, errors.New("response: data after the object")
	case from < 0:
		return nil, errors.New(`response has no "tokens"`)
	}
	arr := b[from:to]
	// Its commas count its elements only when they are all integers or
	// nulls; an array of anything else (whose commas may be in strings)
	// is refused below at its first such element, and allocates nothing.
	ints := intsOrNulls(arr)
	n := 0
	if ints {
		n = bytes.Count(arr, []byte{','}) + 1
		if err := need(n); err != nil {
			return nil, fmt.Errorf("%d token ids: %w", n, err)
		}
	}
	toks := make([]uint32, 0, n)
	r.Reset(arr)
	err = r.Array(func() error {
		if r.Null() {
			if ints {
				toks = append(toks, 0)
			}
			return nil
		}
		r.Peek()
		start := r.Offset()
		if err := r.Skip(); err != nil {
			return err
		}
		id, ok := parseUint32(r.Since(start))
		if !ok {
			return fmt.Errorf("token %.32q is not an integer of 32 bits", r.Since(start))
		}
		if ints {
			toks = append(toks, id)
		}
		return nil
	})
	if err == nil && !ints {
		err = errors.New("tokens are not integers") // not reached: intsOrNulls is only a byte test
	}
	if err != nil {
		return nil, fmt.Errorf("response: %w", err)
	}
	return toks, nil
}

// intsOrNulls reports whether the valid JSON array arr holds only bytes
// of unsigned integers, nulls, commas and white space: when it does not,
// one of its elements is not an integer or a null.
func intsOrNulls(arr []byte) bool {
	for _, c := range arr[1 : len(arr)-1] {
		switch {
		case c >= '0' && c <= '9', c == ',', c == 'n', c == 'u', c == 'l', c == ' ', c == '\t', c == '\n', c == '\r':
		default:
			return false
		}
	}
	return true
}

// parseUint32 parses decimal digits (of a JSON number, so with no leading
// zero but 0 itself) as strconv.ParseUint(s, 10, 32) does.
func parseUint32(s []byte) (uint32, bool) {
	if len(s) == 0 || len(s) > 10 {
		return 0, false
	}
	var v uint64
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	if v > 1<<32-1 {
		return 0, false
	}
	return uint32(v), true
}

package kvevents

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"strconv"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// reader reads msgpack values one at a time from a payload with the
// msgpack library's low-level Decoder, checking each value's type before
// decoding it: the library alone would read nil as 0 and a string's
// length from any header. The first error the library reports (truncated
// or invalid msgpack) sticks in err, and every read after it returns
// zero values, so callers check err once after a loop; loops also stop on
// it, so a corrupt length cannot spin them.
type reader struct {
	d       *msgpack.Decoder
	r       bytes.Reader
	payload []byte
	err     error
	scratch [512]byte
}

func newReader() *reader {
	r := &reader{}
	r.d = msgpack.NewDecoder(&r.r)
	return r
}

func (r *reader) reset(payload []byte) {
	r.payload = payload
	r.r.Reset(payload)
	r.d.Reset(&r.r)
	r.err = nil
}

// maxDepth bounds the nesting of values the reader skips: the library's
// own Skip recurses without a bound, and a payload of nested one-element
// arrays would exhaust the stack.
const maxDepth = 32

// Value kinds, by their first byte.
type vkind uint8

const (
	kNil vkind = iota
	kInt
	kStr
	kBin
	kArray
	kMap
	kFloat
	kBool
	kExt
	kBad
)

var vkindNames = [...]string{"nil", "integer", "string", "bytes", "array", "map", "float", "bool", "extension", "invalid"}

func (k vkind) String() string { return vkindNames[k] }

func kindOf(c byte) vkind {
	switch {
	case msgpcode.IsFixedNum(c):
		return kInt
	case msgpcode.IsFixedString(c):
		return kStr
	case msgpcode.IsFixedArray(c):
		return kArray
	case msgpcode.IsFixedMap(c):
		return kMap
	}
	switch c {
	case msgpcode.Nil:
		return kNil
	case msgpcode.Uint8, msgpcode.Uint16, msgpcode.Uint32, msgpcode.Uint64,
		msgpcode.Int8, msgpcode.Int16, msgpcode.Int32, msgpcode.Int64:
		return kInt
	case msgpcode.Str8, msgpcode.Str16, msgpcode.Str32:
		return kStr
	case msgpcode.Bin8, msgpcode.Bin16, msgpcode.Bin32:
		return kBin
	case msgpcode.Array16, msgpcode.Array32:
		return kArray
	case msgpcode.Map16, msgpcode.Map32:
		return kMap
	case msgpcode.Float, msgpcode.Double:
		return kFloat
	case msgpcode.True, msgpcode.False:
		return kBool
	case msgpcode.FixExt1, msgpcode.FixExt2, msgpcode.FixExt4, msgpcode.FixExt8, msgpcode.FixExt16,
		msgpcode.Ext8, msgpcode.Ext16, msgpcode.Ext32:
		return kExt
	}
	return kBad
}

func (r *reader) fail(err error) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %v", ErrMalformed, err)
	}
}

// kind returns the kind of the next value without consuming it; kBad at
// the end of the payload or after an error.
func (r *reader) kind() vkind {
	if r.err != nil {
		return kBad
	}
	c, err := r.d.PeekCode()
	if err != nil {
		r.fail(err)
		return kBad
	}
	k := kindOf(c)
	if k == kBad {
		r.fail(fmt.Errorf("invalid msgpack code 0x%02x at offset %d", c, r.offset()))
	}
	return k
}

// offset is the position of the next unread byte, for error messages.
func (r *reader) offset() int64 { return r.r.Size() - int64(r.r.Len()) }

func (r *reader) arrayLen() int {
	if r.err != nil {
		return 0
	}
	n, err := r.d.DecodeArrayLen()
	if err != nil {
		r.fail(err)
		return 0
	}
	return max(n, 0)
}

func (r *reader) mapLen() int {
	if r.err != nil {
		return 0
	}
	n, err := r.d.DecodeMapLen()
	if err != nil {
		r.fail(err)
		return 0
	}
	return max(n, 0)
}

// uint returns an integer value's 64 bits: a negative integer as its two's
// complement, as engine hashes from Python's signed hash() are meant.
func (r *reader) uint() uint64 {
	if r.err != nil {
		return 0
	}
	v, err := r.d.DecodeUint64()
	if err != nil {
		r.fail(err)
	}
	return v
}

// int returns an integer value, or ok false (the value consumed) when it
// does not fit an int64: a uint64 above MaxInt64, whose bits v then
// holds (intText writes it).
func (r *reader) int() (v int64, ok bool) {
	if r.err != nil {
		return 0, false
	}
	c, _ := r.d.PeekCode()
	u, err := r.d.DecodeUint64()
	if err != nil {
		r.fail(err)
		return 0, false
	}
	return int64(u), !(c == msgpcode.Uint64 && u > math.MaxInt64)
}

// intText writes int's value for an error message.
func intText(v int64, ok bool) string {
	if !ok {
		return strconv.FormatUint(uint64(v), 10)
	}
	return strconv.FormatInt(v, 10)
}

// str reads a string or byte string into dst if it fits, else skips
// it and returns its length with ok false.
func (r *reader) str(dst []byte) (b []byte, n int, ok bool) {
	if r.err != nil {
		return nil, 0, false
	}
	n, err := r.d.DecodeBytesLen()
	if err != nil {
		r.fail(err)
		return nil, 0, false
	}
	if n < 0 { // nil; callers check the kind first
		return nil, 0, true
	}
	if n > len(dst) {
		r.skipBytes(n)
		return nil, n, false
	}
	b = dst[:n]
	if err := r.d.ReadFull(b); err != nil {
		r.fail(err)
		return nil, n, false
	}
	return b, n, true
}

func (r *reader) skipBytes(n int) {
	for n > 0 && r.err == nil {
		k := min(n, len(r.scratch))
		if err := r.d.ReadFull(r.scratch[:k]); err != nil {
			r.fail(err)
		}
		n -= k
	}
}

// skip consumes one value of any kind, nested at most maxDepth deep.
func (r *reader) skip(depth int) {
	switch k := r.kind(); k {
	case kBad:
		return
	case kArray, kMap:
		if depth >= maxDepth {
			r.fail(fmt.Errorf("values nested deeper than %d at offset %d", maxDepth, r.offset()))
			return
		}
		var n int
		if k == kArray {
			n = r.arrayLen()
		} else {
			n = 2 * r.mapLen()
		}
		for i := 0; i < n && r.err == nil; i++ {
			r.skip(depth + 1)
		}
	case kStr, kBin:
		n, err := r.d.DecodeBytesLen()
		if err != nil {
			r.fail(err)
			return
		}
		r.skipBytes(n)
	default:
		if err := r.d.Skip(); err != nil {
			r.fail(err)
		}
	}
}

// hash reads an engine block hash: an integer's 64 bits, or the last 8
// bytes of a byte string, big-endian (llm-d-kv-cache's reading of vLLM's
// sha256 ExternalBlockHash). ok is false, the value consumed, for another
// kind or an empty or over-long byte string.
func (r *reader) hash() (h uint64, what string, ok bool) {
	switch k := r.kind(); k {
	case kInt:
		return r.uint(), "", true
	case kStr, kBin:
		b, n, fits := r.str(r.scratch[:maxHashBytes])
		if !fits || n == 0 {
			return 0, fmt.Sprintf("a %d-byte string, want 1..%d bytes", n, maxHashBytes), false
		}
		var buf [8]byte
		if n >= 8 {
			copy(buf[:], b[n-8:])
		} else {
			copy(buf[8-n:], b)
		}
		return binary.BigEndian.Uint64(buf[:]), "", true
	case kBad:
		return 0, "", false
	default:
		r.skip(0)
		return 0, "a " + k.String(), false
	}
}

// nextInt decodes the msgpack integer at the start of b: its 64 bits (a
// negative value's two's complement, neg true) and its encoded size; ok is
// false if b does not start with a whole integer. It is the hot path of
// the integer arrays (token ids, hashes), which the library decodes one
// interface call per byte; FuzzNextInt checks it against the library.
func nextInt(b []byte) (v uint64, neg bool, size int, ok bool) {
	if len(b) == 0 {
		return 0, false, 0, false
	}
	c := b[0]
	switch {
	case c <= 0x7f:
		return uint64(c), false, 1, true
	case c >= 0xe0:
		return uint64(int64(int8(c))), true, 1, true
	}
	var n int
	switch c {
	case msgpcode.Uint8, msgpcode.Int8:
		n = 1
	case msgpcode.Uint16, msgpcode.Int16:
		n = 2
	case msgpcode.Uint32, msgpcode.Int32:
		n = 4
	case msgpcode.Uint64, msgpcode.Int64:
		n = 8
	default:
		return 0, false, 0, false
	}
	if len(b) < 1+n {
		return 0, false, 0, false
	}
	var u uint64
	for _, x := range b[1 : 1+n] {
		u = u<<8 | uint64(x)
	}
	if c >= msgpcode.Int8 && c <= msgpcode.Int64 { // signed: extend the sign
		shift := 64 - 8*uint(n)
		s := int64(u<<shift) >> shift
		return uint64(s), s < 0, 1 + n, true
	}
	return u, false, 1 + n, true
}

// rest returns the unread payload.
func (r *reader) rest() []byte { return r.payload[r.offset():] }

// advance consumes n bytes that the caller decoded from rest.
func (r *reader) advance(n int) {
	if _, err := r.r.Seek(int64(n), io.SeekCurrent); err != nil {
		r.fail(err)
	}
}

// maxHashBytes is the longest byte-string hash accepted (vLLM's are 32).
const maxHashBytes = 64

package kvevents

import (
	"bytes"
	"fmt"
	"math"
)

// Decoding one event, array- or map-encoded, field by field.

// Fields of the events, by name.
type field uint8

const (
	fNone field = iota
	fHashes
	fParent
	fTokens
	fBlockSize
	fLoraID
	fMedium
	fLoraName
	fExtraKeys
	fGroupIdx
	fSpecKind
	fSlidingWindow
)

var fieldNames = [...]string{"", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
	"medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}

func fieldByName(s []byte) field {
	for i, n := range fieldNames[1:] {
		if string(s) == n {
			return field(i + 1)
		}
	}
	return fNone
}

// Positional fields after the tag, per kind.
var (
	storedFields  = []field{fHashes, fParent, fTokens, fBlockSize, fLoraID, fMedium, fLoraName, fExtraKeys, fGroupIdx, fSpecKind, fSlidingWindow}
	removedFields = []field{fHashes, fMedium, fGroupIdx}
)

func kindByTag(tag []byte) Kind {
	for k := BlockStored; k <= AllBlocksCleared; k++ {
		if string(tag) == kindNames[k] {
			return k
		}
	}
	return 0
}

// event decodes one event into d.ev. It always consumes the whole value;
// it returns the first fault of the event (the reader's err aside).
func (d *Decoder) event() error {
	r, ev := d.r, &d.ev
	*ev = Event{Hashes: ev.Hashes[:0], Tokens: ev.Tokens[:0], Plain: -1}
	d.xLoRA, d.xOther = nil, -1
	var seen uint16 // fields present, by bit
	var first error
	note := func(err error) {
		if first == nil && err != nil {
			first = err
		}
	}
	switch k := r.kind(); k {
	case kArray:
		n := r.arrayLen()
		if n == 0 {
			return fmt.Errorf("%w: empty event array, want a type tag first", ErrMalformed)
		}
		tag, err := d.readTag()
		if err != nil {
			note(err)
		} else if ev.Kind = kindByTag(tag); ev.Kind == 0 {
			note(fmt.Errorf("%w: %q", ErrUnknownEvent, tag))
		}
		var order []field
		switch ev.Kind {
		case BlockStored:
			order = storedFields
		case BlockRemoved:
			order = removedFields
		}
		for i := 1; i < n && r.err == nil; i++ {
			if first != nil || i-1 >= len(order) {
				r.skip(2)
				continue
			}
			note(d.field(order[i-1]))
			seen |= 1 << order[i-1]
		}
	case kMap:
		n := r.mapLen()
		typed := false
		for i := 0; i < n && r.err == nil; i++ {
			key, ok := d.mapKey()
			switch {
			case !ok:
				note(fmt.Errorf("%w: event has a non-string key", ErrMalformed))
				r.skip(2)
			case string(key) == "type":
				typed = true
				tag, err := d.readTag()
				if err != nil {
					note(err)
				} else if ev.Kind = kindByTag(tag); ev.Kind == 0 {
					note(fmt.Errorf("%w: %q", ErrUnknownEvent, tag))
				}
			default:
				f := fieldByName(key)
				if f == fNone || first != nil {
					r.skip(2)
					continue
				}
				if seen&(1<<f) != 0 { // each would add to the last, past the limits
					note(fmt.Errorf("%w: event has %s twice", ErrMalformed, fieldNames[f]))
					r.skip(2)
					continue
				}
				note(d.field(f))
				seen |= 1 << f
			}
		}
		if !typed {
			note(fmt.Errorf("%w: event map has no \"type\" key", ErrMalformed))
		}
	case kBad:
		return nil
	default:
		r.skip(1)
		return fmt.Errorf("%w: event is a %s, want an array or a map", ErrMalformed, k)
	}
	if first != nil || r.err != nil {
		return first
	}
	return d.check(seen)
}

// What a block's extra keys are (extraKey).
const (
	keyNone  = iota // nil: none
	keyLoRA         // one string, the first such of the event
	keyOther        // anything else
)

// extraKey reads one block's entry of extra_keys, a tuple. vLLM
// (vllm/v1/core/kv_cache_utils.py, generate_block_hash_extra_keys, at
// vllm-project/vllm 0181ea3173e5) puts the LoRA adapter's name first,
// then multimodal identifiers, the cache salt (first block only) and
// prompt embedding hashes: a tuple of one string, the same in every
// block, is the adapter's name when the event's lora_name is that string
// (check), which d.xLoRA keeps.
func (d *Decoder) extraKey() int {
	r := d.r
	switch r.kind() {
	case kNil:
		r.skip(3)
		return keyNone
	case kArray:
	default:
		r.skip(3)
		return keyOther
	}
	m := r.arrayLen()
	if m != 1 || r.kind() != kStr {
		for j := 0; j < m && r.err == nil; j++ {
			r.skip(4)
		}
		return keyOther
	}
	b, _, ok := r.str(d.xKey[:])
	switch {
	case !ok:
		return keyOther
	case d.xLoRA == nil:
		d.xLoRA = d.xName[:copy(d.xName[:], b)]
		return keyLoRA
	case bytes.Equal(b, d.xLoRA):
		return keyLoRA
	}
	return keyOther
}

// readTag reads an event's type tag into d.tag.
func (d *Decoder) readTag() ([]byte, error) {
	if k := d.r.kind(); k != kStr {
		d.r.skip(2)
		return nil, fmt.Errorf("%w: event type is a %s, want a string", ErrMalformed, k)
	}
	b, n, ok := d.r.str(d.tag[:])
	if !ok {
		return nil, fmt.Errorf("%w: event type of %d bytes", ErrUnknownEvent, n)
	}
	return b, nil
}

// check validates a decoded event as a whole.
func (d *Decoder) check(seen uint16) error {
	ev := &d.ev
	need := func(f field) error {
		if seen&(1<<f) == 0 {
			return fmt.Errorf("%w: %s has no %s", ErrMalformed, ev.Kind, fieldNames[f])
		}
		return nil
	}
	switch ev.Kind {
	case BlockStored:
		for _, f := range [...]field{fHashes, fTokens, fBlockSize} { // a map may leave out a nil parent
			if err := need(f); err != nil {
				return err
			}
		}
		if ev.BlockSize < 1 {
			return fmt.Errorf("%w: BlockStored block_size %d, want at least 1", ErrMalformed, ev.BlockSize)
		}
		// vLLM leaves out the null blocks of a sliding-window (or Mamba)
		// group, whose token_ids still span every block: only an indexed
		// group's tokens must match its hashes.
		if fullAttention(ev.SpecKind) && len(ev.Tokens) != len(ev.Hashes)*ev.BlockSize {
			return fmt.Errorf("%w: BlockStored has %d token_ids for %d blocks of %d", ErrMalformed,
				len(ev.Tokens), len(ev.Hashes), ev.BlockSize)
		}
	case BlockRemoved:
		if err := need(fHashes); err != nil {
			return err
		}
	}
	if len(ev.LoRA) > 0 && d.xLoRA != nil && bytes.Equal(d.xLoRA, ev.LoRA) {
		// Blocks whose only extra key is the adapter's name are keyed
		// from its root, as requests for it are.
		ev.Plain = d.xOther
	}
	if ev.Plain < 0 || ev.Plain > len(ev.Hashes) {
		ev.Plain = len(ev.Hashes)
	}
	return nil
}

// field decodes one field's value into d.ev, consuming it whatever it is.
func (d *Decoder) field(f field) error {
	r, ev := d.r, &d.ev
	k := r.kind()
	if k == kBad {
		return nil
	}
	bad := func(want string) error {
		r.skip(2)
		return fmt.Errorf("%w: %s is a %s, want %s", ErrMalformed, fieldNames[f], k, want)
	}
	switch f {
	case fHashes:
		if k != kArray {
			return bad("an array")
		}
		n := r.arrayLen()
		if n > d.lim.MaxBlocks {
			for i := 0; i < n && r.err == nil; i++ {
				r.skip(3)
			}
			return fmt.Errorf("%w: %d block_hashes, limit %d", ErrLimit, n, d.lim.MaxBlocks)
		}
		// Integers in one pass over the bytes; anything else (byte-string
		// hashes, faults) through the reader.
		i, buf, used := 0, r.rest(), 0
		for ; i < n; i++ {
			v, _, size, ok := nextInt(buf[used:])
			if !ok {
				break
			}
			ev.Hashes = append(ev.Hashes, v)
			used += size
		}
		r.advance(used)
		var first error
		for ; i < n && r.err == nil; i++ {
			h, what, ok := r.hash()
			if !ok && first == nil && r.err == nil {
				first = fmt.Errorf("%w: block_hashes[%d] is %s, want an integer or bytes", ErrMalformed, i, what)
			}
			ev.Hashes = append(ev.Hashes, h)
		}
		return first
	case fParent:
		if k == kNil {
			r.skip(2)
			return nil
		}
		h, what, ok := r.hash()
		if !ok {
			if r.err != nil {
				return nil
			}
			return fmt.Errorf("%w: parent_block_hash is %s, want nil, an integer or bytes", ErrMalformed, what)
		}
		ev.Parent, ev.HasParent = h, h != 0
		return nil
	case fTokens:
		if k != kArray {
			return bad("an array")
		}
		n := r.arrayLen()
		if n > d.lim.MaxTokens {
			for i := 0; i < n && r.err == nil; i++ {
				r.skip(3)
			}
			return fmt.Errorf("%w: %d token_ids, limit %d", ErrLimit, n, d.lim.MaxTokens)
		}
		i, buf, used := 0, r.rest(), 0
		for ; i < n; i++ {
			v, neg, size, ok := nextInt(buf[used:])
			if !ok || neg || v > math.MaxUint32 {
				break
			}
			ev.Tokens = append(ev.Tokens, uint32(v))
			used += size
		}
		r.advance(used)
		var first error
		for ; i < n && r.err == nil; i++ {
			if tk := r.kind(); tk != kInt {
				r.skip(3)
				if first == nil && r.err == nil {
					first = fmt.Errorf("%w: token_ids[%d] is a %s, want an integer", ErrMalformed, i, tk)
				}
				continue
			}
			v, ok := r.int()
			if (!ok || v < 0 || v > math.MaxUint32) && first == nil && r.err == nil {
				first = fmt.Errorf("%w: token_ids[%d] is %s, want 0..%d", ErrMalformed, i, intText(v, ok), uint32(math.MaxUint32))
			}
			ev.Tokens = append(ev.Tokens, uint32(v))
		}
		return first
	case fBlockSize:
		if k != kInt {
			return bad("an integer")
		}
		v, ok := r.int()
		if !ok || v < 1 || v > int64(d.lim.MaxTokens) {
			return fmt.Errorf("%w: block_size is %s, want 1..%d", ErrMalformed, intText(v, ok), d.lim.MaxTokens)
		}
		ev.BlockSize = int(v)
		return nil
	case fLoraID, fGroupIdx, fSlidingWindow:
		if k != kNil && k != kInt {
			return bad("nil or an integer")
		}
		if k == kNil || f == fSlidingWindow {
			r.skip(2)
			return nil
		}
		// Any integer is taken: one vLLM would not send (negative, past
		// int64) is an adapter, and a group not known to be unindexed.
		v, ok := r.int()
		if f == fLoraID {
			ev.LoRAID = v
			if !ok {
				ev.LoRAID = -1
			}
		} else if ok {
			ev.Group, ev.HasGroup = v, true
		}
		return nil
	case fMedium, fLoraName, fSpecKind:
		if k == kNil {
			r.skip(2)
			return nil
		}
		if k != kStr {
			return bad("nil or a string")
		}
		dst := d.specKind[:]
		switch f {
		case fMedium:
			dst = d.medium[:]
		case fLoraName:
			dst = d.lora[:]
		}
		b, n, ok := r.str(dst)
		if !ok {
			if r.err != nil {
				return nil
			}
			return fmt.Errorf("%w: %s of %d bytes, limit %d", ErrLimit, fieldNames[f], n, len(dst))
		}
		switch f {
		case fMedium:
			ev.Medium = b
		case fLoraName:
			ev.LoRA = b
		default:
			ev.SpecKind = b
		}
		return nil
	case fExtraKeys:
		if k == kNil {
			r.skip(2)
			return nil
		}
		if k != kArray {
			return bad("nil or an array")
		}
		n := r.arrayLen()
		for i := 0; i < n && r.err == nil; i++ {
			switch d.extraKey() {
			case keyOther:
				if d.xOther < 0 {
					d.xOther = i
				}
				fallthrough
			case keyLoRA:
				if ev.Plain < 0 {
					ev.Plain = i
				}
			}
		}
		return nil
	}
	r.skip(2)
	return nil
}

package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Errors. Every error the package returns wraps one of these, with the
// field and value that were wrong.
var (
	// ErrMalformed: a frame or a payload does not follow the protocol.
	ErrMalformed = errors.New("kvevents: malformed message")
	// ErrUnknownEvent: an event's type tag is not one of BlockStored,
	// BlockRemoved, AllBlocksCleared.
	ErrUnknownEvent = errors.New("kvevents: unknown event type")
	// ErrLimit: a message exceeds one of the Limits.
	ErrLimit = errors.New("kvevents: message over limit")
)

// Limits bound what one message may make a Decoder hold. The zero value of
// a field means its default.
type Limits struct {
	// MaxEvents is the most events a batch may hold. Default 8192.
	MaxEvents int
	// MaxBlocks is the most block hashes an event may hold. Default
	// 65536 (a 1M-token prompt in 16-token blocks).
	MaxBlocks int
	// MaxTokens is the most token ids a BlockStored event may hold.
	// Default 1<<20.
	MaxTokens int
	// MaxMapped bounds the engine block hashes the maps of all engines
	// hold together, a Translator's (each engine's own map is bounded by
	// Target.MaxBlocks): an event that would pass it clears the engine
	// holding the most (see Translator). Default DefaultMaxMappedTotal.
	MaxMapped int
}

// Default limits.
const (
	DefaultMaxEvents = 8192
	DefaultMaxBlocks = 1 << 16
	DefaultMaxTokens = 1 << 20
	// DefaultMaxMappedTotal is the default bound of all engines' maps
	// together (Limits.MaxMapped): 1<<23 blocks, 8 engines at
	// DefaultMaxMapped or 128 at 65,536 (the gateway's default, 4× a
	// replica of 16,384 blocks).
	DefaultMaxMappedTotal = 1 << 23
)

func (l Limits) withDefaults() Limits {
	if l.MaxEvents <= 0 {
		l.MaxEvents = DefaultMaxEvents
	}
	if l.MaxBlocks <= 0 {
		l.MaxBlocks = DefaultMaxBlocks
	}
	if l.MaxTokens <= 0 {
		l.MaxTokens = DefaultMaxTokens
	}
	if l.MaxMapped <= 0 {
		l.MaxMapped = DefaultMaxMappedTotal
	}
	return l
}

// Frames splits a ZMQ message into its topic, sequence number and payload:
// three frames, the second 8 bytes, a big-endian sequence number (vLLM's
// ZmqEventPublisher; llm-d-inference-sim's Publisher).
func Frames(frames [][]byte) (topic []byte, seq uint64, payload []byte, err error) {
	if len(frames) != 3 {
		return nil, 0, nil, fmt.Errorf("%w: %d frames, want 3 (topic, sequence, payload)", ErrMalformed, len(frames))
	}
	if len(frames[1]) != 8 {
		return nil, 0, nil, fmt.Errorf("%w: sequence frame of %d bytes, want 8", ErrMalformed, len(frames[1]))
	}
	return frames[0], binary.BigEndian.Uint64(frames[1]), frames[2], nil
}

// Decoder decodes EventBatch payloads, one event at a time into buffers it
// reuses, so memory stays within its Limits however large a payload
// claims to be, and decoding a well-formed batch does not allocate once
// the buffers have grown. A Decoder is not safe for concurrent use.
//
// Both encodings are read, at the batch and at the event level:
//
//   - arrays (msgspec array_like=True, tag=True: vLLM up to its map
//     change, llm-d-inference-sim by default): a batch
//     [ts, [events], dp_rank], events ["BlockStored", hashes, parent,
//     token_ids, block_size, lora_id, medium, lora_name, extra_keys,
//     group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window],
//     ["BlockRemoved", hashes, medium, group_idx], ["AllBlocksCleared"];
//     trailing fields may be missing (omit_defaults) and later ones are
//     ignored;
//   - maps (newer vLLM, llm-d-inference-sim --use-vllm-map-event-format):
//     {"ts", "events", "data_parallel_rank"}, events keyed by the same
//     field names with the tag under "type", in any order.
//
// Field order and names follow vllm/distributed/kv_events.py (BlockStored,
// BlockRemoved, AllBlocksCleared, EventBatch), llm-d-inference-sim
// v0.10.2 pkg/kv-cache/kv_cache_sender.go and llm-d-kv-cache v0.9.0
// pkg/kvevents/engineadapter/vllm_adapter.go.
type Decoder struct {
	lim Limits
	r   *reader
	ev  Event

	tag      [32]byte
	key      [64]byte
	lora     [256]byte
	medium   [32]byte
	specKind [64]byte

	// Of the event's extra_keys (extraKey): the first tuple of one string
	// (nil if none), the index of the first entry neither nil nor that
	// (-1 if none), and the buffers.
	xLoRA       []byte
	xOther      int
	xName, xKey [256]byte
}

// NewDecoder returns a Decoder with the given limits.
func NewDecoder(l Limits) *Decoder {
	return &Decoder{lim: l.withDefaults(), r: newReader()}
}

// Decode decodes an EventBatch payload and calls fn once per event, in
// order, with the event and a nil error; or, when that event is malformed
// (ErrMalformed), of an unknown type (ErrUnknownEvent) or over a limit
// (ErrLimit), with an error naming the field and value, and the event of
// which only Kind is meaningful (zero when the type tag was unreadable or
// unknown); such an event is skipped and decoding goes on. The event is
// valid only until fn returns.
//
// Decode returns an error, wrapping ErrMalformed or ErrLimit, when the
// payload as a whole is unreadable (not msgpack, truncated, not a batch,
// too many events, trailing bytes); fn has then been called for the
// events before the fault, and the rest are lost.
func (d *Decoder) Decode(payload []byte, fn func(*Event, error)) error {
	r := d.r
	r.reset(payload)
	defer r.reset(nil) // do not keep the payload alive
	events := false
	switch k := r.kind(); k {
	case kArray:
		n := r.arrayLen()
		if n < 2 {
			return fmt.Errorf("%w: batch is an array of %d elements, want [ts, events, ...]", ErrMalformed, n)
		}
		if err := d.ts(); err != nil {
			return err
		}
		if err := d.events(fn); err != nil {
			return err
		}
		events = true
		for i := 2; i < n && r.err == nil; i++ { // dp_rank and any later fields
			r.skip(1)
		}
	case kMap:
		n := r.mapLen()
		for i := 0; i < n && r.err == nil; i++ {
			key, ok := d.mapKey()
			switch {
			case !ok:
				if r.err == nil {
					return fmt.Errorf("%w: batch has a non-string key", ErrMalformed)
				}
			case string(key) == "ts":
				if err := d.ts(); err != nil {
					return err
				}
			case string(key) == "events":
				if err := d.events(fn); err != nil {
					return err
				}
				events = true
			default:
				r.skip(1)
			}
		}
	case kBad:
	default:
		return fmt.Errorf("%w: batch is a %s, want an array or a map", ErrMalformed, k)
	}
	if r.err != nil {
		return r.err
	}
	if !events {
		return fmt.Errorf("%w: batch has no events", ErrMalformed)
	}
	if rest := r.r.Len(); rest > 0 {
		return fmt.Errorf("%w: %d trailing bytes after the batch", ErrMalformed, rest)
	}
	return nil
}

// ts checks the batch timestamp, a number.
func (d *Decoder) ts() error {
	switch k := d.r.kind(); k {
	case kFloat, kInt:
		d.r.skip(1)
	case kBad:
	default:
		return fmt.Errorf("%w: batch ts is a %s, want a number", ErrMalformed, k)
	}
	return d.r.err
}

// mapKey reads a map key into d.key. ok is false, the key consumed, when
// it is not a string; a string too long to be a key we know is an
// unknown one, returned empty.
func (d *Decoder) mapKey() ([]byte, bool) {
	if k := d.r.kind(); k != kStr {
		d.r.skip(1)
		return nil, false
	}
	b, _, ok := d.r.str(d.key[:])
	if !ok && d.r.err == nil {
		return nil, true
	}
	return b, ok
}

func (d *Decoder) events(fn func(*Event, error)) error {
	r := d.r
	switch k := r.kind(); k {
	case kArray:
	case kBad:
		return r.err
	default:
		return fmt.Errorf("%w: batch events is a %s, want an array", ErrMalformed, k)
	}
	n := r.arrayLen()
	if n > d.lim.MaxEvents {
		return fmt.Errorf("%w: batch of %d events, limit %d", ErrLimit, n, d.lim.MaxEvents)
	}
	for i := 0; i < n; i++ {
		err := d.event()
		if r.err != nil {
			return r.err
		}
		if err != nil {
			err = fmt.Errorf("event %d: %w", i, err)
		}
		fn(&d.ev, err)
	}
	return nil
}

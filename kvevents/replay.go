package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/go-zeromq/zmq4"
)

// Recovering a sequence gap through the engine's replay endpoint.
//
// vLLM's ZmqEventPublisher (vllm/distributed/kv_events.py, at
// vllm-project/vllm commit 0181ea3173e5) binds a ROUTER socket on its
// replay_endpoint and keeps its last buffer_steps batches (default
// 10000). A client (a DEALER here) sends two frames, an empty delimiter
// and the first wanted sequence number as 8 bytes big-endian; the
// publisher answers, for each buffered batch whose sequence is at least
// that, the frames (empty, seq, payload), then the end marker (empty,
// 0xFFFFFFFFFFFFFFFF, empty). llm-d-inference-sim after v0.10.2 (its
// kv_events_replayer.go) adds the topic before seq: (empty, topic, seq,
// payload), and so its end marker. ReplayFrame reads both.

// ReplayOptions configure the recovery of sequence gaps (see
// Translator.SetReplay). The zero value has every default.
type ReplayOptions struct {
	// Timeout bounds one replay: dial, request, and every batch up to
	// the one before the gap. Default DefaultReplayTimeout.
	Timeout time.Duration
	// MaxBatches bounds the batches one replay may recover: a larger gap
	// is not asked for. Default DefaultReplayMaxBatches.
	MaxBatches int
	// MaxBytes bounds the payload bytes one replay holds before applying
	// them. Default DefaultReplayMaxBytes.
	MaxBytes int
	// MaxMessageBytes bounds one replayed message, all frames. Default
	// DefaultMaxMessageBytes.
	MaxMessageBytes int
	// Logf receives the replay socket's faults. Default: discarded.
	Logf func(format string, args ...any)
}

// Defaults of ReplayOptions.
const (
	DefaultReplayTimeout    = 2 * time.Second
	DefaultReplayMaxBatches = 1024
	DefaultReplayMaxBytes   = 32 << 20
)

func (o ReplayOptions) withDefaults() ReplayOptions {
	if o.Timeout <= 0 {
		o.Timeout = DefaultReplayTimeout
	}
	if o.MaxBatches <= 0 {
		o.MaxBatches = DefaultReplayMaxBatches
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultReplayMaxBytes
	}
	if o.MaxMessageBytes <= 0 {
		o.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	return o
}

// ErrReplay reports a replay that could not fill a gap.
var ErrReplay = errors.New("kvevents: replay")

// ReplayEnd is the sequence number of the end marker.
const ReplayEnd = ^uint64(0)

// ReplayFrame reads one message a replay endpoint sends a DEALER: the
// empty delimiter, then seq and payload (vLLM), or topic, seq and payload
// (llm-d-inference-sim). end is true for the end marker (seq
// 0xFFFFFFFFFFFFFFFF). payload aliases frames.
func ReplayFrame(frames [][]byte) (seq uint64, payload []byte, end bool, err error) {
	if len(frames) == 0 || len(frames[0]) != 0 {
		return 0, nil, false, fmt.Errorf("%w: replay message without its empty delimiter frame", ErrMalformed)
	}
	f := frames[1:]
	switch len(f) {
	case 2: // seq, payload
	case 3: // topic, seq, payload
		f = f[1:]
	default:
		return 0, nil, false, fmt.Errorf("%w: replay message of %d frames, want 3 (delimiter, sequence, payload) or 4 (with a topic)", ErrMalformed, len(frames))
	}
	if len(f[0]) != 8 {
		return 0, nil, false, fmt.Errorf("%w: replay sequence frame of %d bytes, want 8", ErrMalformed, len(f[0]))
	}
	seq = binary.BigEndian.Uint64(f[0])
	if seq == ReplayEnd {
		if len(f[1]) != 0 {
			return 0, nil, false, fmt.Errorf("%w: replay end marker with a %d-byte payload", ErrMalformed, len(f[1]))
		}
		return seq, nil, true, nil
	}
	return seq, f[1], false, nil
}

// replayer fetches batches from replay endpoints. Its options are
// immutable.
type replayer struct {
	o ReplayOptions
	// dial opens a DEALER; tests may swap it.
	dial func(ctx context.Context, endpoint string, from []netip.Addr) (zmq4.Socket, error)
}

// SetReplay enables the recovery of sequence gaps for engines whose
// Target names a Replay endpoint, with o's bounds. Call it before the
// first message; a Translator without it clears an engine on a gap, as
// do engines without a Replay endpoint.
func (t *Translator) SetReplay(o ReplayOptions) {
	r := &replayer{o: o.withDefaults()}
	r.dial = r.dialDealer
	t.rep.Store(r)
}

// replayOf returns the Translator's replayer, nil if not enabled.
func (t *Translator) replayOf() *replayer { return t.rep.Load() }

func (r *replayer) dialDealer(ctx context.Context, endpoint string, from []netip.Addr) (zmq4.Socket, error) {
	registerTransports()
	ep, err := guardedEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	var check func(netip.Addr) error
	if len(from) > 0 {
		check = func(remote netip.Addr) error {
			if remote.IsValid() && !slices.Contains(from, remote) {
				return fmt.Errorf("%w: %s answers from %s, not the engine's host (%v)", ErrReplay, endpoint, remote, from)
			}
			return nil
		}
	}
	g := &guardConfig{endpoint: endpoint, maxMessage: r.o.MaxMessageBytes, maxFrames: 5, handshake: r.o.Timeout,
		message: r.o.Timeout, maxConns: 1, maxPerHost: 1, gen: new(atomic.Uint64), st: &guardCounters{}, dialCheck: check}
	logger := log.New(logWriter(r.o.Logf), "zmq4 replay: ", 0)
	sock := zmq4.NewDealer(withGuard(ctx, g), zmq4.WithLogger(logger), zmq4.WithAutomaticReconnect(false),
		zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(r.o.Timeout))
	if err := sock.Dial(ep); err != nil {
		sock.Close()
		return nil, err
	}
	return sock, nil
}

// batch is one replayed message.
type batch struct {
	seq     uint64
	payload []byte
}

// fetch asks endpoint for the batches from first to last inclusive and
// returns them in order, or an error if the endpoint cannot give exactly
// those within the options' bounds. It asks from the batch before first,
// which must be the one heard, its payload's XXH64 prev (not returned,
// nor counted in the bounds): else the engine restarted. from, when not
// empty, lists the addresses the endpoint must answer from.
func (r *replayer) fetch(endpoint string, from []netip.Addr, first, last, prev uint64) ([]batch, error) {
	n := last - first + 1
	if last < first || first == 0 || n > uint64(r.o.MaxBatches) {
		return nil, fmt.Errorf("%w: a gap of %d batches, over the bound of %d", ErrReplay, n, r.o.MaxBatches)
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.o.Timeout)
	defer cancel()
	sock, err := r.dial(ctx, endpoint, from)
	if err != nil {
		return nil, fmt.Errorf("%w: dial %s: %v", ErrReplay, endpoint, err)
	}
	defer sock.Close()
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], first-1)
	if err := sock.Send(zmq4.NewMsgFrom([]byte{}, req[:])); err != nil {
		return nil, fmt.Errorf("%w: request to %s: %v", ErrReplay, endpoint, err)
	}
	out := make([]batch, 0, min(n, 64))
	bytes := 0
	for next := first - 1; next <= last; {
		msg, err := sock.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("%w: %s: no batch %d within %v", ErrReplay, endpoint, next, r.o.Timeout)
			}
			return nil, fmt.Errorf("%w: %s: %v", ErrReplay, endpoint, err)
		}
		seq, payload, end, err := ReplayFrame(msg.Frames)
		switch {
		case err != nil:
			return nil, fmt.Errorf("%w: %s: %v", ErrReplay, endpoint, err)
		case end:
			return nil, fmt.Errorf("%w: %s ended the replay before batch %d (its buffer no longer holds it)", ErrReplay, endpoint, next)
		case seq != next:
			return nil, fmt.Errorf("%w: %s replayed batch %d where %d was due (its buffer no longer holds it)", ErrReplay, endpoint, seq, next)
		case seq == first-1:
			if xxhash.Sum64(payload) != prev {
				return nil, fmt.Errorf("%w: %s's batch %d is not the one applied (the engine restarted)", ErrReplay, endpoint, seq)
			}
			next++
			continue
		}
		bytes += len(payload)
		if bytes > r.o.MaxBytes {
			return nil, fmt.Errorf("%w: %s: over %d bytes replayed", ErrReplay, endpoint, r.o.MaxBytes)
		}
		out = append(out, batch{seq: seq, payload: payload})
		next++
	}
	return out, nil
}

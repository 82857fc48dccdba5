package picker

import (
	"fmt"
	"time"
)

// Defaults of Options.
const (
	// DefaultMaxBodyBytes bounds request bodies, as the HTTP gateway's
	// default does: 8 MiB.
	DefaultMaxBodyBytes = 8 << 20
	// DefaultMaxBufferedBytes bounds the memory all streams together
	// hold (Options.MaxBufferedBytes): 256 MiB, 31 bodies of
	// DefaultMaxBodyBytes and their streams, or 8,192 streams without
	// bodies.
	DefaultMaxBufferedBytes = 256 << 20
	// DefaultRequestTimeout bounds a stream's request phase
	// (Options.RequestTimeout): 60s from the stream's start to the
	// picker's answer, time for a client to upload DefaultMaxBodyBytes at
	// about 1 Mbit/s.
	DefaultRequestTimeout = 60 * time.Second
	// DefaultResponseTimeout bounds the wait for the response headers
	// once the request is routed (Options.ResponseTimeout): 10 minutes,
	// the HTTP gateway's bound on a non-streamed answer (whose headers
	// come when it is complete).
	DefaultResponseTimeout = 10 * time.Minute
	// MaxChunkBytes is the largest body chunk the picker sends back to
	// Envoy: 62,000 bytes, GIE v1.5.0's BodyByteLimit
	// (pkg/common/envoy/chunking.go), under the 64 KiB that Envoy's
	// FULL_DUPLEX_STREAMED mode recommends.
	MaxChunkBytes = 62000
)

// Options configures a Server. The zero value is ready to use.
type Options struct {
	// MaxBodyBytes bounds a request body; a larger one is answered with
	// 413 before the Router sees it. Zero means DefaultMaxBodyBytes.
	MaxBodyBytes int
	// MaxBufferedBytes bounds the memory the streams hold, summed over
	// all of them: StreamBytes for each open stream, plus the request
	// bodies being read (buffer capacity, counted as it grows). A stream
	// whose body would take the sum past it is answered at once with 503
	// (ErrOverloaded) and ends; a stream that would take it past by
	// opening ends at once with RESOURCE_EXHAUSTED (Envoy then answers
	// its status_on_error). Zero means DefaultMaxBufferedBytes; it must be
	// at least MaxBodyBytes + StreamBytes.
	MaxBufferedBytes int64
	// RequestTimeout bounds a stream's request phase, from the stream's
	// start to the picker's answer (after the whole body): a stream still
	// in it then is answered 408 (ErrRequestTimeout) and ends. Zero means
	// DefaultRequestTimeout; negative, no bound.
	RequestTimeout time.Duration
	// ResponseTimeout bounds the wait for the response headers once the
	// request is routed: a stream still waiting then ends with
	// DeadlineExceeded and its request is reported Done with an error, so
	// its load is released. Zero means DefaultResponseTimeout; negative,
	// no bound. Keep it above the data plane's own route timeout.
	ResponseTimeout time.Duration
	// MaxFallbacks is how many of a Pick's fallback endpoints follow the
	// chosen one in x-gateway-destination-endpoint ("ip:port,ip:port,...").
	// Zero, the default, sends the chosen endpoint alone: Envoy's
	// ORIGINAL_DST cluster parses the header as one address and rejects a
	// list, so only data planes that implement the protocol's fallback
	// list should raise it.
	MaxFallbacks int
	// DisableUpstreamStream forwards the requests a Pick allows to be
	// streamed from the engine and assembled (Pick.Assemble) as they are:
	// the picker then learns their first token only when the whole
	// answer has come. By default (false) they are streamed and
	// assembled, when Envoy's response body mode is FULL_DUPLEX_STREAMED
	// and MaxBufferedBytes has room (see Pick.Assemble).
	DisableUpstreamStream bool
	// Clock reads the time for latencies. Default time.Now.
	Clock func() time.Time
}

func (o Options) withDefaults() (Options, error) {
	switch {
	case o.MaxBodyBytes < 0:
		return o, fmt.Errorf("%w: MaxBodyBytes %d is negative", ErrInvalidOptions, o.MaxBodyBytes)
	case o.MaxFallbacks < 0:
		return o, fmt.Errorf("%w: MaxFallbacks %d is negative", ErrInvalidOptions, o.MaxFallbacks)
	case o.MaxBufferedBytes < 0:
		return o, fmt.Errorf("%w: MaxBufferedBytes %d is negative", ErrInvalidOptions, o.MaxBufferedBytes)
	}
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.MaxBufferedBytes == 0 {
		o.MaxBufferedBytes = max(DefaultMaxBufferedBytes, int64(o.MaxBodyBytes)+StreamBytes)
	}
	if o.MaxBufferedBytes < int64(o.MaxBodyBytes)+StreamBytes {
		return o, fmt.Errorf("%w: MaxBufferedBytes %d is below MaxBodyBytes %d + StreamBytes %d: no body of the largest size could be read",
			ErrInvalidOptions, o.MaxBufferedBytes, o.MaxBodyBytes, StreamBytes)
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	if o.ResponseTimeout == 0 {
		o.ResponseTimeout = DefaultResponseTimeout
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	return o, nil
}

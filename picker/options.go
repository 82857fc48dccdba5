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
	// MaxFallbacks is how many of a Pick's fallback endpoints follow the
	// chosen one in x-gateway-destination-endpoint ("ip:port,ip:port,...").
	// Zero, the default, sends the chosen endpoint alone: Envoy's
	// ORIGINAL_DST cluster parses the header as one address and rejects a
	// list, so only data planes that implement the protocol's fallback
	// list should raise it.
	MaxFallbacks int
	// Clock reads the time for latencies. Default time.Now.
	Clock func() time.Time
}

func (o Options) withDefaults() (Options, error) {
	switch {
	case o.MaxBodyBytes < 0:
		return o, fmt.Errorf("%w: MaxBodyBytes %d is negative", ErrInvalidOptions, o.MaxBodyBytes)
	case o.MaxFallbacks < 0:
		return o, fmt.Errorf("%w: MaxFallbacks %d is negative", ErrInvalidOptions, o.MaxFallbacks)
	}
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	return o, nil
}

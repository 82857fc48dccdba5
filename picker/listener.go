package picker

import (
	"net"

	"github.com/examlops/gateway/internal/netlimit"
)

// DefaultMaxConnections is the default bound of LimitListener in
// `exa serve picker` (--max-connections): 1,024 connections open at once,
// far above the few an Envoy keeps (one per worker thread).
const DefaultMaxConnections = 1024

// ConnLimiter is a net.Listener that keeps at most a fixed number of its
// connections open: one accepted past it is closed at once, before anything
// is read from it, and counted (Open, Refused). Make one with
// LimitListener. It is safe for concurrent use.
type ConnLimiter = netlimit.Listener

// LimitListener returns l keeping at most n connections open (n < 1 is
// taken as 1). Give it to grpc.Server.Serve: a connection is open from its
// Accept until its Close.
func LimitListener(l net.Listener, n int) *ConnLimiter { return netlimit.New(l, n) }

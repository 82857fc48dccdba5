// Package netlimit bounds the connections a server keeps open: the
// picker's gRPC port and the HTTP gateway's front share it.
package netlimit

import (
	"errors"
	"net"
	"sync/atomic"
)

// Listener is a net.Listener that keeps at most a fixed number of its
// connections open: one accepted past it is closed at once, before anything
// is read from it, and counted. Make one with New. It is safe for
// concurrent use.
type Listener struct {
	net.Listener
	max     int64
	open    atomic.Int64
	refused atomic.Uint64
}

// New returns l keeping at most n connections open (n < 1 is taken as
// 1). Give it to the server's Serve: a connection is open from its Accept
// until its Close.
func New(l net.Listener, n int) *Listener {
	return &Listener{Listener: l, max: int64(max(n, 1))}
}

// Accept waits for a connection within the bound, closing those past it.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) <= l.max {
			return &limitedConn{Conn: c, l: l}, nil
		}
		l.open.Add(-1)
		l.refused.Add(1)
		c.Close()
	}
}

// Open is the number of connections accepted and not yet closed.
func (l *Listener) Open() int64 { return l.open.Load() }

// Refused is the number of connections closed at once because Open was at
// the bound.
func (l *Listener) Refused() uint64 { return l.refused.Load() }

// limitedConn gives its place back to its Listener when first closed.
type limitedConn struct {
	net.Conn
	l      *Listener
	closed atomic.Bool
}

// CloseWrite shuts down the writing side of the connection it wraps
// (a *net.TCPConn's), so that a server can end a connection with unread
// input gently (the lean server's and net/http's lingering close); an
// error where the connection has none.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

func (c *limitedConn) Close() error {
	if !c.closed.Swap(true) {
		c.l.open.Add(-1)
	}
	return c.Conn.Close()
}

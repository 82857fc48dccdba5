// Package netlimit bounds the connections a server keeps open: the
// picker's gRPC port and the HTTP gateway's front share it.
package netlimit

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
)

// Listener is a net.Listener that keeps at most a fixed number of its
// connections open, and optionally at most a fixed number from one source
// address (PerSource): one accepted past either is closed at once, before
// anything is read from it, and counted. Make one with New. It is safe
// for concurrent use.
type Listener struct {
	net.Listener
	max     int64
	open    atomic.Int64
	refused atomic.Uint64

	perSource      int // 0: no bound per source
	mu             sync.Mutex
	bySource       map[netip.Addr]int // open connections per source, with perSource
	refusedSources atomic.Uint64
}

// PerSource bounds the connections open from one source address (its IP,
// an IPv4-mapped IPv6 address taken as IPv4) to n, besides the bound of
// all of them; n < 1 means no bound per source, the default. Call it
// before the first Accept. It returns l.
func (l *Listener) PerSource(n int) *Listener {
	l.perSource = max(n, 0)
	l.bySource = map[netip.Addr]int{}
	return l
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
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			l.refused.Add(1)
			c.Close()
			continue
		}
		src, ok := l.admitSource(c)
		if !ok {
			l.open.Add(-1)
			l.refusedSources.Add(1)
			c.Close()
			continue
		}
		return &limitedConn{Conn: c, l: l, src: src}, nil
	}
}

// admitSource counts c against its source's bound, and reports whether
// it is within it (always, without PerSource or a source address).
func (l *Listener) admitSource(c net.Conn) (netip.Addr, bool) {
	if l.perSource == 0 {
		return netip.Addr{}, true
	}
	ap, err := netip.ParseAddrPort(c.RemoteAddr().String())
	if err != nil {
		return netip.Addr{}, true
	}
	src := ap.Addr().Unmap()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bySource[src] >= l.perSource {
		return netip.Addr{}, false
	}
	l.bySource[src]++
	return src, true
}

// RefusedSources is the number of connections closed at once because
// their source had PerSource open.
func (l *Listener) RefusedSources() uint64 { return l.refusedSources.Load() }

// Open is the number of connections accepted and not yet closed.
func (l *Listener) Open() int64 { return l.open.Load() }

// Refused is the number of connections closed at once because Open was at
// the bound.
func (l *Listener) Refused() uint64 { return l.refused.Load() }

// limitedConn gives its place back to its Listener when first closed.
type limitedConn struct {
	net.Conn
	l      *Listener
	src    netip.Addr // counted against PerSource, if valid
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
		if c.src.IsValid() {
			c.l.mu.Lock()
			if c.l.bySource[c.src]--; c.l.bySource[c.src] <= 0 {
				delete(c.l.bySource, c.src)
			}
			c.l.mu.Unlock()
		}
	}
	return c.Conn.Close()
}

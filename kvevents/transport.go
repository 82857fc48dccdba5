package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// The ZMQ library trusts its peers: it allocates whatever frame size a
// peer announces (up to 2^63 bytes), accepts any number of frames per
// message, and performs each handshake inside its accept loop with no
// deadline, so one silent peer stalls every later connection. Sockets of
// this package therefore use the transports below ("kvtcp", "kvipc"),
// which wrap TCP and Unix sockets with a guard that reads the ZMTP 3
// stream alongside the library: it fails the connection on a frame or a
// message over the size limit or with too many frames, and on a handshake
// not done within the deadline. The limits travel in the context the
// socket was made with.

type guardKey struct{}

// guardConfig is what the guard of a socket's connections enforces.
type guardConfig struct {
	maxMessage int           // bytes per message, all frames
	maxFrames  int           // frames per message
	handshake  time.Duration // greeting and handshake deadline
	maxConns   int           // accepted connections at once (bind)
	conns      atomic.Int64
}

func withGuard(ctx context.Context, g *guardConfig) context.Context {
	return context.WithValue(ctx, guardKey{}, g)
}

func guardOf(ctx context.Context) *guardConfig {
	if g, ok := ctx.Value(guardKey{}).(*guardConfig); ok {
		return g
	}
	return &guardConfig{maxMessage: DefaultMaxMessageBytes, maxFrames: 16, handshake: 10 * time.Second, maxConns: 1024}
}

var registerOnce sync.Once

func registerTransports() {
	registerOnce.Do(func() {
		for name, network := range map[string]string{"kvtcp": "tcp", "kvipc": "unix"} {
			if err := zmq4.RegisterTransport(name, guardedTransport{inner: transport.New(network)}); err != nil {
				panic(err) // the names are ours; only a second registration fails
			}
		}
	})
}

// guardedEndpoint rewrites a tcp:// or ipc:// endpoint to its guarded
// transport.
func guardedEndpoint(ep string) (string, error) {
	for _, p := range [...]string{"tcp", "ipc"} {
		if rest, ok := strings.CutPrefix(ep, p+"://"); ok && rest != "" {
			return "kv" + p + "://" + rest, nil
		}
	}
	return "", fmt.Errorf("kvevents: endpoint %q: want tcp://host:port or ipc://path", ep)
}

type guardedTransport struct{ inner transport.Transport }

func (t guardedTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := t.inner.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	return newGuardConn(c, guardOf(ctx), nil), nil
}

func (t guardedTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := t.inner.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return &guardedListener{Listener: l, g: guardOf(ctx)}, nil
}

func (t guardedTransport) Addr(ep string) (string, error) { return t.inner.Addr(ep) }

type guardedListener struct {
	net.Listener
	g *guardConfig
}

func (l *guardedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.g.conns.Add(1) > int64(l.g.maxConns) {
			l.g.conns.Add(-1)
			c.Close()
			continue
		}
		return newGuardConn(c, l.g, func() { l.g.conns.Add(-1) }), nil
	}
}

var errGuard = errors.New("kvevents: ZMTP guard")

// guardConn follows the ZMTP 3 byte stream it reads: a 64-byte greeting,
// then frames of a flags byte (MORE 1, LONG 2, COMMAND 4), a size of 1 or
// 8 bytes, and a body (RFC 23/ZMTP).
type guardConn struct {
	net.Conn
	g      *guardConfig
	onDone func()
	once   sync.Once

	greeting  int    // greeting bytes still to read
	hdr       []byte // the frame header read so far
	hdrBuf    [9]byte
	body      uint64 // body bytes still to read
	more      bool   // the frame being read has MORE set
	frames    int    // frames of the current message so far
	msgBytes  uint64 // bytes of the current message so far
	handshook bool
	err       error
}

func newGuardConn(c net.Conn, g *guardConfig, onDone func()) *guardConn {
	gc := &guardConn{Conn: c, g: g, onDone: onDone, greeting: 64}
	if g.handshake > 0 {
		_ = c.SetReadDeadline(time.Now().Add(g.handshake))
	}
	return gc
}

func (c *guardConn) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.Conn.Read(p)
	if gerr := c.follow(p[:n]); gerr != nil {
		c.err = gerr
		c.Close()
		return 0, gerr
	}
	if err != nil {
		// The library does not close a connection whose handshake
		// failed; closing here frees it, whatever the stage.
		c.Close()
	}
	return n, err
}

func (c *guardConn) Close() error {
	c.once.Do(func() {
		if c.onDone != nil {
			c.onDone()
		}
	})
	return c.Conn.Close()
}

// follow advances the parser over bytes read.
func (c *guardConn) follow(b []byte) error {
	for len(b) > 0 {
		switch {
		case c.greeting > 0:
			k := min(c.greeting, len(b))
			c.greeting -= k
			b = b[k:]
		case c.body > 0:
			k := uint64(len(b))
			if k > c.body {
				k = c.body
			}
			c.body -= k
			b = b[k:]
			if c.body == 0 {
				c.frameDone()
			}
		default: // a frame header
			if len(c.hdr) == 0 {
				c.hdr = c.hdrBuf[:0]
			}
			c.hdr = append(c.hdr, b[0])
			b = b[1:]
			flags := c.hdr[0]
			need := 2
			if flags&2 != 0 {
				need = 9
			}
			if len(c.hdr) < need {
				continue
			}
			var size uint64
			if need == 2 {
				size = uint64(c.hdr[1])
			} else {
				size = binary.BigEndian.Uint64(c.hdr[1:9])
			}
			c.hdr = c.hdr[:0]
			command := flags&4 != 0
			c.more = flags&1 != 0 && !command
			if !command {
				c.frames++
				c.msgBytes += size
				if c.frames > c.g.maxFrames {
					return fmt.Errorf("%w: a message of more than %d frames", errGuard, c.g.maxFrames)
				}
			}
			if size > uint64(c.g.maxMessage) || c.msgBytes > uint64(c.g.maxMessage) {
				return fmt.Errorf("%w: a frame of %d bytes makes a message over the %d-byte limit", errGuard, size, c.g.maxMessage)
			}
			c.body = size
			if size == 0 {
				c.frameDone()
			}
		}
	}
	return nil
}

func (c *guardConn) frameDone() {
	if !c.more {
		c.frames, c.msgBytes = 0, 0
	}
	if !c.handshook { // the peer's READY: the handshake is over
		c.handshook = true
		if c.g.handshake > 0 {
			_ = c.Conn.SetReadDeadline(time.Time{})
		}
	}
}

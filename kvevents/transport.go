package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
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
// not done within the deadline, or a message not done within its own
// deadline once begun; on a bound endpoint it also refuses connections
// and topics the SourcePolicy refuses, and performs each connection's
// handshake ahead of the library, on a goroutine of its own (see
// handshake.go). The limits travel in the context the socket was made
// with.

type guardKey struct{}

// guardConfig is what the guard of a socket's connections enforces.
type guardConfig struct {
	endpoint   string        // as given to Bind or Connect
	maxMessage int           // bytes per message, all frames
	maxFrames  int           // frames per message
	handshake  time.Duration // greeting and handshake deadline
	message    time.Duration // deadline of a message once its first byte is read
	maxConns   int           // accepted connections at once (bind)
	maxPerHost int           // accepted connections at once from one address (bind)
	policy     SourcePolicy  // who may publish what (bind); nil: anyone
	gen        *atomic.Uint64
	st         *guardCounters
	// dialCheck, when set, is asked about a dialled connection's remote
	// address before its handshake; an error refuses the connection.
	dialCheck func(remote netip.Addr) error
}

// guardCounters count what the guard of one endpoint did, over its life.
type guardCounters struct {
	open, accepted, full, hostFull, refusedSource, refusedTopic,
	handshakeTimeouts, messageTimeouts, oversize, badHandshakes atomic.Uint64

	mu     sync.Mutex
	byHost map[netip.Addr]int // open connections by source address
}

// takeHost counts a connection from a, unless max are open from it.
func (c *guardCounters) takeHost(a netip.Addr, max int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byHost[a] >= max {
		return false
	}
	if c.byHost == nil {
		c.byHost = map[netip.Addr]int{}
	}
	c.byHost[a]++
	return true
}

func (c *guardCounters) releaseHost(a netip.Addr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byHost[a]--; c.byHost[a] <= 0 {
		delete(c.byHost, a)
	}
}

func (c *guardCounters) snapshot() GuardStats {
	return GuardStats{Open: c.open.Load(), Accepted: c.accepted.Load(), Full: c.full.Load(), HostFull: c.hostFull.Load(),
		RefusedSource: c.refusedSource.Load(), RefusedTopic: c.refusedTopic.Load(),
		HandshakeTimeouts: c.handshakeTimeouts.Load(), MessageTimeouts: c.messageTimeouts.Load(), Oversize: c.oversize.Load(),
		BadHandshakes: c.badHandshakes.Load()}
}

// GuardStats count what a Subscriber's guard did to the connections of one
// endpoint. Counters only grow; Open is the connections open now.
type GuardStats struct {
	// Open is the connections open now (a bound endpoint's publishers).
	Open uint64
	// Accepted counts connections accepted (bind).
	Accepted uint64
	// Full counts connections refused because MaxConns were open,
	// HostFull because MaxConnsPerHost were open from their address.
	Full, HostFull uint64
	// RefusedSource counts connections refused by the SourcePolicy
	// because of their source address; RefusedTopic connections closed
	// because they published a topic their source may not.
	RefusedSource, RefusedTopic uint64
	// HandshakeTimeouts counts connections closed for not completing
	// their ZMTP greeting and handshake within HandshakeTimeout;
	// MessageTimeouts for not completing a message within MessageTimeout
	// of its first byte.
	HandshakeTimeouts, MessageTimeouts uint64
	// Oversize counts connections closed for a message over
	// MaxMessageBytes or of too many frames.
	Oversize uint64
	// BadHandshakes counts connections (bind) closed for a handshake
	// that is not a ZMTP 3 PUB's with the NULL mechanism, or of more than
	// 16 KiB.
	BadHandshakes uint64
}

func withGuard(ctx context.Context, g *guardConfig) context.Context {
	return context.WithValue(ctx, guardKey{}, g)
}

func guardOf(ctx context.Context) *guardConfig {
	if g, ok := ctx.Value(guardKey{}).(*guardConfig); ok {
		return g
	}
	return &guardConfig{maxMessage: DefaultMaxMessageBytes, maxFrames: 16, handshake: 10 * time.Second,
		message: 10 * time.Second, maxConns: DefaultMaxConns, maxPerHost: DefaultMaxConnsPerHost, gen: new(atomic.Uint64), st: &guardCounters{}}
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
	g := guardOf(ctx)
	if g.dialCheck != nil {
		if err := g.dialCheck(remoteAddr(c)); err != nil {
			c.Close()
			return nil, err
		}
	}
	return newGuardConn(c, g, nil), nil
}

func (t guardedTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := t.inner.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return newGuardedListener(l, guardOf(ctx)), nil
}

func (t guardedTransport) Addr(ep string) (string, error) { return t.inner.Addr(ep) }

// guardedListener accepts connections on a goroutine of its own, refuses
// those the guard's limits or policy refuse, and performs each other's
// handshake on a goroutine of the connection's (readHandshake); Accept
// returns the connections whose handshake passed, to the library's accept
// loop, which then completes it without waiting on the peer. A peer slow
// to greet thus holds only its own connection (and its slot under
// MaxConns and MaxConnsPerHost), for at most the handshake deadline.
type guardedListener struct {
	net.Listener
	g     *guardConfig
	ready chan *guardConn // connections handshaken, for Accept
	done  chan struct{}   // closed by Close
	once  sync.Once

	mu      sync.Mutex
	shaking map[*guardConn]struct{} // connections in their handshake
}

func newGuardedListener(inner net.Listener, g *guardConfig) *guardedListener {
	l := &guardedListener{Listener: inner, g: g, ready: make(chan *guardConn), done: make(chan struct{}),
		shaking: map[*guardConn]struct{}{}}
	go l.acceptLoop()
	return l
}

// Accept returns the next connection whose handshake passed.
func (l *guardedListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting and closes the connections in their handshake.
func (l *guardedListener) Close() error {
	l.once.Do(func() { close(l.done) })
	err := l.Listener.Close()
	l.mu.Lock()
	for c := range l.shaking {
		c.Close()
	}
	l.mu.Unlock()
	return err
}

func (l *guardedListener) closed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// acceptLoop accepts connections until the listener is closed, waiting
// 5 ms, doubling to 1 s, after each consecutive failure (out of file
// descriptors, say).
func (l *guardedListener) acceptLoop() {
	var wait time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if l.closed() || errors.Is(err, net.ErrClosed) {
				return
			}
			wait = min(max(2*wait, 5*time.Millisecond), time.Second)
			t := time.NewTimer(wait)
			select {
			case <-l.done:
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		wait = 0
		if gc := l.admit(c); gc != nil {
			l.mu.Lock()
			if l.closed() {
				l.mu.Unlock()
				gc.Close()
				return
			}
			l.shaking[gc] = struct{}{}
			l.mu.Unlock()
			go l.handshake(gc)
		}
	}
}

// handshake reads c's handshake and hands c to Accept, or closes it.
func (l *guardedListener) handshake(c *guardConn) {
	err := c.readHandshake()
	l.mu.Lock()
	delete(l.shaking, c)
	l.mu.Unlock()
	if err != nil {
		c.Close()
		return
	}
	select {
	case l.ready <- c:
	case <-l.done:
		c.Close()
	}
}

// admit applies the policy and the connection limits to a connection
// just accepted: it returns the connection guarded, or nil when it
// closed it.
func (l *guardedListener) admit(c net.Conn) *guardConn {
	st := l.g.st
	remote := remoteAddr(c)
	if l.g.policy != nil {
		if err := l.g.policy.AcceptConn(l.g.endpoint, remote); err != nil {
			st.refusedSource.Add(1)
			c.Close()
			return nil
		}
	}
	if st.open.Add(1) > uint64(l.g.maxConns) {
		st.open.Add(^uint64(0))
		st.full.Add(1)
		c.Close()
		return nil
	}
	perHost := l.g.maxPerHost
	if lim, ok := l.g.policy.(ConnLimiter); ok {
		if n := lim.MaxConnsFrom(l.g.endpoint, remote); n > 0 {
			perHost = n
		}
	}
	byHost := remote.IsValid() // a Unix socket's peers have no address
	if byHost && !st.takeHost(remote, perHost) {
		st.open.Add(^uint64(0))
		st.hostFull.Add(1)
		c.Close()
		return nil
	}
	st.accepted.Add(1)
	gc := newGuardConn(c, l.g, func() {
		st.open.Add(^uint64(0))
		if byHost {
			st.releaseHost(remote)
		}
	})
	gc.remote, gc.checkTopics = remote, l.g.policy != nil
	return gc
}

// remoteAddr is a connection's source address, unmapped; the zero Addr
// for a Unix socket.
func remoteAddr(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			return ip.Unmap()
		}
	}
	return netip.Addr{}
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
	command   bool   // the frame being read is a command
	frames    int    // frames of the current message so far
	msgBytes  uint64 // bytes of the current message so far
	handshook bool
	inMessage bool // a message (or command) has begun: its deadline runs
	err       error

	// A bound endpoint's connection is handshaken ahead of the library
	// (readHandshake): pre holds what was read then, for the library's
	// reads; swallow counts the bytes of the library's greeting, already
	// sent, still to drop from its writes.
	pre     []byte
	swallow int

	// Topic checks (bind with a SourcePolicy): the first frame of each
	// message is its topic, which the policy must allow from remote.
	checkTopics bool
	remote      netip.Addr
	capturing   bool   // the frame being read is a topic
	topic       []byte // the topic read so far
	allowed     []byte // the last topic allowed
	allowedGen  uint64 // the policy generation it was allowed in
	hasAllowed  bool
}

// maxTopicBytes bounds a topic checked against a SourcePolicy.
const maxTopicBytes = 512

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
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		if c.pre = c.pre[n:]; len(c.pre) == 0 {
			c.pre = nil
		}
		return n, nil
	}
	n, err := c.Conn.Read(p)
	if gerr := c.follow(p[:n]); gerr != nil {
		c.err = gerr
		c.Close()
		return 0, gerr
	}
	if err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			if !c.handshook {
				c.g.st.handshakeTimeouts.Add(1)
			} else {
				c.g.st.messageTimeouts.Add(1)
			}
		}
		// The library does not close a connection whose handshake
		// failed; closing here frees it, whatever the stage.
		c.Close()
	}
	return n, err
}

// Write writes p, less what remains of the library's greeting when it was
// sent ahead (readHandshake), which must be what was sent.
func (c *guardConn) Write(p []byte) (int, error) {
	if c.swallow == 0 {
		return c.Conn.Write(p)
	}
	k := min(c.swallow, len(p))
	off := len(libGreeting) - c.swallow
	if !bytes.Equal(p[:k], libGreeting[off:off+k]) {
		return 0, fmt.Errorf("%w: the library's greeting differs from the one sent ahead of it", errGuard)
	}
	c.swallow -= k
	if k == len(p) {
		return k, nil
	}
	n, err := c.Conn.Write(p[k:])
	return k + n, err
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
			if c.capturing {
				c.topic = append(c.topic, b[:k]...)
			}
			c.body -= k
			b = b[k:]
			if c.body == 0 {
				if err := c.frameDone(); err != nil {
					return err
				}
			}
		default: // a frame header
			if len(c.hdr) == 0 {
				c.hdr = c.hdrBuf[:0]
				if c.handshook && !c.inMessage && c.g.message > 0 {
					c.inMessage = true
					_ = c.Conn.SetReadDeadline(time.Now().Add(c.g.message))
				}
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
			c.command = command
			// The library reads on while MORE is set, after a command
			// frame too, and holds every frame: all count.
			c.more = flags&1 != 0
			c.frames++
			c.msgBytes += size
			if c.frames > c.g.maxFrames {
				c.g.st.oversize.Add(1)
				return fmt.Errorf("%w: a message of more than %d frames", errGuard, c.g.maxFrames)
			}
			if size > uint64(c.g.maxMessage) || c.msgBytes > uint64(c.g.maxMessage) {
				c.g.st.oversize.Add(1)
				return fmt.Errorf("%w: a frame of %d bytes makes a message over the %d-byte limit", errGuard, size, c.g.maxMessage)
			}
			c.capturing = c.checkTopics && c.handshook && !command && c.frames == 1
			if c.capturing {
				if size > maxTopicBytes {
					c.g.st.refusedTopic.Add(1)
					return fmt.Errorf("%w: a topic of %d bytes, over %d", errGuard, size, maxTopicBytes)
				}
				c.topic = c.topic[:0]
			}
			c.body = size
			if size == 0 {
				if err := c.frameDone(); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (c *guardConn) frameDone() error {
	if c.capturing {
		c.capturing = false
		if err := c.checkTopic(); err != nil {
			return err
		}
	}
	if !c.more {
		c.frames, c.msgBytes = 0, 0
		if c.inMessage {
			c.inMessage = false
			_ = c.Conn.SetReadDeadline(time.Time{})
		}
	}
	if !c.handshook && c.command { // the peer's READY: the handshake is over
		c.handshook = true
		if c.g.handshake > 0 {
			_ = c.Conn.SetReadDeadline(time.Time{})
		}
	}
	return nil
}

// checkTopic asks the policy whether the connection may publish the topic
// just read, unless it is the one last allowed under the same policy
// generation.
func (c *guardConn) checkTopic() error {
	gen := c.g.gen.Load()
	if c.hasAllowed && c.allowedGen == gen && bytes.Equal(c.topic, c.allowed) {
		return nil
	}
	if err := c.g.policy.AcceptTopic(c.g.endpoint, c.remote, c.topic); err != nil {
		c.g.st.refusedTopic.Add(1)
		return fmt.Errorf("%w: %v", errGuard, err)
	}
	c.allowed = append(c.allowed[:0], c.topic...)
	c.allowedGen, c.hasAllowed = gen, true
	return nil
}

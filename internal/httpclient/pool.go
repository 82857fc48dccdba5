// Package httpclient is the gateway's HTTP/1.1 client for engines: a
// keep-alive connection pool that writes each request and reads its
// response on the calling goroutine (Pool), and the tuned http.Transport
// it falls back to for what it does not handle (NewTransport).
package httpclient

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"sync"
	"syscall"
	"time"
)

// Defaults of Options fields left zero.
const (
	DefaultMaxIdlePerHost = 256
	DefaultIdleTimeout    = 30 * time.Second
	// DefaultMaxResponseHeaderBytes bounds an engine's response head (its
	// status line and headers): 64 KiB, as Envoy's default for upstream
	// headers (60 KiB); an engine's head is a few hundred bytes.
	DefaultMaxResponseHeaderBytes = 64 << 10
)

// ErrResponseHeaderTooLarge reports a response head over
// Options.MaxResponseHeaderBytes.
var ErrResponseHeaderTooLarge = errors.New("engine response header too large")

// noLimit is a connection's read limit outside a response head.
const noLimit = math.MaxInt64

// aLongTimeAgo is a deadline in the past: setting it interrupts a pending
// read or write on a connection.
var aLongTimeAgo = time.Unix(1, 0)

// Options configures a Pool. The zero value is usable.
type Options struct {
	// MaxIdlePerHost bounds the idle connections kept per host; default
	// DefaultMaxIdlePerHost (256).
	MaxIdlePerHost int
	// IdleTimeout is how long an idle connection is kept; default
	// DefaultIdleTimeout (30s).
	IdleTimeout time.Duration
	// MaxResponseHeaderBytes bounds the response heads read for a request
	// (status lines and headers, of the answer and of any interim 1xx
	// responses before it, together), as
	// http.Transport.MaxResponseHeaderBytes does; more fails the request
	// with ErrResponseHeaderTooLarge. Default
	// DefaultMaxResponseHeaderBytes (64 KiB).
	MaxResponseHeaderBytes int64
}

// Pool is an HTTP/1.1 client (an http.RoundTripper) that writes the
// request and reads the response on the calling goroutine, keeping idle
// keep-alive connections per host. Compared with http.Transport, which
// hands each request and response between the caller and two goroutines
// per connection, it saves the goroutine wake-ups that dominate a proxy's
// added latency on loopback (BenchmarkTransportPaired in package httpgw and
// the e2e latency test measure both). It supports what the gateway needs
// (plain http, bodies of known length); other requests (https, unknown
// length) go to a fallback http.Transport (NewTransport). Like
// http.Transport it skips interim 1xx responses and takes a 101 as the
// final answer. It is safe for concurrent use.
type Pool struct {
	dialer   net.Dialer
	maxIdle  int
	idleTime time.Duration
	maxHead  int64
	fallback http.RoundTripper
	now      func() time.Time // time.Now; tests replace it

	mu        sync.Mutex
	idle      map[string][]*poolConn // by host:port, most recently used last
	lastPrune time.Time
}

type poolConn struct {
	c    net.Conn
	raw  syscall.RawConn // c's socket, nil if it has none
	br   *bufio.Reader
	bw   *bufio.Writer
	used time.Time
	// nread counts the bytes read from c, so that a failed exchange tells
	// whether any of the response had arrived.
	nread int64
	// limit is how many more bytes may be read from c: the rest of the
	// head limit while a response head is read, noLimit otherwise.
	limit int64
}

// countReader reads from a connection, counting the bytes into pc.nread
// and keeping within pc.limit.
type countReader struct{ pc *poolConn }

func (r countReader) Read(p []byte) (int, error) {
	pc := r.pc
	if pc.limit <= 0 {
		return 0, ErrResponseHeaderTooLarge
	}
	if int64(len(p)) > pc.limit {
		p = p[:pc.limit]
	}
	n, err := pc.c.Read(p)
	pc.nread += int64(n)
	if pc.limit != noLimit {
		pc.limit -= int64(n)
	}
	return n, err
}

func newPoolConn(c net.Conn) *poolConn {
	pc := &poolConn{c: c, bw: bufio.NewWriterSize(c, 16<<10), limit: noLimit}
	if sc, ok := c.(syscall.Conn); ok {
		pc.raw, _ = sc.SyscallConn()
	}
	pc.br = bufio.NewReaderSize(countReader{pc}, 16<<10)
	return pc
}

// New returns a Pool configured by opts (zero fields take their defaults).
func New(opts Options) *Pool {
	if opts.MaxIdlePerHost <= 0 {
		opts.MaxIdlePerHost = DefaultMaxIdlePerHost
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = DefaultIdleTimeout
	}
	if opts.MaxResponseHeaderBytes <= 0 {
		opts.MaxResponseHeaderBytes = DefaultMaxResponseHeaderBytes
	}
	return &Pool{
		dialer:   net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second},
		maxIdle:  opts.MaxIdlePerHost,
		idleTime: opts.IdleTimeout,
		maxHead:  opts.MaxResponseHeaderBytes,
		fallback: NewTransport(opts.MaxResponseHeaderBytes),
		now:      time.Now,
		idle:     map[string][]*poolConn{},
	}
}

// IdleTimeout returns how long an idle connection is kept: how often to
// call Prune.
func (p *Pool) IdleTimeout() time.Duration { return p.idleTime }

// RoundTrip implements http.RoundTripper.
func (p *Pool) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" || (req.Body != nil && req.Body != http.NoBody && req.ContentLength <= 0) {
		return p.fallback.RoundTrip(req)
	}
	host := hostPort(req.URL)
	fresh := false
	for {
		var pc *poolConn
		reused := false
		if !fresh {
			pc, reused = p.get(host)
		}
		if pc == nil {
			c, err := p.dialer.DialContext(req.Context(), "tcp", host)
			if err != nil {
				return nil, err
			}
			pc = newPoolConn(c)
		}
		pc.nread = 0
		resp, err := p.exchange(pc, req, host)
		if err == nil {
			return resp, nil
		}
		pc.c.Close()
		// A reused connection the engine closed while it was idle (it
		// restarted, or timed the connection out) fails at once, before
		// any of the response arrives. The other idle connections to it
		// are likely stale too: drop them and resend the request once on a
		// new connection. Once any response byte has arrived the engine
		// has read the request and may have run it, so it is not resent
		// (the proxy may still retry on another replica).
		if reused && pc.nread == 0 && req.Context().Err() == nil && staleConnError(err) {
			p.CloseIdle(host)
			if req.GetBody != nil {
				body, gerr := req.GetBody()
				if gerr != nil {
					return nil, gerr
				}
				req = req.Clone(req.Context())
				req.Body = body
			}
			fresh = true
			continue
		}
		return nil, err
	}
}

// CloseIdle closes the idle connections to host, a host:port as HostKey
// returns it.
func (p *Pool) CloseIdle(host string) {
	p.mu.Lock()
	list := p.idle[host]
	delete(p.idle, host)
	p.mu.Unlock()
	for _, pc := range list {
		pc.c.Close()
	}
}

// CloseIdleConnections closes every idle connection, the fallback
// transport's too. Connections in use are not affected.
func (p *Pool) CloseIdleConnections() {
	p.mu.Lock()
	all := p.idle
	p.idle = map[string][]*poolConn{}
	p.mu.Unlock()
	for _, list := range all {
		for _, pc := range list {
			pc.c.Close()
		}
	}
	if c, ok := p.fallback.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// Prune closes the idle connections of every host that have been idle for
// IdleTimeout or longer (they would not be used again), so connections to
// engines no longer used, or closed by the peer, do not linger. Call it
// every IdleTimeout; the pool also sweeps now and then as connections are
// returned.
func (p *Pool) Prune() {
	now := p.now()
	var stale []*poolConn
	p.mu.Lock()
	p.lastPrune = now
	for host, list := range p.idle {
		keep := list[:0]
		for _, pc := range list {
			if now.Sub(pc.used) >= p.idleTime {
				stale = append(stale, pc)
			} else {
				keep = append(keep, pc)
			}
		}
		clear(list[len(keep):])
		if len(keep) == 0 {
			delete(p.idle, host)
		} else {
			p.idle[host] = keep
		}
	}
	p.mu.Unlock()
	for _, pc := range stale {
		pc.c.Close()
	}
}

// IdleCounts returns how many idle connections the pool holds per host.
func (p *Pool) IdleCounts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.idle))
	for h, l := range p.idle {
		if len(l) > 0 {
			out[h] = len(l)
		}
	}
	return out
}

// HostKey returns the host:port key (CloseIdle's) of an engine base URL,
// "" if it is not plain http.
func HostKey(base string) string {
	u, err := url.Parse(base)
	if err != nil || u.Scheme != "http" {
		return ""
	}
	return hostPort(u)
}

// hostPort returns the host:port key of a plain http URL: its host, with
// port 80 when it names none.
func hostPort(u *url.URL) string {
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), "80")
	}
	return u.Host
}

// staleConnError reports errors of a keep-alive connection closed by the
// peer before it read the request.
func staleConnError(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// exchange writes req on pc, a connection to host, and reads the response
// head. Canceling req's context interrupts either step, and the body's
// reads, by expiring the connection's deadline.
func (p *Pool) exchange(pc *poolConn, req *http.Request, host string) (*http.Response, error) {
	ctx := req.Context()
	stop := context.AfterFunc(ctx, func() { _ = pc.c.SetDeadline(aLongTimeAgo) })
	if err := writeRequest(pc.bw, req); err != nil {
		stop()
		return nil, err
	}
	if err := pc.bw.Flush(); err != nil {
		stop()
		return nil, err
	}
	resp, err := p.readAnswer(pc, req)
	if err != nil {
		stop()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	// After a 101 the connection speaks another protocol.
	keep := !resp.Close && resp.StatusCode != http.StatusSwitchingProtocols
	resp.Body = &poolBody{rc: resp.Body, pool: p, pc: pc, stop: stop, keep: keep, host: host}
	return resp, nil
}

// readAnswer reads the response to req from pc, skipping interim 1xx
// responses (but not a 101, which is final), as http.Transport does: the
// heads read, interim ones included, total at most p.maxHead bytes.
func (p *Pool) readAnswer(pc *poolConn, req *http.Request) (*http.Response, error) {
	pc.limit = p.maxHead
	defer func() { pc.limit = noLimit }()
	for {
		resp, err := readResponse(pc.br, req)
		if err != nil {
			if pc.limit <= 0 {
				return nil, fmt.Errorf("%w: over %d bytes", ErrResponseHeaderTooLarge, p.maxHead)
			}
			return nil, err
		}
		if resp.StatusCode < 100 || resp.StatusCode > 199 || resp.StatusCode == http.StatusSwitchingProtocols {
			return resp, nil
		}
	}
}

// poolBody returns its connection to the pool when it is closed after
// being read to its end, and closes the connection otherwise. (It waits
// for Close, which every caller makes, so that a proxy can pass the last
// bytes on before that bookkeeping.)
type poolBody struct {
	rc   io.ReadCloser
	pool *Pool
	pc   *poolConn
	stop func() bool
	keep bool
	host string
	done bool
	eof  bool
}

func (b *poolBody) Read(p []byte) (int, error) {
	if b.done || b.eof {
		return 0, io.EOF
	}
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *poolBody) Close() error {
	b.finish()
	return nil
}

func (b *poolBody) finish() {
	if b.done {
		return
	}
	b.done = true
	canceled := !b.stop()
	if b.eof && b.keep && !canceled && b.pc.br.Buffered() == 0 {
		b.pool.put(b.host, b.pc)
		return
	}
	b.pc.c.Close()
}

// get returns an idle connection to host that can carry a request, and
// true; nil and false if there is none. A connection with bytes to read
// while idle (an answer nobody asked for, such as the 408 some servers
// send before closing an idle connection, or the peer's close) is closed
// instead: its next bytes would be taken for the next request's answer
// (http.Transport likewise closes an idle connection that speaks).
func (p *Pool) get(host string) (*poolConn, bool) {
	for {
		pc := p.pop(host)
		if pc == nil {
			return nil, false
		}
		if pc.raw == nil || !unread(pc.raw) {
			return pc, true
		}
		pc.c.Close()
	}
}

// pop takes the most recently used idle connection to host that has not
// been idle for idleTime, closing those that have; nil if none.
func (p *Pool) pop(host string) *poolConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	list := p.idle[host]
	for len(list) > 0 {
		pc := list[len(list)-1]
		list = list[:len(list)-1]
		if p.now().Sub(pc.used) < p.idleTime {
			p.idle[host] = list
			return pc
		}
		pc.c.Close()
	}
	p.idle[host] = list
	return nil
}

func (p *Pool) put(host string, pc *poolConn) {
	pc.used = p.now()
	p.mu.Lock()
	if len(p.idle[host]) >= p.maxIdle {
		p.mu.Unlock()
		pc.c.Close()
		return
	}
	p.idle[host] = append(p.idle[host], pc)
	due := pc.used.Sub(p.lastPrune) >= p.idleTime
	p.mu.Unlock()
	if due {
		// Sweep every host now and then, so that hosts no longer used do
		// not keep their idle connections even without Run.
		p.Prune()
	}
}

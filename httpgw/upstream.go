package httpgw

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"syscall"
	"time"
)

// connPool is the default engine transport: an HTTP/1.1 client that
// writes the request and reads the response on the calling goroutine,
// keeping idle keep-alive connections per host. Compared with
// http.Transport, which hands each request and response between the
// caller and two goroutines per connection, it saves the goroutine
// wake-ups that dominate a proxy's added latency on loopback. It supports
// what the gateway needs (plain http, bodies of known length); other
// requests (https, unknown length) go to the fallback transport. It is safe
// for concurrent use.
type connPool struct {
	dialer   net.Dialer
	maxIdle  int
	idleTime time.Duration
	fallback http.RoundTripper
	now      func() time.Time // time.Now; tests replace it

	mu        sync.Mutex
	idle      map[string][]*poolConn // by host:port, most recently used last
	lastPrune time.Time
}

type poolConn struct {
	c    net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	used time.Time
	// nread counts the bytes read from c, so that a failed exchange tells
	// whether any of the response had arrived.
	nread int64
}

// countReader counts the bytes read from a connection into pc.nread.
type countReader struct{ pc *poolConn }

func (r countReader) Read(p []byte) (int, error) {
	n, err := r.pc.c.Read(p)
	r.pc.nread += int64(n)
	return n, err
}

func newPoolConn(c net.Conn) *poolConn {
	pc := &poolConn{c: c, bw: bufio.NewWriterSize(c, 16<<10)}
	pc.br = bufio.NewReaderSize(countReader{pc}, 16<<10)
	return pc
}

func newConnPool() *connPool {
	return &connPool{
		dialer:   net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second},
		maxIdle:  256,
		idleTime: 30 * time.Second,
		fallback: newTransport(),
		now:      time.Now,
		idle:     map[string][]*poolConn{},
	}
}

// RoundTrip implements http.RoundTripper.
func (p *connPool) RoundTrip(req *http.Request) (*http.Response, error) {
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
			p.closeIdle(host)
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

// closeIdle closes the idle connections to host.
func (p *connPool) closeIdle(host string) {
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
func (p *connPool) CloseIdleConnections() {
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

// prune closes the idle connections of every host that have been idle for
// idleTime or longer (get would not use them), so connections to engines
// no longer used, or closed by the peer, do not linger.
func (p *connPool) prune() {
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

// baseHost returns the host:port key of an engine base URL, "" if it is
// not plain http.
func baseHost(base string) string {
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
func (p *connPool) exchange(pc *poolConn, req *http.Request, host string) (*http.Response, error) {
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
	resp, err := readResponse(pc.br, req)
	if err != nil {
		stop()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	resp.Body = &poolBody{rc: resp.Body, pool: p, pc: pc, stop: stop, keep: !resp.Close, host: host}
	return resp, nil
}

// poolBody returns its connection to the pool when it is closed after
// being read to its end, and closes the connection otherwise. (It waits
// for Close, which every caller makes, so that a proxy can pass the last
// bytes on before that bookkeeping.)
type poolBody struct {
	rc   io.ReadCloser
	pool *connPool
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

func (p *connPool) get(host string) (*poolConn, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	list := p.idle[host]
	for len(list) > 0 {
		pc := list[len(list)-1]
		list = list[:len(list)-1]
		if p.now().Sub(pc.used) < p.idleTime {
			p.idle[host] = list
			return pc, true
		}
		pc.c.Close()
	}
	p.idle[host] = list
	return nil, false
}

func (p *connPool) put(host string, pc *poolConn) {
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
		p.prune()
	}
}

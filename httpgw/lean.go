package httpgw

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of LeanOptions.
const (
	// DefaultLeanReadHeaderTimeout bounds the reading of a request's head.
	DefaultLeanReadHeaderTimeout = 10 * time.Second
	// DefaultLeanIdleTimeout bounds the wait for the next request on a
	// kept-alive connection.
	DefaultLeanIdleTimeout = 2 * time.Minute
	// DefaultLeanMaxHeaderBytes bounds a request's head (request line and
	// header fields); a larger one gets 431.
	DefaultLeanMaxHeaderBytes = 1 << 20
	// DefaultLeanDisconnectCheckDelay is how long a handler runs before the
	// lean server starts watching its connection for the client going away.
	DefaultLeanDisconnectCheckDelay = 5 * time.Millisecond
)

// maxLeanDrain is how much of a request body the handler left unread the
// lean server reads and discards to keep the connection; a longer rest
// closes it.
const maxLeanDrain = 256 << 10

// LeanOptions configures a LeanServer. The zero value uses the defaults.
type LeanOptions struct {
	// ReadHeaderTimeout bounds the reading of a request's head, from its
	// first byte (slowloris). Zero means DefaultLeanReadHeaderTimeout.
	ReadHeaderTimeout time.Duration
	// IdleTimeout bounds the wait for the next request's first byte on a
	// kept-alive connection. The deadline is moved only when less than
	// three quarters of IdleTimeout remain (moving it re-arms a runtime
	// timer), so an idle connection is closed after between 3/4 and all of
	// IdleTimeout. Zero means DefaultLeanIdleTimeout.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's head; a larger one is answered
	// with 431 and the connection closed. Zero means
	// DefaultLeanMaxHeaderBytes.
	MaxHeaderBytes int
	// DisconnectCheckDelay is how long a handler may run before the server
	// starts reading its connection in the background, so that the
	// request's context is cancelled when the client disconnects. Short
	// requests thus never start that read (each one would cost goroutine
	// wake-ups). One ticker per server, running only while requests come
	// in, checks every DisconnectCheckDelay, so the watch starts between
	// one and two DisconnectCheckDelay after the request was read; a
	// client that disconnects before is noticed then. The watch starts
	// only once the request body has been read to its end (or the request
	// has none), as with net/http, and stops when a pipelined request
	// arrives. Zero means DefaultLeanDisconnectCheckDelay; negative
	// starts the watch as soon as the body is read.
	DisconnectCheckDelay time.Duration
	// Logger receives handler panics and accept errors. Nil means
	// slog.Default().
	Logger *slog.Logger
}

// LeanServer is a minimal HTTP/1.1 server for an http.Handler, without
// net/http's per-request machinery: one goroutine per connection reads a
// request with http.ReadRequest, runs the handler on that goroutine and
// writes the response itself (Content-Length when the handler sets it or
// the whole body fits in a small buffer, else chunked; Flush for
// server-sent events). It supports keep-alive with an idle timeout, a
// read-header timeout, a head size limit (431), 100-continue (sent when the
// handler first reads the body), Connection: close and HTTP/1.0 (one
// request per connection). It does not support TLS, HTTP/2, upgrades,
// trailers, Content-Type sniffing or a write timeout. A handler panic is
// logged and closes its connection (http.ErrAbortHandler is not logged).
//
// A LeanServer is safe for concurrent use; its zero value is not usable,
// use NewLeanServer.
type LeanServer struct {
	h    http.Handler
	opts LeanOptions
	log  *slog.Logger

	mu       sync.Mutex
	lns      map[net.Listener]struct{}
	conns    map[*leanConn]struct{}
	shutdown atomic.Bool

	// The disconnect-check ticker (see LeanOptions.DisconnectCheckDelay).
	epoch     time.Time
	reqs      atomic.Uint64 // requests read so far
	wdRunning atomic.Bool   // the ticker runs or has been woken
	wdOnce    sync.Once     // starts the ticker's goroutine
	wdWake    chan struct{}
	wdQuit    chan struct{}
	quitOnce  sync.Once
}

// NewLeanServer returns a lean server for h. It reports negative timeouts
// or header size with an error wrapping ErrInvalidOptions.
func NewLeanServer(h http.Handler, opts LeanOptions) (*LeanServer, error) {
	if h == nil {
		return nil, fmt.Errorf("%w: lean server: handler is nil", ErrInvalidOptions)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"ReadHeaderTimeout", opts.ReadHeaderTimeout}, {"IdleTimeout", opts.IdleTimeout}} {
		if d.v < 0 {
			return nil, fmt.Errorf("%w: lean server: %s %v must not be negative", ErrInvalidOptions, d.name, d.v)
		}
	}
	if opts.MaxHeaderBytes < 0 {
		return nil, fmt.Errorf("%w: lean server: MaxHeaderBytes %d must not be negative", ErrInvalidOptions, opts.MaxHeaderBytes)
	}
	if opts.ReadHeaderTimeout == 0 {
		opts.ReadHeaderTimeout = DefaultLeanReadHeaderTimeout
	}
	if opts.IdleTimeout == 0 {
		opts.IdleTimeout = DefaultLeanIdleTimeout
	}
	if opts.MaxHeaderBytes == 0 {
		opts.MaxHeaderBytes = DefaultLeanMaxHeaderBytes
	}
	if opts.DisconnectCheckDelay == 0 {
		opts.DisconnectCheckDelay = DefaultLeanDisconnectCheckDelay
	}
	lg := opts.Logger
	if lg == nil {
		lg = slog.Default()
	}
	return &LeanServer{h: h, opts: opts, log: lg, lns: map[net.Listener]struct{}{}, conns: map[*leanConn]struct{}{},
		epoch: time.Now(), wdWake: make(chan struct{}, 1), wdQuit: make(chan struct{})}, nil
}

// Serve accepts connections on ln and serves each on its own goroutine. It
// returns http.ErrServerClosed after Shutdown or Close, else the error
// that stopped accepting.
func (s *LeanServer) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.shutdown.Load() {
		s.mu.Unlock()
		return http.ErrServerClosed
	}
	s.lns[ln] = struct{}{}
	s.mu.Unlock()
	if s.opts.DisconnectCheckDelay > 0 {
		s.wdOnce.Do(func() { go s.watchdog() })
	}
	defer func() {
		s.mu.Lock()
		delete(s.lns, ln)
		s.mu.Unlock()
	}()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.shutdown.Load() {
				return http.ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && !errors.Is(err, net.ErrClosed) {
				// Out of file descriptors and the like: wait and retry.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn("lean server: accept failed; retrying", "err", err, "in", backoff)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("gateway: lean server: accept: %w", err)
		}
		backoff = 0
		c := s.newConn(nc)
		s.mu.Lock()
		if s.shutdown.Load() {
			s.mu.Unlock()
			nc.Close()
			return http.ErrServerClosed
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		go c.serve()
	}
}

// Shutdown stops accepting connections, closes idle ones and those that
// finish their request in flight, and waits until none is left or ctx is
// done (then it returns ctx's error and leaves the rest open; call Close).
func (s *LeanServer) Shutdown(ctx context.Context) error {
	s.closeListeners()
	defer s.stopWatchdog()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if s.closeIdle() == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// Close stops accepting connections and closes all of them at once,
// cancelling the requests in flight.
func (s *LeanServer) Close() error {
	s.closeListeners()
	s.stopWatchdog()
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.mu.Lock()
		if !c.handlerDone && c.cancel != nil {
			c.cancel()
		}
		c.mu.Unlock()
		c.nc.Close()
	}
	return nil
}

func (s *LeanServer) closeListeners() {
	s.shutdown.Store(true)
	s.mu.Lock()
	defer s.mu.Unlock()
	for ln := range s.lns {
		ln.Close()
	}
}

// closeIdle closes the connections waiting for a request and returns how
// many connections remain.
func (s *LeanServer) closeIdle() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if c.idle.Load() {
			c.nc.Close()
		}
	}
	return len(s.conns)
}

func (s *LeanServer) stopWatchdog() { s.quitOnce.Do(func() { close(s.wdQuit) }) }

// leanWatchdogIdleTicks is how many checks without requests stop the
// disconnect-check ticker until the next request.
const leanWatchdogIdleTicks = 50

// watchdog starts the disconnect watch of requests that have run for
// DisconnectCheckDelay. It ticks while requests come in (one goroutine
// wake-up per DisconnectCheckDelay, however many requests) and sleeps
// after leanWatchdogIdleTicks ticks without any, until a request wakes it.
func (s *LeanServer) watchdog() {
	d := s.opts.DisconnectCheckDelay
	var due []*leanConn
	for {
		select {
		case <-s.wdWake:
		case <-s.wdQuit:
			return
		}
		t := time.NewTicker(d)
		last := s.reqs.Load()
		for idle := 0; ; {
			select {
			case <-t.C:
			case <-s.wdQuit:
				t.Stop()
				return
			}
			var busy bool
			due, busy = s.dueConns(d, due[:0])
			for i, c := range due {
				c.delayPassed()
				due[i] = nil
			}
			n := s.reqs.Load()
			if busy || n != last {
				idle = 0
			} else if idle++; idle >= leanWatchdogIdleTicks {
				s.wdRunning.Store(false)
				// A request read since the last check saw the ticker
				// running and did not wake it: go on ticking.
				if s.reqs.Load() == n || !s.wdRunning.CompareAndSwap(false, true) {
					break
				}
				idle = 0
			}
			last = n
		}
		t.Stop()
	}
}

// dueConns appends the connections whose request has run for at least d
// and reports whether any request is in flight.
func (s *LeanServer) dueConns(d time.Duration, due []*leanConn) ([]*leanConn, bool) {
	now := int64(time.Since(s.epoch))
	busy := false
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if since := c.busySince.Load(); since != 0 {
			busy = true
			if now-since >= int64(d) {
				due = append(due, c)
			}
		}
	}
	return due, busy
}

// requestStarted notes a request for the disconnect check.
func (s *LeanServer) requestStarted(c *leanConn) {
	if s.opts.DisconnectCheckDelay < 0 {
		c.delayPassed()
		return
	}
	c.busySince.Store(int64(time.Since(s.epoch)) + 1)
	s.reqs.Add(1)
	if !s.wdRunning.Load() && s.wdRunning.CompareAndSwap(false, true) {
		select {
		case s.wdWake <- struct{}{}:
		default:
		}
	}
}

// aLongTimeAgo is a deadline in the past: it interrupts a pending read
// (or write) on a connection.
var aLongTimeAgo = time.Unix(1, 0)

// leanConn is one client connection of a LeanServer.
type leanConn struct {
	s      *LeanServer
	nc     net.Conn
	remote string
	lr     leanReader
	br     *bufio.Reader
	bw     *bufio.Writer
	idle   atomic.Bool // waiting for a request's first byte
	rdl    time.Time   // the read deadline set on nc (zero: none)
	// busySince is when the request being served was read (time since
	// the server's epoch, plus 1), 0 between requests.
	busySince atomic.Int64
	pend      []byte // response body held back to learn its length
	// lingerClose asks close to end the connection gently: bytes sent by
	// the client may be left unread.
	lingerClose bool

	// Disconnect watch of the request being served, guarded by mu.
	mu          sync.Mutex
	cancel      context.CancelFunc
	handlerDone bool // the handler returned
	bodyDone    bool // the body was read to its end (or there is none)
	pipelined   bool // the next request's bytes are already buffered
	watchWanted bool // DisconnectCheckDelay has passed
	watching    bool // a background read runs
	watchDone   chan struct{}
	stopping    bool // the background read is being interrupted
	gone        bool // the background read saw the client go away
}

func (s *LeanServer) newConn(nc net.Conn) *leanConn {
	c := &leanConn{s: s, nc: nc, remote: nc.RemoteAddr().String()}
	c.lr.c = nc
	c.br = bufio.NewReaderSize(&c.lr, 4096)
	c.bw = bufio.NewWriterSize(nc, 4096)
	return c
}

// leanReader reads the connection for the bufio.Reader, counting down a
// limit while a request head is read and handing on a byte the disconnect
// watch read first.
type leanReader struct {
	c       net.Conn
	limit   int64 // bytes left; <= 0 reads nothing
	hasByte bool
	b       byte
}

func (r *leanReader) Read(p []byte) (int, error) {
	if r.limit <= 0 {
		return 0, errHeadTooLarge
	}
	if int64(len(p)) > r.limit {
		p = p[:r.limit]
	}
	if r.hasByte && len(p) > 0 {
		r.hasByte = false
		p[0] = r.b
		r.limit--
		return 1, nil
	}
	n, err := r.c.Read(p)
	r.limit -= int64(n)
	return n, err
}

var errHeadTooLarge = errors.New("gateway: request head too large")

const noLimit = 1<<63 - 1

// leanLinger bounds how long a connection closed with request bytes left
// unread keeps reading and discarding them.
const leanLinger = 500 * time.Millisecond

func (c *leanConn) close() {
	if c.lingerClose {
		c.closeWriteAndWait()
	}
	c.nc.Close()
	c.s.mu.Lock()
	delete(c.s.conns, c)
	c.s.mu.Unlock()
}

// serve reads and answers the connection's requests until it closes.
func (c *leanConn) serve() {
	defer c.close()
	o := &c.s.opts
	for first := true; ; first = false {
		// Read deadlines are moved only when needed: each move re-arms a
		// runtime timer, which can wake the network poller.
		c.lr.limit = int64(o.MaxHeaderBytes) + 4096
		if c.br.Buffered() == 0 {
			c.idle.Store(true)
			if c.s.shutdown.Load() {
				return
			}
			if now := time.Now(); first {
				// A new connection owes its first request at once, as
				// with net/http: it gets no idle time.
				c.setReadDeadline(now.Add(min(o.ReadHeaderTimeout, o.IdleTimeout)))
			} else if c.rdl.IsZero() || c.rdl.Sub(now) < o.IdleTimeout-o.IdleTimeout/4 {
				c.setReadDeadline(now.Add(o.IdleTimeout))
			}
			if _, err := c.br.Peek(1); err != nil {
				return
			}
			c.idle.Store(false)
		}
		headDeadline := !c.headBuffered()
		if headDeadline {
			c.setReadDeadline(time.Now().Add(o.ReadHeaderTimeout))
		}
		req, err := http.ReadRequest(c.br)
		if err != nil {
			c.badRequest(err)
			return
		}
		c.lr.limit = noLimit
		// A body still to come from the client may take its time, as with
		// net/http; a body already buffered is not read from the
		// connection.
		if headDeadline || req.ContentLength < 0 || req.ContentLength > int64(c.br.Buffered()) {
			c.setReadDeadline(time.Time{})
		}
		if !c.serveRequest(req) {
			return
		}
	}
}

// badRequest answers a request that could not be read, unless the
// connection failed.
func (c *leanConn) badRequest(err error) {
	var ne net.Error
	switch {
	case errors.Is(err, errHeadTooLarge):
		c.writeSimple("431 Request Header Fields Too Large")
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed), errors.As(err, &ne):
		// The client went away or timed out: nobody to answer.
	default:
		c.writeSimple("400 Bad Request")
	}
}

// writeSimple writes a plain-text answer and ends the connection.
func (c *leanConn) writeSimple(status string) {
	_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
	msg := status[4:]
	_, _ = c.bw.WriteString("HTTP/1.1 " + status + "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(msg)) + "\r\n\r\n" + msg)
	if c.bw.Flush() != nil {
		return
	}
	c.lingerClose = true
}

// closeWriteAndWait ends a connection that may have unread input gently:
// a close with unread input would reset the connection and could destroy
// the answer before the client reads it. It shuts down the writing side,
// so the client sees the answer's end, then reads and discards for up to
// leanLinger, until the client closes too.
func (c *leanConn) closeWriteAndWait() {
	cw, ok := c.nc.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		return
	}
	_ = c.nc.SetReadDeadline(time.Now().Add(leanLinger))
	buf := make([]byte, 32<<10)
	for {
		if _, err := c.nc.Read(buf); err != nil {
			return
		}
	}
}

// validHost reports whether h has only the bytes a Host field value
// (RFC 3986 host and port, IPv6 literal included) may have.
func validHost(h string) bool {
	for i := 0; i < len(h); i++ {
		b := h[i]
		if 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' {
			continue
		}
		if !strings.ContainsRune("-._~!$&'()*+,;=:[]%@", rune(b)) {
			return false
		}
	}
	return true
}

// serveRequest runs the handler for req and reports whether the connection
// can serve another request.
func (c *leanConn) serveRequest(req *http.Request) (keep bool) {
	if req.ProtoMajor != 1 {
		c.writeSimple("505 HTTP Version Not Supported")
		return false
	}
	if req.ProtoMinor >= 1 && len(req.Header["Host"]) == 0 && req.Host == "" || !validHost(req.Host) {
		c.writeSimple("400 Bad Request")
		return false
	}
	expect100 := false
	if e := req.Header.Get("Expect"); e != "" {
		if !strings.EqualFold(e, "100-continue") || req.ProtoMinor == 0 {
			c.writeSimple("417 Expectation Failed")
			return false
		}
		expect100 = true
	}
	req.RemoteAddr = c.remote
	ctx, cancel := context.WithCancel(context.Background())
	req = req.WithContext(ctx)
	w := &leanResponse{c: c, req: req, header: make(http.Header, 8), contentLength: -1,
		closeAfter: req.Close || req.ProtoMinor == 0 || c.s.shutdown.Load()}

	var body *leanBody
	c.mu.Lock()
	c.cancel, c.handlerDone, c.watchWanted, c.watching, c.stopping, c.gone = cancel, false, false, false, false, false
	if req.Body == nil || req.Body == http.NoBody {
		req.Body = http.NoBody
		c.bodyDone, c.pipelined = true, c.br.Buffered() > 0
	} else {
		c.bodyDone, c.pipelined = false, false
		body = &leanBody{c: c, w: w, rc: req.Body, expect100: expect100}
		req.Body = body
		w.body = body
	}
	c.mu.Unlock()
	c.s.requestStarted(c)

	panicked := c.runHandler(w, req)
	if !panicked {
		w.finish()
	}
	unread := body != nil && body.handlerReturned()

	c.busySince.Store(0)
	c.mu.Lock()
	c.handlerDone = true
	watching, done := c.watching, c.watchDone
	if watching {
		c.stopping = true
	}
	c.mu.Unlock()
	if watching {
		_ = c.nc.SetReadDeadline(aLongTimeAgo)
		<-done
		c.rdl = aLongTimeAgo
	}
	cancel()
	c.mu.Lock()
	gone := c.gone
	c.mu.Unlock()
	if gone || w.err != nil {
		return false
	}
	if panicked || w.closeAfter {
		c.lingerClose = unread
		return false
	}
	if unread {
		if body.expect100 && !body.sentContinue {
			// The client may not send the body at all. (writeHead has
			// already chosen to close in that case; this is a guard.)
			c.lingerClose = true
			return false
		}
		c.setReadDeadline(time.Now().Add(c.s.opts.ReadHeaderTimeout))
		n, err := io.CopyN(io.Discard, body.rc, maxLeanDrain+1)
		if n > maxLeanDrain || (err != nil && err != io.EOF) {
			c.lingerClose = true
			return false
		}
	}
	return true
}

// runHandler serves req and reports whether the handler panicked.
func (c *leanConn) runHandler(w *leanResponse, req *http.Request) (panicked bool) {
	defer func() {
		if v := recover(); v != nil {
			panicked = true
			if err, ok := v.(error); !ok || !errors.Is(err, http.ErrAbortHandler) {
				c.s.log.Error("lean server: handler panicked; closing the connection",
					"remote", c.remote, "method", req.Method, "path", req.URL.Path, "panic", v, "stack", string(debug.Stack()))
			}
			if w.wroteHead {
				_ = c.bw.Flush() // pass on what was written; the close ends it short
			}
		}
	}()
	c.s.h.ServeHTTP(w, req)
	return false
}

// delayPassed starts the disconnect watch if the handler still runs and
// the body has been read.
func (c *leanConn) delayPassed() {
	c.mu.Lock()
	if c.handlerDone {
		c.mu.Unlock()
		return
	}
	c.watchWanted = true
	c.maybeWatchLocked()
	c.mu.Unlock()
}

// maybeWatchLocked starts the background read when it is wanted and
// possible. c.mu is held.
func (c *leanConn) maybeWatchLocked() {
	if !c.watchWanted || !c.bodyDone || c.pipelined || c.watching || c.handlerDone {
		return
	}
	c.watching = true
	c.watchDone = make(chan struct{})
	go c.watch(c.watchDone)
}

// watch reads the connection while the handler runs: a read error other
// than the interruption means the client has gone, and cancels the
// request's context; a byte read (the next pipelined request) is handed to
// the next request's read.
func (c *leanConn) watch(done chan struct{}) {
	defer close(done)
	var b [1]byte
	for {
		n, err := c.nc.Read(b[:])
		c.mu.Lock()
		if n == 1 {
			c.lr.hasByte, c.lr.b = true, b[0]
			c.mu.Unlock()
			return
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			if c.stopping {
				c.mu.Unlock()
				return
			}
			// The idle deadline left in place has passed during a long
			// request: lift it and go on watching.
			c.setReadDeadline(time.Time{})
			c.mu.Unlock()
			continue
		}
		if err != nil {
			c.gone = true
			c.cancel()
		}
		c.mu.Unlock()
		return
	}
}

// setReadDeadline sets the connection's read deadline and notes it.
func (c *leanConn) setReadDeadline(t time.Time) {
	c.rdl = t
	_ = c.nc.SetReadDeadline(t)
}

// headBuffered reports whether the buffer holds a whole request head.
func (c *leanConn) headBuffered() bool {
	b, _ := c.br.Peek(c.br.Buffered())
	return bytes.Contains(b, []byte("\r\n\r\n"))
}

// leanBody is a request body: it sends 100 Continue before the first read
// when the client asked for it, and notes its end for the disconnect watch.
// Close does not read the rest; the server drains or closes after the
// handler. Once the handler has returned, Read fails with
// http.ErrBodyReadAfterClose: the rest of the connection belongs to the
// server (a goroutine the handler left behind must not read the next
// request).
type leanBody struct {
	c  *leanConn
	w  *leanResponse
	rc io.ReadCloser

	// mu is held during a read, as net/http does, so that the server
	// waits for a read in progress when the handler returns.
	mu                      sync.Mutex
	expect100, sentContinue bool
	eof, closed             bool
	returned                bool  // the handler returned
	n                       int64 // bytes read
}

func (b *leanBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.returned {
		return 0, http.ErrBodyReadAfterClose
	}
	if b.eof {
		return 0, io.EOF
	}
	if b.expect100 && !b.sentContinue {
		b.sentContinue = true
		if !b.w.wroteHead {
			_, _ = b.c.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
			_ = b.c.bw.Flush()
		}
	}
	n, err := b.rc.Read(p)
	b.n += int64(n)
	if err == io.EOF {
		b.eof = true
		b.c.mu.Lock()
		b.c.bodyDone = true
		b.c.pipelined = b.c.br.Buffered() > 0
		b.c.maybeWatchLocked()
		b.c.mu.Unlock()
	}
	return n, err
}

func (b *leanBody) Close() error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	return nil
}

// handlerReturned ends the handler's use of the body (waiting for a read
// in progress) and reports whether bytes of it may be left unread.
func (b *leanBody) handlerReturned() (unread bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.returned = true
	return b.unreadLocked()
}

// unreadLocked reports whether bytes of the body may be left unread. b.mu
// is held.
func (b *leanBody) unreadLocked() bool {
	return !b.eof && (b.w.req.ContentLength < 0 || b.n < b.w.req.ContentLength)
}

// keepAfterHead reports whether the connection can be kept after a
// response whose head is being written: not when the client waits for a
// 100 Continue that was not sent (it may never send the body), nor when
// more than maxLeanDrain bytes, or an unknown length, of the body are
// left to read.
func (b *leanBody) keepAfterHead() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.unreadLocked() {
		return true
	}
	if b.expect100 && !b.sentContinue {
		return false
	}
	cl := b.w.req.ContentLength
	return cl >= 0 && cl-b.n <= maxLeanDrain
}

// leanPendMax is how much of a response body without Content-Length is
// held back so that a short answer gets a Content-Length.
const leanPendMax = 2048

// leanResponse is the http.ResponseWriter (and http.Flusher) of a lean
// server's request.
type leanResponse struct {
	c      *leanConn
	req    *http.Request
	body   *leanBody // nil when the request has none
	header http.Header
	// sent is the header as of WriteHeader when the head is held back
	// (changes after WriteHeader have no effect, as with net/http); nil
	// means header.
	sent          http.Header
	status        int
	wroteHead     bool // the status line and header are written
	chunked       bool
	noBody        bool
	contentLength int64 // -1 until known
	written       int64
	closeAfter    bool
	err           error // write failure: the connection is closed after
}

// Header returns the response header map.
func (w *leanResponse) Header() http.Header { return w.header }

// WriteHeader records the status; 1xx statuses are sent at once.
func (w *leanResponse) WriteHeader(code int) {
	if w.wroteHead || w.status != 0 {
		return
	}
	if code < 100 || code > 999 { // a handler bug: net/http panics too; runHandler recovers
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		// An interim response has no body: the final response's framing
		// fields are not its own.
		w.writeStatusLine(code)
		w.writeFields(w.header)
		_, _ = w.c.bw.WriteString("\r\n")
		w.flushConn()
		return
	}
	w.status = code
	if cl := w.header.Get("Content-Length"); cl != "" {
		if v, err := strconv.ParseInt(strings.TrimSpace(cl), 10, 64); err == nil && v >= 0 {
			w.contentLength = v
		}
	}
	if !bodyAllowed(code) || w.req.Method == http.MethodHead {
		w.noBody = true
	}
	if w.contentLength >= 0 || w.noBody {
		w.writeHead()
	} else {
		w.sent = w.header.Clone()
	}
}

func bodyAllowed(status int) bool {
	return !(status >= 100 && status <= 199 || status == http.StatusNoContent || status == http.StatusNotModified)
}

// Write writes body bytes, sending the head first if needed.
func (w *leanResponse) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.noBody {
		if w.req.Method == http.MethodHead && bodyAllowed(w.status) {
			return len(p), nil
		}
		return 0, http.ErrBodyNotAllowed
	}
	if w.err != nil {
		return 0, w.err
	}
	if !w.wroteHead {
		if len(w.c.pend)+len(p) <= leanPendMax {
			w.c.pend = append(w.c.pend, p...)
			return len(p), nil
		}
		w.chunked = w.req.ProtoMinor >= 1
		if !w.chunked {
			w.closeAfter = true
		}
		w.writeHead()
		if w.err != nil {
			return 0, w.err
		}
	}
	if w.contentLength >= 0 && w.written+int64(len(p)) > w.contentLength {
		return 0, http.ErrContentLength
	}
	w.written += int64(len(p))
	var err error
	if w.chunked {
		if len(p) == 0 {
			return 0, nil
		}
		var num [20]byte
		_, _ = w.c.bw.Write(strconv.AppendInt(num[:0], int64(len(p)), 16))
		_, _ = w.c.bw.WriteString("\r\n")
		_, _ = w.c.bw.Write(p)
		_, err = w.c.bw.WriteString("\r\n")
	} else {
		_, err = w.c.bw.Write(p)
	}
	if err != nil {
		w.err = err
		return 0, err
	}
	return len(p), nil
}

// WriteString is Write for a string.
func (w *leanResponse) WriteString(s string) (int, error) { return w.Write([]byte(s)) }

// Flush sends the head and everything written so far to the client. A
// body of unknown length is chunked from then on.
func (w *leanResponse) Flush() { _ = w.FlushError() }

// FlushError is Flush reporting a write failure (http.ResponseController
// uses it).
func (w *leanResponse) FlushError() error {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if !w.wroteHead {
		w.chunked = w.req.ProtoMinor >= 1
		if !w.chunked {
			w.closeAfter = true
		}
		w.writeHead()
	}
	w.flushConn()
	return w.err
}

func (w *leanResponse) flushConn() {
	if err := w.c.bw.Flush(); err != nil && w.err == nil {
		w.err = err
	}
}

// finish completes the response after the handler returned.
func (w *leanResponse) finish() {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if !w.wroteHead {
		// Everything was held back: its length is known.
		w.contentLength = int64(len(w.c.pend))
		w.writeHead()
	}
	if w.chunked && w.err == nil {
		_, _ = w.c.bw.WriteString("0\r\n\r\n")
	}
	if !w.noBody && w.contentLength >= 0 && w.written < w.contentLength {
		w.closeAfter = true // the client waits for bytes that will not come
	}
	w.flushConn()
}

// writeStatusLine writes the status line for code; the usual 200 is a
// constant.
func (w *leanResponse) writeStatusLine(code int) {
	if code == http.StatusOK {
		_, _ = w.c.bw.WriteString("HTTP/1.1 200 OK\r\n")
		return
	}
	text := http.StatusText(code)
	if text == "" {
		text = "status code " + strconv.Itoa(code)
	}
	_, _ = w.c.bw.WriteString("HTTP/1.1 " + strconv.Itoa(code) + " " + text + "\r\n")
}

// writeHead writes the status line and header fields, then any body bytes
// held back.
func (w *leanResponse) writeHead() {
	w.wroteHead = true
	h := w.header
	if w.sent != nil {
		h = w.sent
	}
	if hasCloseToken(h["Connection"]) || w.c.s.shutdown.Load() {
		w.closeAfter = true
	}
	// Decide now, as net/http does, whether the connection outlives this
	// response, so that the head says so when it does not.
	if !w.closeAfter && w.body != nil && !w.body.keepAfterHead() {
		w.closeAfter = true
	}
	bw := w.c.bw
	w.writeStatusLine(w.status)
	w.writeFields(h)
	var num [20]byte
	if w.contentLength >= 0 && !(w.noBody && w.req.Method != http.MethodHead) {
		_, _ = bw.WriteString("Content-Length: ")
		_, _ = bw.Write(strconv.AppendInt(num[:0], w.contentLength, 10))
		_, _ = bw.WriteString("\r\n")
	}
	if w.chunked {
		_, _ = bw.WriteString("Transfer-Encoding: chunked\r\n")
	}
	if w.closeAfter {
		_, _ = bw.WriteString("Connection: close\r\n")
	}
	if _, ok := h["Date"]; !ok {
		_, _ = bw.WriteString("Date: ")
		var date [len(http.TimeFormat) + 8]byte
		_, _ = bw.Write(time.Now().UTC().AppendFormat(date[:0], http.TimeFormat))
		_, _ = bw.WriteString("\r\n")
	}
	_, err := bw.WriteString("\r\n")
	if err != nil {
		w.err = err
		return
	}
	if len(w.c.pend) > 0 {
		p := w.c.pend
		w.c.pend = w.c.pend[:0]
		_, _ = w.Write(p)
	}
}

// hasCloseToken reports whether Connection field values list "close".
func hasCloseToken(vv []string) bool {
	for _, v := range vv {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "close") {
				return true
			}
		}
	}
	return false
}

// writeFields writes the handler's header fields but the framing ones,
// which are the server's own.
func (w *leanResponse) writeFields(h http.Header) {
	bw := w.c.bw
	for k, vv := range h {
		switch k {
		case "Content-Length", "Transfer-Encoding", "Connection":
			continue
		}
		for _, v := range vv {
			_, _ = bw.WriteString(k)
			_, _ = bw.WriteString(": ")
			if strings.ContainsAny(v, "\r\n") {
				v = strings.NewReplacer("\r", " ", "\n", " ").Replace(v)
			}
			_, _ = bw.WriteString(strings.TrimSpace(v))
			_, _ = bw.WriteString("\r\n")
		}
	}
}

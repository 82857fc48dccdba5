package httpserver

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"reflect"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// aLongTimeAgo is a deadline in the past: it interrupts a pending read
// (or write) on a connection.
var aLongTimeAgo = time.Unix(1, 0)

// noLimit is connReader.limit while a body is read.
const noLimit = 1<<63 - 1

// maxTeeKeep is the largest head capture a connection keeps for the next
// request; a larger one is dropped after use.
const maxTeeKeep = 64 << 10

// conn is one client connection of a Server.
type conn struct {
	s      *Server
	nc     net.Conn
	remote string
	// ctx is the parent of the requests' contexts: it holds the local
	// address (http.LocalAddrContextKey), as net/http's does.
	ctx context.Context
	r   connReader
	br  *bufio.Reader
	bw  *bufio.Writer
	// idle: waiting for a request's first byte, or a next request's
	// first four (net/http's StateIdle); Shutdown closes the connection.
	idle atomic.Bool
	rdl  time.Time // the read deadline set on nc (zero: none)
	// busySince is when the request being served was read (time since
	// the server's epoch, plus 1), 0 between requests.
	busySince atomic.Int64
	pend      []byte // response body held back to learn its length
	// tee captures the bytes of a request head that was not buffered
	// whole when its reading began (see readRequest).
	tee []byte
	// lastPost: the previous request was a POST, after which up to four
	// stray CR or LF bytes are skipped, as net/http's server does.
	lastPost bool
	// ambiguous: the request being served has ambiguous framing
	// (hostFields.ambiguousFraming); the connection closes after it.
	ambiguous bool
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

func (s *Server) newConn(nc net.Conn) *conn {
	c := &conn{s: s, nc: nc, ctx: context.WithValue(context.Background(), http.LocalAddrContextKey, nc.LocalAddr())}
	if ra := nc.RemoteAddr(); ra != nil {
		c.remote = ra.String()
	}
	c.r.c = nc
	c.br = bufio.NewReaderSize(&c.r, 4096)
	c.bw = bufio.NewWriterSize(nc, 4096)
	return c
}

// connReader reads the connection for the bufio.Reader, counting down a
// limit while a request head is read, handing on a byte the disconnect
// watch read first, and capturing what it reads into tee when set.
type connReader struct {
	c       net.Conn
	limit   int64 // bytes left; <= 0 reads nothing
	hasByte bool
	b       byte
	tee     *[]byte
}

func (r *connReader) Read(p []byte) (int, error) {
	if r.limit <= 0 {
		return 0, errHeadTooLarge
	}
	if int64(len(p)) > r.limit {
		p = p[:r.limit]
	}
	var n int
	var err error
	if r.hasByte && len(p) > 0 {
		r.hasByte = false
		p[0] = r.b
		n = 1
	} else {
		n, err = r.c.Read(p)
	}
	r.limit -= int64(n)
	if r.tee != nil {
		*r.tee = append(*r.tee, p[:n]...)
	}
	return n, err
}

var errHeadTooLarge = errors.New("httpserver: request head too large")

// linger bounds how long a connection closed with request bytes left
// unread keeps reading and discarding them.
const linger = 500 * time.Millisecond

func (c *conn) close() {
	if c.lingerClose {
		c.closeWriteAndWait()
	}
	c.nc.Close()
	c.s.mu.Lock()
	delete(c.s.conns, c)
	c.s.mu.Unlock()
}

// serve reads and answers the connection's requests until it closes.
func (c *conn) serve() {
	defer c.close()
	for first := true; ; first = false {
		req, ok := c.readRequest(first)
		if !ok || !c.serveRequest(req) {
			return
		}
	}
}

// readRequest waits for the next request, reads and checks its head and
// sets the deadline for its body. On failure it answers as net/http's
// server does (nothing when the client went away or timed out) and
// reports false.
func (c *conn) readRequest(first bool) (*http.Request, bool) {
	o := &c.s.opts
	c.r.limit = int64(o.MaxHeaderBytes) + 4096
	// Like net/http, wait for four bytes before a request after the
	// first: a connection that ends sooner is closed without an answer.
	need := 4
	if first {
		need = 1
	}
	if c.br.Buffered() < need {
		// Read deadlines are moved only when needed: each move re-arms a
		// runtime timer, which can wake the network poller.
		c.idle.Store(true)
		if c.s.shutdown.Load() {
			return nil, false
		}
		if now := time.Now(); first {
			// A new connection owes its first request at once, as
			// with net/http: it gets no idle time.
			c.setReadDeadline(now.Add(min(o.ReadHeaderTimeout, o.IdleTimeout)))
		} else if left := c.rdl.Sub(now); c.rdl.IsZero() || left < o.IdleTimeout-o.IdleTimeout/4 || left > o.IdleTimeout {
			// A deadline further than IdleTimeout (a body's, under
			// a longer ReadTimeout) is brought in too.
			c.setReadDeadline(now.Add(o.IdleTimeout))
		}
		if _, err := c.br.Peek(need); err != nil {
			return nil, false
		}
		c.idle.Store(false)
	}
	if c.lastPost {
		peek, _ := c.br.Peek(4)
		n := 0
		for n < len(peek) && (peek[n] == '\r' || peek[n] == '\n') {
			n++
		}
		_, _ = c.br.Discard(n)
	}

	// The Host field is read from the head's bytes (http.ReadRequest
	// drops it): from the buffer when the whole head is there, else from
	// a capture of the bytes read.
	var t0 time.Time
	var host hostFields
	buffered, _ := c.br.Peek(c.br.Buffered())
	end := headEnd(buffered)
	if end >= 0 {
		host = scanHost(buffered[:end])
	} else {
		t0 = time.Now()
		c.setReadDeadline(t0.Add(o.ReadHeaderTimeout))
		c.tee = append(c.tee[:0], buffered...)
		c.r.tee = &c.tee
	}
	req, err := http.ReadRequest(c.br)
	c.r.tee = nil
	if err != nil {
		c.readError(err)
		return nil, false
	}
	if end < 0 {
		host = scanHost(c.tee)
		if cap(c.tee) > maxTeeKeep {
			c.tee = nil
		}
	}
	c.r.limit = noLimit
	c.lastPost = req.Method == http.MethodPost
	if code, reason := checkRequest(req, host); code != 0 {
		c.writeError(code, reason)
		return nil, false
	}
	c.ambiguous = host.ambiguousFraming(req)
	// A body still to come from the client must arrive within
	// ReadTimeout of the head's start; a body already buffered is not
	// read from the connection.
	if req.ContentLength < 0 || req.ContentLength > int64(c.br.Buffered()) {
		if t0.IsZero() {
			t0 = time.Now()
		}
		c.setReadDeadline(t0.Add(o.ReadTimeout))
	} else if end < 0 {
		c.setReadDeadline(time.Time{})
	}
	return req, true
}

// headEnd returns the length of the request head at the start of b (up to
// and including the empty line that ends it, CRLF or LF), or -1 if b does
// not hold it all.
func headEnd(b []byte) int {
	for i := 0; ; {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return -1
		}
		i += j + 1
		if i < len(b) && b[i] == '\n' {
			return i + 1
		}
		if i+1 < len(b) && b[i] == '\r' && b[i+1] == '\n' {
			return i + 2
		}
	}
}

// readError answers a request that could not be read, as net/http's
// server does: 431 past the head limit, 501 for an unsupported transfer
// coding, nothing when the client went away or timed out, else 400.
func (c *conn) readError(err error) {
	if c.r.limit <= 0 {
		c.writeError(http.StatusRequestHeaderFieldsTooLarge, "")
		return
	}
	if isUnsupportedTE(err) {
		c.writeError(http.StatusNotImplemented, "unsupported transfer encoding")
		return
	}
	if err == io.EOF {
		return
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return
	}
	if oe, ok := err.(*net.OpError); ok && oe.Op == "read" {
		return
	}
	c.writeError(http.StatusBadRequest, "")
}

// unsupportedTE is the type of net/http's error for a transfer coding it
// does not implement.
const unsupportedTE = "*http.unsupportedTEError"

func isUnsupportedTE(err error) bool {
	return err != nil && reflect.TypeOf(err).String() == unsupportedTE
}

// writeError writes a plain-text answer with the status code and the
// reason (if any), and ends the connection.
func (c *conn) writeError(code int, reason string) {
	_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
	msg := strconv.Itoa(code) + " " + http.StatusText(code)
	if reason != "" {
		msg += ": " + reason
	}
	_, _ = c.bw.WriteString("HTTP/1.1 " + msg + "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: " +
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
// linger, until the client closes too.
func (c *conn) closeWriteAndWait() {
	cw, ok := c.nc.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		return
	}
	_ = c.nc.SetReadDeadline(time.Now().Add(linger))
	buf := make([]byte, 32<<10)
	for {
		if _, err := c.nc.Read(buf); err != nil {
			return
		}
	}
}

// serveRequest runs the handler for req and reports whether the connection
// can serve another request.
func (c *conn) serveRequest(req *http.Request) (keep bool) {
	e := req.Header.Get("Expect")
	expect100 := false
	if hasToken(e, "100-continue") {
		// HTTP/1.0 clients cannot take a 100 Continue: ignored, as
		// with net/http.
		expect100 = req.ProtoAtLeast(1, 1) && req.ContentLength != 0
	} else if e != "" {
		c.writeError(http.StatusExpectationFailed, "")
		return false
	}
	req.RemoteAddr = c.remote
	if tc, ok := c.nc.(*tls.Conn); ok {
		// As net/http's server: the handler sees the connection's TLS
		// state (its handshake is done, the head was read over it).
		cs := tc.ConnectionState()
		req.TLS = &cs
	}
	ctx, cancel := context.WithCancel(c.ctx)
	// The handler gets the request http.ReadRequest returned, not a
	// copy: its body merges a chunked body's trailer into that one.
	*req = *req.WithContext(ctx)
	conn := req.Header.Get("Connection")
	w := &response{c: c, req: req, header: make(http.Header, 8), contentLength: -1,
		wantsClose:       req.Close || hasToken(conn, "close") || c.s.shutdown.Load(),
		wants10KeepAlive: req.ProtoMajor == 1 && req.ProtoMinor == 0 && hasToken(conn, "keep-alive")}

	var body *body
	c.mu.Lock()
	c.cancel, c.handlerDone, c.watchWanted, c.watching, c.stopping, c.gone = cancel, false, false, false, false, false
	if req.Body == nil || req.Body == http.NoBody {
		req.Body = http.NoBody
		c.bodyDone, c.pipelined = true, c.br.Buffered() > 0
	} else {
		c.bodyDone, c.pipelined = false, false
		body = newBody(c, w, req.Body, expect100)
		req.Body = body
		w.body = body
	}
	c.mu.Unlock()
	c.s.requestStarted(c)

	h := c.s.h
	if req.RequestURI == "*" && req.Method == http.MethodOptions {
		h = optionsStar{}
	}
	panicked := c.runHandler(h, w, req)
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
	if panicked || w.closeAfter || unread {
		// The response head settled the body (read to its end, or
		// the connection closes), so unread implies closeAfter; it
		// is checked for safety all the same.
		c.lingerClose = unread
		return false
	}
	return true
}

// runHandler serves req with h and reports whether h panicked.
func (c *conn) runHandler(h http.Handler, w *response, req *http.Request) (panicked bool) {
	defer func() {
		if v := recover(); v != nil {
			panicked = true
			if err, ok := v.(error); !ok || !errors.Is(err, http.ErrAbortHandler) {
				c.s.log.Error("httpserver: handler panicked; closing the connection",
					"remote", c.remote, "method", req.Method, "path", req.URL.Path, "panic", v, "stack", string(debug.Stack()))
			}
			if w.wroteHead {
				_ = c.bw.Flush() // pass on what was written; the close ends it short
			}
		}
	}()
	h.ServeHTTP(w, req)
	return false
}

// optionsStar answers "OPTIONS *" as net/http's server does, without
// calling the handler: 200 with no body, after reading up to 4 KiB of a
// request body (more closes the connection).
type optionsStar struct{}

func (optionsStar) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Length", "0")
	if r.ContentLength != 0 {
		const max = 4 << 10
		if n, _ := io.CopyN(io.Discard, r.Body, max+1); n > max {
			w.Header().Set("Connection", "close")
		}
	}
}

// setReadDeadline sets the connection's read deadline and notes it.
func (c *conn) setReadDeadline(t time.Time) {
	c.rdl = t
	_ = c.nc.SetReadDeadline(t)
}

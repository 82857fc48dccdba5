// Package httpserver is a minimal HTTP/1.1 server for an http.Handler,
// with less per-request work than net/http's server and the same
// strictness on the requests it accepts.
//
// It reads each request with http.ReadRequest and then applies the checks
// net/http's server adds (header names and values, Host, protocol version,
// Expect, OPTIONS *), answers malformed input with the same status codes
// (400, 431, 501, 505, 417), and writes the response itself. Stricter
// than net/http, it closes the connection after a request of ambiguous
// framing (Transfer-Encoding beside Content-Length, or on HTTP/1.0), as
// RFC 9112 §6.1 and §6.3 require. Its tests
// include a differential fuzz test against net/http's server
// (FuzzDifferential); the differences it accepts are listed in
// diff_test.go.
package httpserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Options.
const (
	// DefaultReadHeaderTimeout bounds the reading of a request's head.
	DefaultReadHeaderTimeout = 10 * time.Second
	// DefaultReadTimeout bounds the reading of a whole request, head and
	// body, from its first byte: a client that sends its body slowly is
	// cut off after it. A minute lets a client upload 8 MiB (the
	// gateway's default body limit) at 140 kB/s.
	DefaultReadTimeout = time.Minute
	// DefaultIdleTimeout bounds the wait for the next request on a
	// kept-alive connection.
	DefaultIdleTimeout = 2 * time.Minute
	// DefaultMaxHeaderBytes bounds a request's head (request line and
	// header fields); a larger one gets 431.
	DefaultMaxHeaderBytes = 1 << 20
	// DefaultDisconnectCheckDelay is how long a handler runs before the
	// server starts watching its connection for the client going away.
	DefaultDisconnectCheckDelay = 5 * time.Millisecond
)

// maxPostHandlerRead is how much of a request body the handler left
// unread the server reads and discards to keep the connection, as
// net/http's server does; a longer rest closes it.
const maxPostHandlerRead = 256 << 10

// Options configures a Server. The zero value uses the defaults.
type Options struct {
	// ReadHeaderTimeout bounds the reading of a request's head, from its
	// first byte (slowloris). Zero means DefaultReadHeaderTimeout.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds the reading of a whole request, from the first
	// byte of its head to the end of its body, as net/http's
	// Server.ReadTimeout does: a body read past it fails with a timeout
	// error (the handler sees it from Request.Body.Read) and the
	// connection is closed after the response. It does not bound the
	// handler or the response. Zero means DefaultReadTimeout.
	ReadTimeout time.Duration
	// IdleTimeout bounds the wait for the next request's first byte on a
	// kept-alive connection. The deadline is moved only when less than
	// three quarters of IdleTimeout remain (moving it re-arms a runtime
	// timer), so an idle connection is closed after between 3/4 and all of
	// IdleTimeout. Zero means DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's head; a larger one is answered
	// with 431 and the connection closed. Zero means
	// DefaultMaxHeaderBytes.
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
	// arrives. Zero means DefaultDisconnectCheckDelay; negative
	// starts the watch as soon as the body is read.
	DisconnectCheckDelay time.Duration
	// Logger receives handler panics and accept errors. Nil means
	// slog.Default().
	Logger *slog.Logger
}

// Server is a minimal HTTP/1.1 server for an http.Handler, without
// net/http's per-request machinery: one goroutine per connection reads a
// request with http.ReadRequest, checks it as net/http's server does,
// runs the handler on that goroutine and writes the response itself
// (Content-Length when the handler sets it or the whole body fits in a
// small buffer, else chunked; Flush for server-sent events). It supports
// keep-alive (HTTP/1.0 keep-alive too) with an idle timeout, read-header
// and read timeouts, a head size limit (431), 100-continue (sent when the
// handler first reads the body), Connection: close, OPTIONS * and
// pipelining. Over a listener of *tls.Conn (tls.NewListener) it serves
// HTTPS, the request's TLS set as net/http sets it; it does not terminate
// TLS itself, nor support HTTP/2, Hijack (upgrades, CONNECT
// tunnels), response trailers, Content-Type sniffing, a write timeout or
// ResponseController's full duplex and deadlines; a request's context has
// http.LocalAddrContextKey but not http.ServerContextKey. A handler panic
// is logged and closes its connection (http.ErrAbortHandler is not
// logged).
//
// A Server is safe for concurrent use; its zero value is not usable, use
// New.
type Server struct {
	h    http.Handler
	opts Options
	log  *slog.Logger

	mu       sync.Mutex
	lns      map[net.Listener]struct{}
	conns    map[*conn]struct{}
	shutdown atomic.Bool

	// The disconnect-check ticker (see Options.DisconnectCheckDelay).
	epoch     time.Time
	reqs      atomic.Uint64 // requests read so far
	wdRunning atomic.Bool   // the ticker runs or has been woken
	wdOnce    sync.Once     // starts the ticker's goroutine
	wdWake    chan struct{}
	wdQuit    chan struct{}
	quitOnce  sync.Once
}

// New returns a server for h. It reports a nil handler, negative timeouts
// or a negative header size with an error naming the field and value.
func New(h http.Handler, opts Options) (*Server, error) {
	if h == nil {
		return nil, errors.New("httpserver: handler is nil")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"ReadHeaderTimeout", opts.ReadHeaderTimeout}, {"ReadTimeout", opts.ReadTimeout}, {"IdleTimeout", opts.IdleTimeout}} {
		if d.v < 0 {
			return nil, fmt.Errorf("httpserver: %s %v must not be negative", d.name, d.v)
		}
	}
	if opts.MaxHeaderBytes < 0 {
		return nil, fmt.Errorf("httpserver: MaxHeaderBytes %d must not be negative", opts.MaxHeaderBytes)
	}
	if opts.ReadHeaderTimeout == 0 {
		opts.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if opts.ReadTimeout == 0 {
		opts.ReadTimeout = DefaultReadTimeout
	}
	if opts.IdleTimeout == 0 {
		opts.IdleTimeout = DefaultIdleTimeout
	}
	if opts.MaxHeaderBytes == 0 {
		opts.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if opts.DisconnectCheckDelay == 0 {
		opts.DisconnectCheckDelay = DefaultDisconnectCheckDelay
	}
	lg := opts.Logger
	if lg == nil {
		lg = slog.Default()
	}
	return &Server{h: h, opts: opts, log: lg, lns: map[net.Listener]struct{}{}, conns: map[*conn]struct{}{},
		epoch: time.Now(), wdWake: make(chan struct{}, 1), wdQuit: make(chan struct{})}, nil
}

// Serve accepts connections on ln and serves each on its own goroutine. It
// returns http.ErrServerClosed after Shutdown or Close, else the error
// that stopped accepting.
func (s *Server) Serve(ln net.Listener) error {
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
				s.log.Warn("httpserver: accept failed; retrying", "err", err, "in", backoff)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("httpserver: accept: %w", err)
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
// done (then it returns ctx's error and leaves the rest open, their
// clients' disconnects still watched; call Close).
func (s *Server) Shutdown(ctx context.Context) error {
	s.closeListeners()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if s.closeIdle() == 0 {
			s.stopWatchdog()
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
func (s *Server) Close() error {
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

func (s *Server) closeListeners() {
	s.shutdown.Store(true)
	s.mu.Lock()
	defer s.mu.Unlock()
	for ln := range s.lns {
		ln.Close()
	}
}

// closeIdle closes the connections waiting for a request and returns how
// many connections remain.
func (s *Server) closeIdle() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if c.idle.Load() {
			c.nc.Close()
		}
	}
	return len(s.conns)
}

package httpserver

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// waitLimit bounds the waits of these tests for something that must
// happen; reaching it is a failure, not a timing threshold.
const waitLimit = 10 * time.Second

// startLean serves h with a lean server on a loopback port and returns its
// address and the server.
// dialRaw connects to the server at addr for raw HTTP/1.1, with waitLimit
// as the deadline of every read and write; the caller closes it.
func dialRaw(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	require.NoError(t, conn.SetDeadline(time.Now().Add(waitLimit)))
	return conn
}

func startServer(t *testing.T, h http.Handler, opts Options) (string, *Server) {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quietLogger()
	}
	s, err := New(h, opts)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		require.NoError(t, s.Close())
		select {
		case err := <-done:
			require.ErrorIs(t, err, http.ErrServerClosed)
		case <-time.After(waitLimit):
			t.Error("Serve did not return after Close")
		}
	})
	return ln.Addr().String(), s
}

// echoHandler answers with the request body, after setting the headers
// given as query parameters.
func echoHandler(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	for k, v := range r.URL.Query() {
		w.Header()[http.CanonicalHeaderKey(k)] = v
	}
	_, _ = w.Write(b)
}

func TestWithHTTPClient(t *testing.T) {
	big := strings.Repeat("0123456789", 1000)
	mux := http.NewServeMux()
	mux.HandleFunc("/echo", echoHandler)
	mux.HandleFunc("/length", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(big)))
		_, _ = io.WriteString(w, big)
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, _ *http.Request) {
		for i := 0; i < len(big); i += 100 {
			_, _ = io.WriteString(w, big[i:i+100])
		}
	})
	mux.HandleFunc("/nocontent", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("/status", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusTeapot)
		_, _ = io.WriteString(w, "short")
	})
	addr, _ := startServer(t, mux, Options{})
	base := "http://" + addr

	tests := []struct {
		name     string
		method   string
		path     string
		body     io.Reader
		bodyLen  int64 // -1: the client sends the body chunked
		hdr      http.Header
		status   int
		want     string
		length   int64 // resp.ContentLength; -1 for chunked
		chunked  bool
		wantHead http.Header
	}{
		{name: "Content-Length set by handler", method: "GET", path: "/length", status: 200, want: big, length: int64(len(big))},
		{name: "short body gets a Content-Length", method: "POST", path: "/echo?X-Test=a", body: strings.NewReader("hello"), bodyLen: 5,
			status: 200, want: "hello", length: 5, wantHead: http.Header{"X-Test": {"a"}}},
		{name: "long body of unknown length is chunked", method: "GET", path: "/big", status: 200, want: big, length: -1, chunked: true},
		{name: "chunked request body", method: "POST", path: "/echo", body: strings.NewReader(big), bodyLen: -1,
			status: 200, want: big, length: -1, chunked: true},
		{name: "empty body", method: "GET", path: "/echo", status: 200, want: "", length: 0},
		{name: "HEAD keeps the length and sends no body", method: "HEAD", path: "/length", status: 200, want: "", length: int64(len(big))},
		{name: "204 has no body", method: "GET", path: "/nocontent", status: 204, want: "", length: 0},
		{name: "status and short body", method: "GET", path: "/status", status: 418, want: "short", length: 5},
		{name: "not found from mux", method: "GET", path: "/nope", status: 404, want: "404 page not found\n", length: 19},
		{name: "100-continue", method: "POST", path: "/echo", body: strings.NewReader("continued"), bodyLen: 9,
			hdr: http.Header{"Expect": {"100-continue"}}, status: 200, want: "continued", length: 9},
		{name: "header values with line breaks are not split", method: "GET", path: "/echo?X-Evil=a%0D%0AX-Injected:%20b", status: 200,
			length: 0, wantHead: http.Header{"X-Evil": {"a  X-Injected: b"}}},
	}
	c := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: waitLimit}}
	defer c.CloseIdleConnections()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, base+tt.path, tt.body)
			require.NoError(t, err)
			if tt.body != nil {
				req.ContentLength = tt.bodyLen
				if tt.bodyLen < 0 {
					req.Body = io.NopCloser(tt.body) // unknown length: chunked
				}
			}
			for k, v := range tt.hdr {
				req.Header[k] = v
			}
			resp, err := c.Do(req)
			require.NoError(t, err)
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, tt.status, resp.StatusCode)
			assert.Equal(t, tt.want, string(b))
			assert.Equal(t, tt.length, resp.ContentLength)
			if tt.chunked {
				assert.Equal(t, []string{"chunked"}, resp.TransferEncoding)
			} else {
				assert.Empty(t, resp.TransferEncoding)
			}
			assert.NotEmpty(t, resp.Header.Get("Date"))
			for k, v := range tt.wantHead {
				assert.Equal(t, v, resp.Header[k], "header %s", k)
			}
			assert.Empty(t, resp.Header.Get("X-Injected"))
		})
	}
}

// Sequential requests of one client reuse one connection.
func TestKeepAlive(t *testing.T) {
	addr, _ := startServer(t, http.HandlerFunc(echoHandler), Options{})
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	reused := 0
	for i := range 5 {
		trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
			if info.Reused {
				reused++
			}
		}}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace),
			http.MethodPost, "http://"+addr+"/", strings.NewReader("req"+strconv.Itoa(i)))
		require.NoError(t, err)
		resp, err := c.Do(req)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, "req"+strconv.Itoa(i), string(b))
	}
	assert.Equal(t, 4, reused)
}

// rawExchange writes raw to a new connection, reads the responses to the
// given methods and reports whether the server then closed the connection
// (closeCheck false: the test does not wait for that).
func rawExchange(t *testing.T, addr, raw string, methods []string, closeCheck bool) ([]*http.Response, []string, bool) {
	t.Helper()
	conn := dialRaw(t, addr)
	defer conn.Close()
	_, err := io.WriteString(conn, raw)
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	var resps []*http.Response
	var bodies []string
	for _, m := range methods {
		resp, err := http.ReadResponse(br, &http.Request{Method: m})
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		resps = append(resps, resp)
		bodies = append(bodies, string(b))
	}
	if !closeCheck {
		return resps, bodies, false
	}
	// An open connection answers one more request; a closed one fails.
	if _, err := io.WriteString(conn, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return resps, bodies, true
	}
	_, err = http.ReadResponse(br, nil)
	return resps, bodies, err != nil
}

func TestRawRequests(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/echo", echoHandler)
	mux.HandleFunc("/ignore-body", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ignored") })
	mux.HandleFunc("/stream10", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "a")
		w.(http.Flusher).Flush()
		_, _ = io.WriteString(w, "b")
	})
	addr, _ := startServer(t, mux, Options{MaxHeaderBytes: 1024})
	tests := []struct {
		name    string
		raw     string
		methods []string
		status  []int
		bodies  []string
		closed  bool // the server closes the connection after
		header  http.Header
	}{
		{name: "keep-alive, two pipelined requests",
			raw:     "GET /echo HTTP/1.1\r\nHost: x\r\n\r\nPOST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
			methods: []string{"GET", "POST"}, status: []int{200, 200}, bodies: []string{"", "abc"}},
		{name: "chunked request body",
			raw:     "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\nGET /echo HTTP/1.1\r\nHost: x\r\n\r\n",
			methods: []string{"POST", "GET"}, status: []int{200, 200}, bodies: []string{"abcde", ""}},
		{name: "unread body is drained and the connection kept",
			raw:     "POST /ignore-body HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /echo HTTP/1.1\r\nHost: x\r\n\r\n",
			methods: []string{"POST", "GET"}, status: []int{200, 200}, bodies: []string{"ignored", ""}},
		{name: "Connection: close", raw: "GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
			methods: []string{"GET"}, status: []int{200}, bodies: []string{""}, closed: true},
		{name: "HTTP/1.0", raw: "POST /echo HTTP/1.0\r\nContent-Length: 2\r\n\r\nhi",
			methods: []string{"POST"}, status: []int{200}, bodies: []string{"hi"}, closed: true},
		{name: "HTTP/1.0 streamed answer is delimited by the close", raw: "GET /stream10 HTTP/1.0\r\n\r\n",
			methods: []string{"GET"}, status: []int{200}, bodies: []string{"ab"}, closed: true},
		{name: "HTTP/1.1 streamed answer is chunked", raw: "GET /stream10 HTTP/1.1\r\nHost: x\r\n\r\n",
			methods: []string{"GET"}, status: []int{200}, bodies: []string{"ab"}, header: http.Header{"Transfer-Encoding": nil}},
		{name: "malformed request line", raw: "GARBAGE\r\n\r\n", methods: []string{"GET"}, status: []int{400}, closed: true},
		{name: "malformed header", raw: "GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", methods: []string{"GET"}, status: []int{400}, closed: true},
		{name: "missing Host", raw: "GET /echo HTTP/1.1\r\n\r\n", methods: []string{"GET"}, status: []int{400}, closed: true},
		{name: "invalid Host", raw: "GET /echo HTTP/1.1\r\nHost: a b\r\n\r\n", methods: []string{"GET"}, status: []int{400}, closed: true},
		{name: "bad Content-Length", raw: "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: x\r\n\r\n", methods: []string{"POST"}, status: []int{400}, closed: true},
		{name: "oversized header", raw: "GET /echo HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("b", 8000) + "\r\n\r\n",
			methods: []string{"GET"}, status: []int{431}, closed: true},
		{name: "unknown expectation", raw: "POST /echo HTTP/1.1\r\nHost: x\r\nExpect: magic\r\nContent-Length: 1\r\n\r\nx",
			methods: []string{"POST"}, status: []int{417}, closed: true},
		// net/http's server hands the HTTP/2 preface to the handler,
		// here ServeMux, which answers 400 to "*".
		{name: "HTTP/2 preface", raw: "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", methods: []string{"GET"}, status: []int{400}, closed: true},
		{name: "HTTP/3.0", raw: "GET /echo HTTP/3.0\r\nHost: x\r\n\r\n", methods: []string{"GET"}, status: []int{505}, closed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resps, bodies, closed := rawExchange(t, addr, tt.raw, tt.methods, true)
			for i, resp := range resps {
				assert.Equal(t, tt.status[i], resp.StatusCode, "response %d", i)
				if tt.bodies != nil {
					assert.Equal(t, tt.bodies[i], bodies[i], "response %d", i)
				}
			}
			assert.Equal(t, tt.closed, closed, "connection closed")
			last := resps[len(resps)-1]
			assert.Equal(t, tt.closed, last.Close, "the last response says Connection: close")
			for k, v := range tt.header {
				if k == "Transfer-Encoding" {
					assert.Equal(t, []string{"chunked"}, last.TransferEncoding)
					continue
				}
				assert.Equal(t, v, last.Header[k], "header %s", k)
			}
		})
	}
}

// Events a handler flushes reach the client while the handler still runs.
func TestStreamsUnbuffered(t *testing.T) {
	release := make(chan struct{})
	addr, _ := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		_, _ = io.WriteString(w, "data: one\n\n")
		_ = rc.Flush()
		<-release
		_, _ = io.WriteString(w, "data: two\n\n")
	}), Options{})
	resp, err := http.Get("http://" + addr + "/")
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, []string{"chunked"}, resp.TransferEncoding)
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "data: one\n", line)
	close(release)
	rest, err := io.ReadAll(br)
	require.NoError(t, err)
	assert.Equal(t, "\ndata: two\n\n", string(rest))
}

// A client that disconnects while the handler runs cancels r.Context(),
// whether it goes before or after the disconnect check's delay, and
// whether the request had a body.
func TestDisconnectCancelsContext(t *testing.T) {
	for _, tt := range []struct {
		name  string
		delay time.Duration
		raw   string
	}{
		{"watch at once, no body", -1, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"watch at once, body", -1, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbody"},
		{"default delay, no body", 0, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"default delay, chunked body", 0, "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nbody\r\n0\r\n\r\n"},
		{"long delay, body", time.Millisecond * 50, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbody"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h, started, canceled := awaitCancel()
			addr, _ := startServer(t, h, Options{DisconnectCheckDelay: tt.delay})
			conn, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			_, err = io.WriteString(conn, tt.raw)
			require.NoError(t, err)
			<-started
			require.NoError(t, conn.Close())
			require.ErrorIs(t, <-canceled, context.Canceled)
		})
	}
}

// The context of a request is cancelled when its handler returns, and a
// pipelined request read by the disconnect watch is still served.
func TestContextEndsWithHandler(t *testing.T) {
	var mu sync.Mutex
	var ctxs []context.Context
	gate := make(chan struct{})
	addr, _ := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		ctxs = append(ctxs, r.Context())
		first := len(ctxs) == 1
		mu.Unlock()
		if first {
			<-gate // the watch starts at once and reads the second request's first byte
		}
		_, _ = io.WriteString(w, r.URL.Path)
	}), Options{DisconnectCheckDelay: -1})
	conn := dialRaw(t, addr)
	defer conn.Close()
	_, err := io.WriteString(conn, "GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	_, err = io.WriteString(conn, "GET /b HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	close(gate)
	br := bufio.NewReader(conn)
	for _, want := range []string{"/a", "/b"} {
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, want, string(b))
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, ctxs, 2)
	for i, ctx := range ctxs {
		select { // cancelled just after the answer is sent
		case <-ctx.Done():
		case <-time.After(waitLimit):
		}
		assert.ErrorIs(t, ctx.Err(), context.Canceled, "request %d", i)
	}
}

// A handler that panics closes its connection (after what it wrote), is
// logged unless it panicked with http.ErrAbortHandler, and the server
// goes on serving.
func TestHandlerPanic(t *testing.T) {
	var logBuf bytes.Buffer
	var logMu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{mu: &logMu, w: &logBuf}, nil))
	mux := http.NewServeMux()
	mux.HandleFunc("/panic", func(http.ResponseWriter, *http.Request) { panic("boom") })
	mux.HandleFunc("/panic-after-head", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", "10")
		_, _ = io.WriteString(w, "part")
		panic("boom after head")
	})
	mux.HandleFunc("/abort", func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) })
	mux.HandleFunc("/ok", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	addr, _ := startServer(t, mux, Options{Logger: logger})
	for _, tt := range []struct {
		path   string
		logged string
	}{{"/panic", "boom"}, {"/panic-after-head", "boom after head"}, {"/abort", ""}} {
		t.Run(tt.path, func(t *testing.T) {
			conn := dialRaw(t, addr)
			defer conn.Close()
			_, err := io.WriteString(conn, "GET "+tt.path+" HTTP/1.1\r\nHost: x\r\n\r\nGET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
			require.NoError(t, err)
			got, err := io.ReadAll(conn) // the server closes the connection
			require.NoError(t, err)
			assert.NotContains(t, string(got), "\r\n\r\nok", "the pipelined request is not served on the broken connection")
			logMu.Lock()
			logged := logBuf.String()
			logBuf.Reset()
			logMu.Unlock()
			if tt.logged != "" {
				assert.Contains(t, logged, "handler panicked")
				assert.Contains(t, logged, tt.logged)
			} else {
				assert.Empty(t, logged)
			}
			resps, bodies, _ := rawExchange(t, addr, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n", []string{"GET"}, false)
			assert.Equal(t, 200, resps[0].StatusCode)
			assert.Equal(t, "ok", bodies[0])
		})
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Shutdown closes idle connections, lets a request in flight finish (with
// Connection: close) and makes Serve return http.ErrServerClosed.
func TestShutdown(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	s, err := New(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(entered)
			<-release
		}
		_, _ = io.WriteString(w, "done")
	}), Options{Logger: quietLogger()})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	addr := ln.Addr().String()

	idle := dialRaw(t, addr)
	defer idle.Close()
	_, err = io.WriteString(idle, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	idleBr := bufio.NewReader(idle)
	resp, err := http.ReadResponse(idleBr, nil)
	require.NoError(t, err)
	_, _ = io.ReadAll(resp.Body)

	busy := dialRaw(t, addr)
	defer busy.Close()
	_, err = io.WriteString(busy, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	<-entered

	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(context.Background()) }()
	_, err = idleBr.ReadByte()
	assert.ErrorIs(t, err, io.EOF, "the idle connection is closed")
	require.ErrorIs(t, <-served, http.ErrServerClosed)
	close(release)
	resp, err = http.ReadResponse(bufio.NewReader(busy), nil)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, "done", string(b))
	assert.True(t, resp.Close, "Connection: close during shutdown")
	require.NoError(t, <-shut)
	_, err = net.Dial("tcp", addr)
	assert.Error(t, err, "the listener is closed")
	assert.ErrorIs(t, s.Serve(ln), http.ErrServerClosed)
}

func TestNewInvalidOptions(t *testing.T) {
	h := http.NotFoundHandler()
	for _, tt := range []struct {
		name  string
		h     http.Handler
		opts  Options
		field string
	}{
		{"nil handler", nil, Options{}, "handler"},
		{"negative read-header timeout", h, Options{ReadHeaderTimeout: -1}, "ReadHeaderTimeout"},
		{"negative idle timeout", h, Options{IdleTimeout: -time.Second}, "IdleTimeout -1s"},
		{"negative header size", h, Options{MaxHeaderBytes: -5}, "MaxHeaderBytes -5"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.h, tt.opts)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.field)
			assert.True(t, strings.HasPrefix(err.Error(), "httpserver:"), err.Error())
		})
	}
}

// An idle kept-alive connection and a request head that does not finish
// are closed after their timeouts; a request that outlives the idle
// deadline still left on its connection is neither cut nor cancelled.
func TestTimeouts(t *testing.T) {
	const timeout = 20 * time.Millisecond
	release := make(chan struct{})
	canceled := make(chan bool, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/", echoHandler)
	mux.HandleFunc("/long", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		select {
		case <-release:
			canceled <- false
		case <-r.Context().Done():
			canceled <- true
		}
		_, _ = io.WriteString(w, "long done")
	})
	addr, _ := startServer(t, mux, Options{IdleTimeout: timeout, ReadHeaderTimeout: timeout, DisconnectCheckDelay: -1})
	for _, tt := range []struct {
		name, raw string
		methods   []string
	}{
		{"idle connection", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi", []string{"POST"}},
		{"unfinished head", "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			conn := dialRaw(t, addr)
			defer conn.Close()
			_, err := io.WriteString(conn, tt.raw)
			require.NoError(t, err)
			br := bufio.NewReader(conn)
			for _, m := range tt.methods {
				resp, err := http.ReadResponse(br, &http.Request{Method: m})
				require.NoError(t, err)
				_, _ = io.ReadAll(resp.Body)
			}
			_, err = br.ReadByte()
			require.ErrorIs(t, err, io.EOF, "the server closed the connection")
		})
	}
	t.Run("long request", func(t *testing.T) {
		conn := dialRaw(t, addr)
		defer conn.Close()
		_, err := io.WriteString(conn, "POST /long HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
		require.NoError(t, err)
		time.Sleep(5 * timeout) // not synchronisation: the idle deadline must pass
		close(release)
		assert.False(t, <-canceled, "the request's context was not cancelled")
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, "long done", string(b))
	})
}

// A request's context holds the connection's local address, as with
// net/http's server.
func TestContextLocalAddr(t *testing.T) {
	got := make(chan any, 1)
	addr, _ := startServer(t, http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		got <- r.Context().Value(http.LocalAddrContextKey)
	}), Options{})
	resp, err := http.Get("http://" + addr + "/")
	require.NoError(t, err)
	readAll(t, resp)
	a, ok := (<-got).(net.Addr)
	require.True(t, ok)
	assert.Equal(t, addr, a.String())
}

// TestShutdownTimedOutKeepsWatch: a Shutdown whose context ends before the
// requests in flight do leaves them running (until Close), and their
// clients' disconnects are still noticed: the disconnect check goes on
// (it used to stop with Shutdown's return, so a request whose check was
// not yet due was never watched and its handler ran on after its client
// left).
func TestShutdownTimedOutKeepsWatch(t *testing.T) {
	h, started, canceled := awaitCancel()
	s, err := New(h, Options{Logger: quietLogger(), DisconnectCheckDelay: 50 * time.Millisecond})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { _ = s.Close() })
	conn := dialRaw(t, ln.Addr().String())
	_, err = io.WriteString(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbody")
	require.NoError(t, err)
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, s.Shutdown(ctx), context.Canceled, "the request is still in flight")
	require.NoError(t, conn.Close())
	require.ErrorIs(t, <-canceled, context.Canceled)
}

// awaitCancel returns a handler of one request that reads its body, closes
// started and sends its context's error on canceled once the context ends
// (an error if it has not within waitLimit).
func awaitCancel() (http.Handler, chan struct{}, chan error) {
	started, canceled := make(chan struct{}), make(chan error, 1)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		close(started)
		select {
		case <-r.Context().Done():
			canceled <- r.Context().Err()
		case <-time.After(waitLimit):
			canceled <- errors.New("not canceled")
		}
	}), started, canceled
}

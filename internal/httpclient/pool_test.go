package httpclient

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func poolPost(t *testing.T, p *Pool, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(body)), nil }
	resp, err := p.RoundTrip(req)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp.StatusCode, string(b)
}

func TestConnPoolReusesConnections(t *testing.T) {
	tests := []struct {
		name      string
		handler   http.HandlerFunc
		wantConns int64
	}{
		{"content-length answers", func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			_, _ = w.Write(b)
		}, 1},
		{"chunked answers", func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			_, _ = w.Write(b)
			http.NewResponseController(w).Flush()
			_, _ = w.Write([]byte("!"))
		}, 1},
		{"connection close answers", func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			w.Header().Set("Connection", "close")
			_, _ = w.Write(b)
		}, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var conns atomic.Int64
			srv := httptest.NewUnstartedServer(tt.handler)
			srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
				if s == http.StateNew {
					conns.Add(1)
				}
			}
			srv.Start()
			defer srv.Close()
			p := New(Options{})
			for i := range 5 {
				code, body := poolPost(t, p, srv.URL+"/x", "hello")
				assert.Equal(t, http.StatusOK, code, "request %d", i)
				assert.True(t, strings.HasPrefix(body, "hello"), "request %d body %q", i, body)
			}
			assert.Equal(t, tt.wantConns, conns.Load())
		})
	}
}

// An engine that closes a keep-alive connection while it is idle costs
// nothing: the request is resent on a new connection.
func TestConnPoolRetriesStaleConnection(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	var accepted atomic.Int64
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				// Answer one request as if keeping the connection, then close it.
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				b, _ := io.ReadAll(req.Body)
				resp := "HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(b)) + "\r\n\r\n" + string(b)
				_, _ = io.WriteString(c, resp)
			}()
		}
	}()
	p := New(Options{})
	url := "http://" + l.Addr().String() + "/x"
	for i := range 3 {
		code, body := poolPost(t, p, url, "ping")
		assert.Equal(t, http.StatusOK, code, "request %d", i)
		assert.Equal(t, "ping", body)
	}
	assert.GreaterOrEqual(t, accepted.Load(), int64(3))
}

func TestConnPoolDialErrorAndCancel(t *testing.T) {
	p := New(Options{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	l.Close()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/x", strings.NewReader("a"))
	require.NoError(t, err)
	_, err = p.RoundTrip(req)
	require.Error(t, err)
	var op *net.OpError
	assert.True(t, errors.As(err, &op) && op.Op == "dial", "a refused connection is a dial error: %v", err)

	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-block
	}))
	defer srv.Close()
	defer close(block)
	ctx, cancel := context.WithCancel(context.Background())
	req, err = http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/x", strings.NewReader("a"))
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() {
		_, err := p.RoundTrip(req)
		errc <- err
	}()
	cancel()
	assert.ErrorIs(t, <-errc, context.Canceled)
}

// When an engine restarts, every idle connection to it is stale; one
// request must not fail for it, however many stale connections are pooled.
func TestConnPoolEngineRestart(t *testing.T) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_, _ = w.Write(b)
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	srv := httptest.NewUnstartedServer(handler)
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	p := New(Options{})
	// Pool four connections: hold four answers open, then finish them.
	var open []*http.Response
	for range 4 {
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/x", strings.NewReader("warm"))
		require.NoError(t, err)
		resp, err := p.RoundTrip(req)
		require.NoError(t, err)
		open = append(open, resp)
	}
	for _, resp := range open {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	p.mu.Lock()
	pooled := len(p.idle[addr])
	p.mu.Unlock()
	require.Equal(t, 4, pooled)

	srv.CloseClientConnections()
	srv.Close()
	l2, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	srv2 := httptest.NewUnstartedServer(handler)
	srv2.Listener.Close()
	srv2.Listener = l2
	srv2.Start()
	defer srv2.Close()
	for i := range 3 {
		code, body := poolPost(t, p, "http://"+addr+"/x", "after restart")
		assert.Equal(t, http.StatusOK, code, "request %d", i)
		assert.Equal(t, "after restart", body)
	}
}

// Prune closes connections idle for idleTime or longer on every host, and
// drops hosts left with none.
func TestConnPoolPrune(t *testing.T) {
	now := time.Unix(1000, 0)
	p := New(Options{})
	p.now = func() time.Time { return now }
	p.lastPrune = now
	var peers []net.Conn
	add := func(host string) {
		a, b := net.Pipe()
		peers = append(peers, b)
		p.put(host, &poolConn{c: a})
	}
	add("old:80")
	add("old:80")
	now = now.Add(p.idleTime / 2)
	add("fresh:80")
	now = now.Add(p.idleTime / 2)
	p.Prune()
	assert.Equal(t, map[string]int{"fresh:80": 1}, p.IdleCounts())
	for i, c := range peers[:2] {
		_, err := c.Read(make([]byte, 1))
		assert.ErrorIs(t, err, io.EOF, "connection %d, idle too long, is closed", i)
	}

	// put sweeps every host once idleTime has passed since the last sweep.
	now = now.Add(p.idleTime)
	add("other:80")
	assert.Equal(t, map[string]int{"other:80": 1}, p.IdleCounts())

	p.CloseIdleConnections()
	assert.Empty(t, p.IdleCounts())
}

// A request is not resent once any of its response has arrived: the engine
// read it and may have run it. Only a reused connection that fails before
// any response byte is retried on a new one.
func TestConnPoolNoResendAfterPartialResponse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	var received, conns atomic.Int64
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			first := conns.Add(1) == 1
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for i := 0; ; i++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.ReadAll(req.Body)
					received.Add(1)
					if first && i == 1 {
						// The second request on the first connection gets
						// a status line, then the engine dies.
						_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\n")
						return
					}
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				}
			}()
		}
	}()
	p := New(Options{})
	url := "http://" + l.Addr().String() + "/x"
	code, body := poolPost(t, p, url, "one")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok", body)

	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader("two"))
	require.NoError(t, err)
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader("two")), nil }
	_, err = p.RoundTrip(req)
	require.Error(t, err, "the failure is reported, not hidden by a resend")
	assert.Equal(t, int64(2), received.Load(), "the engine saw the second request once")
	assert.Equal(t, int64(1), conns.Load(), "no new connection was opened to resend it")
}

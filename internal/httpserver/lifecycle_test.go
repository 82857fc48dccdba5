package httpserver

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// reject413 reads at most 1 MiB of the body, then answers 413, as the
// proxy does past MaxBodyBytes.
func reject413(w http.ResponseWriter, r *http.Request) {
	if _, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20)); err != nil {
		w.Header().Set("Content-Length", "9")
		w.WriteHeader(http.StatusRequestEntityTooLarge)
		_, _ = io.WriteString(w, "too large")
		return
	}
	_, _ = io.WriteString(w, "ok")
}

// An answer sent before the request body was read (a 413) reaches the
// client: the server does not reset the connection with the body unread.
// A reset loses the answer only sometimes, hence the repetitions.
func TestEarlyAnswerSurvivesUnreadBody(t *testing.T) {
	const repeat = 10
	for _, tt := range []struct {
		name string
		url  func(t *testing.T) string
		size int
	}{
		{"handler answers after 1 MiB", func(t *testing.T) string {
			addr, _ := startServer(t, http.HandlerFunc(reject413), Options{})
			return "http://" + addr + "/"
		}, 32 << 20},
	} {
		t.Run(tt.name, func(t *testing.T) {
			url := tt.url(t)
			body := make([]byte, tt.size)
			for i := range repeat {
				resp, err := http.Post(url, "application/octet-stream", bytes.NewReader(body))
				require.NoError(t, err, "request %d", i)
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
				require.NoError(t, err, "request %d", i)
				assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "request %d", i)
				assert.True(t, resp.Close, "request %d: the answer says Connection: close", i)
			}
		})
	}
}

// A response after which the server closes the connection says so, and
// one that does not say so is followed by a kept connection.
func TestAnnouncesClose(t *testing.T) {
	addr, _ := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c := r.URL.Query().Get("connection"); c != "" {
			w.Header().Set("Connection", c)
		}
		w.WriteHeader(http.StatusForbidden)
	}), Options{})
	for _, tt := range []struct {
		name, head string
		send       int // body bytes sent after the head, on their own goroutine
		closed     bool
	}{
		{"body over the drain limit left unread", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n", 1 << 20, true},
		{"chunked body over the drain limit left unread", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
			strings.Repeat("10000\r\n"+strings.Repeat("x", 0x10000)+"\r\n", 5), 0, true},
		{"short chunked body left unread is drained", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 0, false},
		{"100-continue never sent", "POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n", 0, true},
		{"handler's Connection lists close", "GET /?connection=keep-alive,%20close HTTP/1.1\r\nHost: x\r\n\r\n", 0, true},
		{"short body left unread is drained", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + strings.Repeat("x", 1000), 0, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			conn := dialRaw(t, addr)
			defer conn.Close()
			_, err := io.WriteString(conn, tt.head)
			require.NoError(t, err)
			if tt.send > 0 {
				go func() { _, _ = conn.Write(make([]byte, tt.send)) }()
			}
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			_, err = io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.Equal(t, http.StatusForbidden, resp.StatusCode)
			assert.Equal(t, tt.closed, resp.Close, "the response says Connection: close")
			if tt.closed {
				_, err = br.ReadByte()
				assert.ErrorIs(t, err, io.EOF, "the server closed the connection")
				return
			}
			_, err = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			require.NoError(t, err)
			resp, err = http.ReadResponse(br, nil)
			require.NoError(t, err, "the kept connection answers another request")
			assert.Equal(t, http.StatusForbidden, resp.StatusCode)
		})
	}
}

// A body read by a goroutine the handler left behind fails once the
// handler has returned, and leaves the next request on the connection
// alone.
func TestBodyReadAfterHandler(t *testing.T) {
	late, lateErr := make(chan struct{}), make(chan error, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/leak", func(w http.ResponseWriter, r *http.Request) {
		go func() {
			<-late
			_, err := io.ReadAll(r.Body)
			lateErr <- err
		}()
		_, _ = io.WriteString(w, "leaked")
	})
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		close(late) // the /leak request is done with
		assert.ErrorIs(t, <-lateErr, http.ErrBodyReadAfterClose)
		echoHandler(w, r)
	})
	addr, _ := startServer(t, mux, Options{})
	resps, bodies, _ := rawExchange(t, addr,
		"POST /leak HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"+
			"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789",
		[]string{"POST", "POST"}, false)
	assert.Equal(t, []string{"leaked", "0123456789"}, bodies)
	for _, resp := range resps {
		assert.Equal(t, http.StatusOK, resp.StatusCode)
	}
}

// Close cancels the context of the requests in flight.
func TestCloseCancelsRequests(t *testing.T) {
	started, canceled := make(chan struct{}), make(chan bool, 1)
	addr, s := startServer(t, http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		close(started)
		select {
		case <-r.Context().Done():
			canceled <- true
		case <-time.After(waitLimit):
			canceled <- false
		}
	}), Options{DisconnectCheckDelay: time.Hour})
	go func() {
		if resp, err := http.Get("http://" + addr + "/"); err == nil {
			resp.Body.Close()
		}
	}()
	<-started
	require.NoError(t, s.Close())
	assert.True(t, <-canceled, "the request's context was cancelled")
}

// A new connection that sends nothing is closed after ReadHeaderTimeout,
// not IdleTimeout.
func TestSilentNewConnection(t *testing.T) {
	addr, _ := startServer(t, http.HandlerFunc(echoHandler),
		Options{ReadHeaderTimeout: 20 * time.Millisecond, IdleTimeout: time.Hour})
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(waitLimit)))
	_, err = conn.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "the server closed the connection")
}

// An interim (1xx) response carries the handler's fields but not the
// final response's framing.
func TestInterimResponse(t *testing.T) {
	addr, _ := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", "5")
		w.Header().Set("Transfer-Encoding", "chunked")
		w.Header().Set("Connection", "keep-alive")
		w.Header().Set("Link", "</a.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Transfer-Encoding")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "hello")
	}), Options{})
	conn := dialRaw(t, addr)
	defer conn.Close()
	_, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	require.NoError(t, err)
	raw, err := io.ReadAll(conn)
	require.NoError(t, err)
	interim, final, ok := strings.Cut(string(raw), "\r\n\r\n")
	require.True(t, ok, "%q", raw)
	lines := strings.Split(interim, "\r\n")
	assert.Equal(t, "HTTP/1.1 103 Early Hints", lines[0])
	assert.ElementsMatch(t, []string{"Link: </a.css>; rel=preload"}, lines[1:])
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(final)), nil)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, int64(5), resp.ContentLength)
	assert.Equal(t, "hello", string(b))
}

// Header changes after WriteHeader (or the first Write) are not sent, as
// with net/http, even while the head is held back.
func TestHeaderAfterWriteHeader(t *testing.T) {
	for _, tt := range []struct {
		name   string
		h      func(w http.ResponseWriter)
		status int
	}{
		{"after Write", func(w http.ResponseWriter) {
			_, _ = io.WriteString(w, "hi")
			w.Header().Set("X-Late", "1")
			w.WriteHeader(http.StatusTeapot) // superfluous: ignored
		}, http.StatusOK},
		{"after WriteHeader", func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusCreated)
			w.Header().Set("X-Late", "1")
			_, _ = io.WriteString(w, "hi")
		}, http.StatusCreated},
	} {
		t.Run(tt.name, func(t *testing.T) {
			addr, _ := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("X-Early", "1")
				tt.h(w)
			}), Options{})
			resp, err := http.Get("http://" + addr + "/")
			require.NoError(t, err)
			b := readAll(t, resp)
			assert.Equal(t, tt.status, resp.StatusCode)
			assert.Equal(t, "hi", string(b))
			assert.Equal(t, "1", resp.Header.Get("X-Early"))
			assert.Empty(t, resp.Header.Values("X-Late"))
		})
	}
}

// Shutdown closes a kept-alive connection that waits for its next request
// with the first bytes of it already read (sent with the previous
// request), as net/http's Shutdown closes it (StateIdle until four bytes
// came). Before, such a connection counted as busy: Shutdown waited for
// its IdleTimeout, an hour here.
func TestShutdownClosesPartlyReadNext(t *testing.T) {
	addr, s := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}), Options{IdleTimeout: time.Hour})
	conn := dialRaw(t, addr)
	defer conn.Close()
	_, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\nGE")
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	assert.Equal(t, "ok", string(readAll(t, resp)))

	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	require.NoError(t, s.Shutdown(ctx), "Shutdown waited for a connection between requests")
	_, err = br.ReadByte()
	assert.ErrorIs(t, err, io.EOF)
}

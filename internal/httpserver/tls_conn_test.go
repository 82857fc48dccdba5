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
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func startTLS(t *testing.T, h http.Handler, o Options) (addr string, cfg *tls.Config) {
	ref := httptest.NewUnstartedServer(nil)
	ref.StartTLS()
	t.Cleanup(ref.Close)
	s, err := New(h, o)
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	sc := ref.TLS.Clone()
	sc.NextProtos = []string{"http/1.1"}
	go func() { _ = s.Serve(tls.NewListener(l, sc)) }()
	t.Cleanup(func() { s.Close() })
	return l.Addr().String(), ref.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
}

// Over TLS: a handler that runs past the disconnect check delay (the
// watch reads in the background and is interrupted) leaves the
// connection usable; a pipelined request is served; a large streamed
// answer arrives whole.
func TestTLSConnWatchKeepAlivePipelining(t *testing.T) {
	addr, cfg := startTLS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(30 * time.Millisecond)
		if r.URL.Path == "/big" {
			chunk := bytes.Repeat([]byte("y"), 64<<10)
			for range 64 {
				w.Write(chunk)
				w.(http.Flusher).Flush()
			}
			return
		}
		io.WriteString(w, "ok"+r.URL.Path)
	}), Options{DisconnectCheckDelay: time.Millisecond})
	conn, err := tls.Dial("tcp", addr, cfg)
	require.NoError(t, err)
	defer conn.Close()
	br := bufio.NewReader(conn)
	for i := range 3 {
		_, err = io.WriteString(conn, "GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err, "request %d", i)
		b, _ := io.ReadAll(resp.Body)
		require.Equal(t, "ok/a", string(b))
	}
	// pipelined
	_, err = io.WriteString(conn, "GET /p1 HTTP/1.1\r\nHost: x\r\n\r\nGET /p2 HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	for _, p := range []string{"/p1", "/p2"} {
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		require.Equal(t, "ok"+p, string(b))
	}
	// pipelined, second sent while the first runs (the watch reads its first byte)
	_, err = io.WriteString(conn, "GET /q1 HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	time.Sleep(15 * time.Millisecond)
	_, err = io.WriteString(conn, "GET /q2 HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	for _, p := range []string{"/q1", "/q2"} {
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		require.Equal(t, "ok"+p, string(b))
	}
	_, err = io.WriteString(conn, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	n, err := io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	require.EqualValues(t, 64*64<<10, n)
}

func TestTLSConnDisconnectCancels(t *testing.T) {
	started, canceled := make(chan struct{}), make(chan error, 1)
	addr, cfg := startTLS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		select {
		case <-r.Context().Done():
			canceled <- r.Context().Err()
		case <-time.After(5 * time.Second):
			canceled <- errors.New("not canceled")
		}
	}), Options{})
	conn, err := tls.Dial("tcp", addr, cfg)
	require.NoError(t, err)
	_, err = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	<-started
	require.NoError(t, conn.Close())
	require.ErrorIs(t, <-canceled, context.Canceled)
}

// A TCP connection that never sends its ClientHello is closed within the
// head deadline.
func TestTLSConnSilentHandshake(t *testing.T) {
	addr, _ := startTLS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}),
		Options{ReadHeaderTimeout: 50 * time.Millisecond, IdleTimeout: time.Hour})
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(3*time.Second)))
	start := time.Now()
	_, err = conn.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF)
	require.Less(t, time.Since(start), time.Second)
}

// An early answer with an unread body over TLS (closeWriteAndWait).
func TestTLSConnEarlyAnswerUnreadBody(t *testing.T) {
	addr, cfg := startTLS(t, http.HandlerFunc(reject413), Options{})
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
	body := make([]byte, 8<<20)
	for i := range 3 {
		start := time.Now()
		resp, err := client.Post("https://"+addr+"/", "application/octet-stream", bytes.NewReader(body))
		require.NoError(t, err, "request %d", i)
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
		t.Logf("request %d: %v", i, time.Since(start))
	}
}

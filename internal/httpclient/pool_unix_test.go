//go:build unix

package httpclient

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// waitUnread waits until the pool's idle connection to host has bytes (or
// the peer's close) to read, without reading them.
func waitUnread(t *testing.T, p *Pool, host string) {
	t.Helper()
	p.mu.Lock()
	require.Len(t, p.idle[host], 1)
	c := p.idle[host][0].c
	p.mu.Unlock()
	raw, err := c.(syscall.Conn).SyscallConn()
	require.NoError(t, err)
	// Read calls f until it reports done, waiting for the socket to be
	// readable between calls.
	require.NoError(t, raw.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK)
		return err != syscall.EAGAIN
	}))
}

// An engine that writes on an idle keep-alive connection (an answer nobody
// asked for, or a 408 before it closes the connection, as some servers do
// at their idle timeout) does not get those bytes taken for the answer to
// the next request: as http.Transport, which reads every idle connection
// and closes one that speaks unasked, the pool does not reuse it.
func TestConnPoolUnsolicitedAnswer(t *testing.T) {
	for _, tt := range []struct {
		name        string
		unsolicited string
		closeAfter  bool
	}{
		{"answer, connection kept", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale", false},
		{"408, then closed", "HTTP/1.1 408 Request Timeout\r\nContent-Length: 5\r\nConnection: close\r\n\r\nstale", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			defer l.Close()
			speak := make(chan struct{})
			go func() {
				for n := 0; ; n++ {
					c, err := l.Accept()
					if err != nil {
						return
					}
					go func() {
						defer c.Close()
						br := bufio.NewReader(c)
						for i := 0; ; i++ {
							req, err := http.ReadRequest(br)
							if err != nil {
								return
							}
							_, _ = io.Copy(io.Discard, req.Body)
							body := "fresh"
							if n == 0 {
								body = []string{"first", "again"}[min(i, 1)]
							}
							_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"+body)
							if n == 0 && i == 0 {
								<-speak
								_, _ = io.WriteString(c, tt.unsolicited)
								if tt.closeAfter {
									return
								}
							}
						}
					}()
				}
			}()
			p := New(Options{})
			defer p.CloseIdleConnections()
			url := "http://" + l.Addr().String() + "/x"
			code, body := poolPost(t, p, url, "ping")
			require.Equal(t, http.StatusOK, code)
			require.Equal(t, "first", body)
			close(speak)
			waitUnread(t, p, l.Addr().String())
			code, body = poolPost(t, p, url, "ping")
			assert.Equal(t, http.StatusOK, code)
			assert.Equal(t, "fresh", body, "the next request gets its own answer, on a new connection")
		})
	}
}

package httpserver

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// deadlineConn records, for each Read, how far ahead the read deadline in
// effect was, and whether a Write came before it.
type deadlineConn struct {
	net.Conn
	mu       sync.Mutex
	deadline time.Time
	wrote    bool
	// afterWrite holds the deadlines (as durations from the Read's
	// start) of the Reads made after the first Write.
	afterWrite []time.Duration
}

func (c *deadlineConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return c.Conn.SetReadDeadline(t)
}

func (c *deadlineConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if c.wrote && !c.deadline.IsZero() {
		c.afterWrite = append(c.afterWrite, time.Until(c.deadline))
	}
	c.mu.Unlock()
	return c.Conn.Read(p)
}

func (c *deadlineConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.wrote = true
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *deadlineConn) reads() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.afterWrite...)
}

type deadlineListener struct {
	net.Listener
	conns chan *deadlineConn
}

func (l deadlineListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	dc := &deadlineConn{Conn: c}
	l.conns <- dc
	return dc, nil
}

// A kept-alive connection waits for its next request at most IdleTimeout,
// also after a request whose body was read under a longer ReadTimeout
// (found in review: the wait kept the body's deadline, a ReadTimeout
// ahead, since only a deadline closer than 3/4 IdleTimeout was moved).
func TestIdleTimeoutAfterLongReadTimeout(t *testing.T) {
	const idle, read = time.Minute, time.Hour
	called := make(chan struct{}, 1)
	s, err := New(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		called <- struct{}{}
		_, _ = io.ReadAll(r.Body)
		_, _ = io.WriteString(w, "ok")
	}), Options{IdleTimeout: idle, ReadTimeout: read, DisconnectCheckDelay: time.Hour, Logger: quietLogger()})
	require.NoError(t, err)
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ln := deadlineListener{tcp, make(chan *deadlineConn, 1)}
	go func() { _ = s.Serve(ln) }()
	defer s.Close()

	conn := dialRaw(t, tcp.Addr().String())
	defer conn.Close()
	dc := <-ln.conns
	// The head alone first, so that the body is read from the connection
	// under the ReadTimeout deadline.
	_, err = io.WriteString(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n")
	require.NoError(t, err)
	<-called
	_, err = io.WriteString(conn, "hi")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	_, _ = io.ReadAll(resp.Body)
	require.Equal(t, 200, resp.StatusCode)

	// The server's next Read, after its answer, is the wait for the next
	// request.
	deadline := time.Now().Add(waitLimit)
	for len(dc.reads()) == 0 {
		require.True(t, time.Now().Before(deadline), "the server did not wait for a next request")
		time.Sleep(time.Millisecond)
	}
	for _, d := range dc.reads() {
		require.LessOrEqual(t, d, idle, "the idle wait's deadline is beyond IdleTimeout")
	}
}

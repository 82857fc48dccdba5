package picker

import (
	"context"
	"net"
	"runtime"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// serveTCP serves a Server on a loopback TCP port through LimitListener(n)
// with the limits l, and returns the limiter.
func serveTCP(t *testing.T, n int, l GRPCLimits) *ConnLimiter {
	t.Helper()
	s, err := New(newRouter(t, newGateway(t, 1), 0), Options{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lim := LimitListener(ln, n)
	g := grpc.NewServer(GRPCOptions(l)...)
	s.Register(g)
	go func() { _ = g.Serve(lim) }()
	t.Cleanup(g.Stop)
	return lim
}

// waitOpen polls lim until ok accepts its count of open connections.
func waitOpen(t *testing.T, lim *ConnLimiter, what string, ok func(int64) bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !ok(lim.Open()); {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %d connections open", what, lim.Open())
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
}

// dialRaw opens a TCP connection to lim that sends nothing.
func dialRaw(t *testing.T, lim *ConnLimiter) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", lim.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reports whether the server closed c: a read ends (with
// EOF or a reset) before the 20s liveness bound, which is no deadline of
// the server's.
func closedByServer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, 4096)
	for {
		if _, err := c.Read(buf); err != nil {
			ne, ok := err.(net.Error)
			return !ok || !ne.Timeout()
		}
		// the server's SETTINGS frame; then nothing until it closes
	}
}

// TestHandshakeTimeout: connections that never send the HTTP/2 preface
// are closed at HandshakeTimeout, and give their place back.
func TestHandshakeTimeout(t *testing.T) {
	lim := serveTCP(t, 64, GRPCLimits{HandshakeTimeout: 50 * time.Millisecond})
	const n = 20
	conns := make([]net.Conn, n)
	for i := range conns {
		conns[i] = dialRaw(t, lim)
	}
	for i, c := range conns {
		if !closedByServer(c) {
			t.Fatalf("connection %d without a preface still open", i)
		}
	}
	waitOpen(t, lim, "every connection to be closed", func(n int64) bool { return n == 0 })
	if lim.Refused() != 0 {
		t.Fatalf("%d refused, want none under the bound", lim.Refused())
	}
}

// TestMaxConnectionIdle: a connection that did its handshake and has no
// stream is closed at MaxConnectionIdle, after its last stream ended.
func TestMaxConnectionIdle(t *testing.T) {
	lim := serveTCP(t, 64, GRPCLimits{MaxConnectionIdle: 50 * time.Millisecond})
	conn, err := grpc.NewClient(lim.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	waitOpen(t, lim, "the idle connection to be closed", func(n int64) bool { return n == 0 })
}

// TestLimitListener: past its bound, a connection is closed at once and
// counted; a connection's end makes room for another.
func TestLimitListener(t *testing.T) {
	lim := serveTCP(t, 2, GRPCLimits{HandshakeTimeout: time.Hour})
	a, _ := dialRaw(t, lim), dialRaw(t, lim)
	waitOpen(t, lim, "two connections", func(n int64) bool { return n == 2 })
	for i := range 3 {
		if c := dialRaw(t, lim); !closedByServer(c) {
			t.Fatalf("connection %d past the bound left open", i)
		}
	}
	if lim.Refused() != 3 || lim.Open() != 2 {
		t.Fatalf("%d refused, %d open; want 3 and 2", lim.Refused(), lim.Open())
	}
	a.Close()
	waitOpen(t, lim, "the closed connection's place", func(n int64) bool { return n == 1 })
	dialRaw(t, lim)
	waitOpen(t, lim, "a new connection", func(n int64) bool { return n == 2 })
	if lim.Refused() != 3 {
		t.Fatalf("%d refused, want 3", lim.Refused())
	}
}

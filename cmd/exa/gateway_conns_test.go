package main

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/examlops/gateway/internal/memtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGatewayMaxConnections: `exa serve gateway --max-connections 2` keeps
// two client connections open; a third is closed as it is accepted,
// before anything is read from it, and counted on /metrics; once one
// closes, a new one is served.
func TestGatewayMaxConnections(t *testing.T) {
	base, _ := startGatewayWith(t, newConfig(t), "--listen", "127.0.0.1:0", "--max-connections", "2")
	addr := strings.TrimPrefix(base, "http://")
	readers := map[net.Conn]*bufio.Reader{}
	// get sends GET path on c and returns the answer's status and body,
	// or the error that ended the connection.
	get := func(c net.Conn, path string) (int, string, error) {
		t.Helper()
		if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return 0, "", err
		}
		require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
		if readers[c] == nil {
			readers[c] = bufio.NewReader(c)
		}
		resp, err := http.ReadResponse(readers[c], nil)
		if err != nil {
			return 0, "", err
		}
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	var open []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		status, _, err := get(c, "/healthz")
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status)
		open = append(open, c)
	}
	third, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer third.Close()
	_, _, err = get(third, "/healthz")
	assert.Error(t, err, "closed as accepted")

	// The count, read on a connection already open.
	_, metrics, err := get(open[1], "/metrics")
	require.NoError(t, err)
	assert.Contains(t, metrics, "\nexa_gateway_connections_refused_total 1\n")
	assert.Contains(t, metrics, "\nexa_gateway_connections 2\n")

	// Once one closes, its place serves a new connection.
	open[0].Close()
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return false
		}
		defer c.Close()
		status, _, err := get(c, "/healthz")
		return err == nil && status == http.StatusOK
	}, 10*time.Second, 10*time.Millisecond)
}

// TestGatewayConnectionsRSS measures the gateway process's RSS held by
// idle keep-alive client connections: EXA_N (16,000) connections, each
// after one GET /healthz, with --max-connections EXA_MAX (the default);
// EXA_TLS=1 serves them over TLS (--tls-self-signed).
// Run:
//
//	EXA_MEASURE=1 go test ./cmd/exa -run TestGatewayConnectionsRSS -count=1 -v
func TestGatewayConnectionsRSS(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("measurement: set EXA_MEASURE=1")
	}
	n := memtest.EnvInt(t, "EXA_N", 16000)
	maxConns := memtest.EnvInt(t, "EXA_MAX", defaultGatewayMaxConns)
	useTLS := memtest.EnvInt(t, "EXA_TLS", 0) != 0
	args := []string{"serve", "gateway", "--listen", "127.0.0.1:0", "--max-connections", strconv.Itoa(maxConns)}
	if useTLS {
		args = append(args, "--tls-self-signed")
	}
	base, _, _, proc := startExa(t, exaBin, newConfig(t), `gateway listening on (https?://\S+) `, args...)
	addr := base[strings.Index(base, "//")+2:]
	start := procRSS(t, proc.Pid)
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		if useTLS {
			c = tls.Client(c, &tls.Config{InsecureSkipVerify: true})
		}
		conns = append(conns, c)
		_, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	}
	answered := 0
	b := make([]byte, 64)
	for _, c := range conns {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
		if k, _ := c.Read(b); strings.HasPrefix(string(b[:k]), "HTTP/1.1 200") {
			answered++
		}
	}
	held := procRSS(t, proc.Pid)
	t.Logf("%d connections (TLS %v), --max-connections %d: %d answered; RSS %.1f -> %.1f MiB, %.1f KiB a connection answered",
		n, useTLS, maxConns, answered, float64(start)/(1<<20), float64(held)/(1<<20), float64(held-start)/1024/float64(max(answered, 1)))
	require.Equal(t, min(n, maxConns), answered)
}

// TestGatewayMaxConnectionsPerClient: with --max-connections-per-client 1
// a second connection from one address is closed as it is accepted and
// counted, while another address is served.
func TestGatewayMaxConnectionsPerClient(t *testing.T) {
	base, _ := startGatewayWith(t, newConfig(t), "--listen", "127.0.0.1:0", "--max-connections-per-client", "1")
	addr := strings.TrimPrefix(base, "http://")
	get := func(from, path string) (int, string, error) {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		c, err := d.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return 0, "", err
		}
		require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return 0, "", err
		}
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	status, _, err := get("127.0.0.1", "/healthz") // kept open
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	_, _, err = get("127.0.0.1", "/healthz")
	assert.Error(t, err, "a second connection from 127.0.0.1 is closed as accepted")
	status, metrics, err := get("127.0.0.2", "/metrics")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	assert.Contains(t, metrics, "\nexa_gateway_connections_refused_per_client_total 1\n")
	assert.Contains(t, metrics, "\nexa_gateway_connections_refused_total 0\n")
}

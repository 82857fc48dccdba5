package netlimit

import (
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCloseWrite: an accepted connection keeps its TCP half-close, so a
// server can end a connection with unread input gently (found in review:
// the wrapper hid it, and the lean server reset such connections).
func TestCloseWrite(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ln := New(tcp, 4)
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer client.Close()
	c, err := ln.Accept()
	require.NoError(t, err)
	cw, ok := c.(interface{ CloseWrite() error })
	require.True(t, ok, "accepted %T has no CloseWrite", c)
	_, err = c.Write([]byte("bye"))
	require.NoError(t, err)
	require.NoError(t, cw.CloseWrite())
	got, err := io.ReadAll(client) // EOF once the server's side is shut
	require.NoError(t, err)
	assert.Equal(t, "bye", string(got))
	assert.Equal(t, int64(1), ln.Open(), "half-closed, still open")
	require.NoError(t, c.Close())
	assert.Zero(t, ln.Open())
}

// TestPerSource: with PerSource(1), a second connection from one address
// is closed as it is accepted and counted, one from another address is
// served, and a source's place comes back when its connection closes;
// the bound of all connections still holds.
func TestPerSource(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ln := New(tcp, 2).PerSource(1)
	defer ln.Close()
	dialFrom := func(ip string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		c, err := d.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	// accept returns the next connection Accept lets through.
	accept := func() net.Conn {
		t.Helper()
		c, err := ln.Accept()
		require.NoError(t, err)
		return c
	}
	// closedByServer reports whether the server side closed c.
	closedByServer := func(c net.Conn) bool {
		_, err := c.Read(make([]byte, 1))
		return err != nil
	}

	dialFrom("127.0.0.1")
	s1 := accept()
	assert.Equal(t, "127.0.0.1", s1.RemoteAddr().(*net.TCPAddr).IP.String())
	a2 := dialFrom("127.0.0.1") // refused: its source has one open
	dialFrom("127.0.0.2")
	s2 := accept() // b's; a2's was closed inside Accept
	assert.Equal(t, "127.0.0.2", s2.RemoteAddr().(*net.TCPAddr).IP.String())
	assert.True(t, closedByServer(a2), "the second from one source is closed")
	assert.Equal(t, uint64(1), ln.RefusedSources())
	assert.Equal(t, int64(2), ln.Open())

	require.NoError(t, s1.Close()) // 127.0.0.1's place comes back
	dialFrom("127.0.0.1")
	s3 := accept()
	assert.Equal(t, "127.0.0.1", s3.RemoteAddr().(*net.TCPAddr).IP.String())
	assert.Zero(t, ln.Refused(), "the bound of all was never reached past its 2")
}

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

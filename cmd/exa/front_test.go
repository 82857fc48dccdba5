package main

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Both front servers of exa serve gateway get the same limits: a request
// body that stalls is cut off at the read timeout (the handler's read
// fails with a timeout error), and a head past the size limit gets 431.
func TestFrontServerLimits(t *testing.T) {
	const wait = 10 * time.Second // reaching it is a failure, not a timing threshold
	for _, kind := range []string{"lean", "std"} {
		t.Run(kind, func(t *testing.T) {
			readErr := make(chan error, 1)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, err := io.ReadAll(r.Body)
				readErr <- err
			})
			srv, err := newFrontServer(kind, h, slog.New(slog.NewTextHandler(io.Discard, nil)),
				frontLimits{readHeader: wait, read: 200 * time.Millisecond, idle: wait})
			require.NoError(t, err)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			go func() { _ = srv.Serve(ln) }()
			t.Cleanup(func() { _ = srv.Close() })

			conn, err := net.Dial("tcp", ln.Addr().String())
			require.NoError(t, err)
			defer conn.Close()
			require.NoError(t, conn.SetDeadline(time.Now().Add(wait)))
			_, err = io.WriteString(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab")
			require.NoError(t, err)
			select {
			case err := <-readErr:
				var ne net.Error
				assert.True(t, errors.As(err, &ne) && ne.Timeout(), "body read error %v", err)
			case <-time.After(wait):
				t.Fatal("a stalled body was not cut off")
			}

			big, err := net.Dial("tcp", ln.Addr().String())
			require.NoError(t, err)
			defer big.Close()
			require.NoError(t, big.SetDeadline(time.Now().Add(wait)))
			go func() {
				_, _ = io.WriteString(big, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("b", 2<<20)+"\r\n\r\n")
			}()
			resp, err := http.ReadResponse(bufio.NewReader(big), nil)
			require.NoError(t, err)
			assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)
		})
	}
}

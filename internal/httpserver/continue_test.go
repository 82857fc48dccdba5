package httpserver

import (
	"bufio"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A handler may read an Expect: 100-continue body on a goroutine of its
// own while it answers, as with net/http's server (which guards its
// automatic 100 Continue with a mutex): the 100 Continue is written
// either before the answer's head or not at all, never into it, and
// without a data race (found in review: body.Read read wroteHead and
// wrote to the connection's buffer with nothing ordering it against
// writeHead on a response that closes the connection; go test -race
// reported it).
func TestContinueWhileAnswering(t *testing.T) {
	addr, _ := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = io.ReadAll(r.Body)
		}()
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "answer")
		w.(http.Flusher).Flush()
		<-done
	}), Options{})
	for range 20 {
		conn := dialRaw(t, addr)
		_, err := io.WriteString(conn, "POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello")
		require.NoError(t, err)
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		if resp.StatusCode == http.StatusContinue {
			resp, err = http.ReadResponse(br, nil)
			require.NoError(t, err)
		}
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "answer", string(b))
		conn.Close()
	}
}

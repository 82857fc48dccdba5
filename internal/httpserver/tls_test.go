package httpserver

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestServesTLS: over a TLS listener the handler sees the connection's
// TLS state, as with net/http's server, a streamed body arrives whole,
// and a kept-alive connection serves a second request.
func TestServesTLS(t *testing.T) {
	ref := httptest.NewUnstartedServer(nil)
	ref.StartTLS() // for its certificate and a client that trusts it
	defer ref.Close()
	s, err := New(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || !r.TLS.HandshakeComplete {
			http.Error(w, "no TLS state", http.StatusInternalServerError)
			return
		}
		b, _ := io.ReadAll(r.Body)
		w.Write(b)
	}), Options{})
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = s.Serve(tls.NewListener(l, ref.TLS.Clone())) }()
	defer s.Close()
	client := ref.Client()
	for i := range 2 {
		resp, err := client.Post("https://"+l.Addr().String()+"/", "text/plain", strings.NewReader(strings.Repeat("x", 100_000)))
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "request %d: %s", i, b)
		require.Len(t, b, 100_000)
	}
}

package httpgw

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/internal/httpserver"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The gateway behind the lean front server (internal/httpserver, the
// default of exa serve gateway): the proxy tests that depend on the front
// server. The server's own tests are in internal/httpserver.

// startLean serves h with a lean server on a loopback port and returns
// its address.
func startLean(t *testing.T, h http.Handler) string {
	t.Helper()
	s, err := httpserver.New(h, httpserver.Options{Logger: quietLogger()})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		require.NoError(t, s.Close())
		select {
		case err := <-done:
			require.ErrorIs(t, err, http.ErrServerClosed)
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after Close")
		}
	})
	return ln.Addr().String()
}

// newLeanFixture is newFixture with the gateway served by a lean server:
// f.http.URL points at it.
func newLeanFixture(t *testing.T, n int, mode gateway.Mode, eopts enginetest.Options) *fixture {
	t.Helper()
	f := newFixture(t, n, mode, eopts)
	f.http.URL = "http://" + startLean(t, f.http.Config.Handler)
	return f
}

// The proxy tests that depend on the front server, through the lean one.
func TestLeanServerProxy(t *testing.T) {
	t.Run("chat and completions", func(t *testing.T) {
		f := newLeanFixture(t, 2, gateway.ModeRoundRobin, enginetest.Options{})
		for i, tc := range []struct{ path, body string }{
			{"/v1/chat/completions", chatBody(testModel, false, "system prompt", "hello")},
			{"/v1/completions", `{"model":"m1","prompt":"once upon a time"}`},
		} {
			resp := f.post(tc.path, tc.body)
			b := readAll(t, resp)
			require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", b)
			var out struct{ Choices []json.RawMessage }
			require.NoError(t, json.Unmarshal(b, &out))
			assert.Len(t, out.Choices, 1)
			assert.Equal(t, resp.Header.Get("X-Engine"), resp.Header.Get(HeaderReplica), "request %d", i)
			assert.Equal(t, int64(len(b)), resp.ContentLength)
		}
		f.settle()
		assert.Equal(t, 2.0, f.counter("exa_gateway_requests_total", map[string]string{"model": testModel, "code": "200"}))
	})
	t.Run("bad request", func(t *testing.T) {
		f := newLeanFixture(t, 1, gateway.ModeRoundRobin, enginetest.Options{})
		resp := f.post("/v1/chat/completions", `{"model": "m1", "messages": [`)
		b := readAll(t, resp)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		assert.Equal(t, "invalid_request", *decodeError(t, b).Code)
	})
	t.Run("streaming is unbuffered", func(t *testing.T) {
		checkStreamingIsUnbuffered(t, newLeanFixture(t, 1, gateway.ModeRoundRobin, enginetest.Options{Chunks: 3}))
	})
	t.Run("client disconnect cancels upstream", func(t *testing.T) {
		checkClientDisconnectCancelsUpstream(t, newLeanFixture(t, 1, gateway.ModeRoundRobin, enginetest.Options{}))
	})
	t.Run("expect continue", func(t *testing.T) {
		f := newLeanFixture(t, 1, gateway.ModeRoundRobin, enginetest.Options{})
		resp := f.post("/v1/chat/completions", chatBody(testModel, false, strings.Repeat("long system prompt ", 200), "hi"), "Expect", "100-continue")
		b := readAll(t, resp)
		assert.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		assert.Contains(t, string(b), `"choices"`)
	})
	t.Run("stats and metrics", func(t *testing.T) {
		f := newLeanFixture(t, 1, gateway.ModeRoundRobin, enginetest.Options{})
		for _, p := range []string{"/stats", "/metrics", "/v1/models"} {
			resp, err := http.Get(f.http.URL + p)
			require.NoError(t, err)
			b := readAll(t, resp)
			assert.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", p, b)
			assert.NotEmpty(t, b, p)
		}
	})
}

// An answer the proxy sends past MaxBodyBytes, before the request body was
// read, reaches the client: the server does not reset the connection with
// the body unread. A reset loses the answer only sometimes, hence the
// repetitions.
func TestLeanServerProxyEarlyAnswer(t *testing.T) {
	url := newLeanFixture(t, 1, gateway.ModeRoundRobin, enginetest.Options{}).http.URL + "/v1/chat/completions"
	body := make([]byte, 16<<20)
	for i := range 10 {
		resp, err := http.Post(url, "application/octet-stream", bytes.NewReader(body))
		require.NoError(t, err, "request %d", i)
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err, "request %d", i)
		assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "request %d", i)
		assert.True(t, resp.Close, "request %d: the answer says Connection: close", i)
	}
}

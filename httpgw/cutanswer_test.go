package httpgw

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCutAnswerBeforeFirstByte: an engine that sends the head of a whole
// (not streamed) answer and closes the connection before any body byte
// leaves the client a 502 with an OpenAI error object, not a connection
// cut with no status; one cut after body bytes still cuts the client's.
func TestCutAnswerBeforeFirstByte(t *testing.T) {
	var cutAfter atomic.Pointer[string]
	cutAfter.Store(new(string))
	engine := rawEngine(t, func(c net.Conn, req *http.Request) bool {
		if req.URL.Path != "/v1/chat/completions" {
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
			return true
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"+*cutAfter.Load())
		return false
	})
	f := rawFixture(t, Options{}, engine)
	resp := f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "hi"))
	b := readAll(t, resp)
	require.Equal(t, http.StatusBadGateway, resp.StatusCode, "%s", b)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	e := decodeError(t, b)
	require.NotNil(t, e.Code)
	assert.Equal(t, "upstream_error", *e.Code)
	assert.Contains(t, e.Message, "cut its answer before its first byte")
	assert.Equal(t, 1.0, f.counter("exa_gateway_requests_total", map[string]string{"code": "502"}))

	part := `{"id":"x",`
	cutAfter.Store(&part)
	req, err := http.NewRequest(http.MethodPost, f.http.URL+"/v1/chat/completions", strings.NewReader(chatBody(testModel, false, "sys", "hi")))
	require.NoError(t, err)
	resp, err = http.DefaultClient.Do(req)
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	assert.Error(t, err, "bytes were sent: the answer is cut, not replaced")
}

// TestCutAnswerReset (issue 29, D7): an engine that sends the head and
// part of a body, then resets the connection (RST), leaves the client a
// status and a cut it can see, never 0 bytes: a streamed-upstream answer
// (SSE) a 502 with an error object, a relayed JSON body its head and what
// came of it, short of the declared length; a pass-through answer the
// same. Both upstream modes, both front servers.
func TestCutAnswerReset(t *testing.T) {
	for _, tc := range []struct {
		name, path, ct string
		mode           UpstreamStreamMode
		want           int // status the client gets
	}{
		{"on, SSE assembled", "/v1/chat/completions", "text/event-stream", UpstreamStreamOn, http.StatusBadGateway},
		{"on, JSON relayed", "/v1/chat/completions", "application/json", UpstreamStreamOn, http.StatusOK},
		{"off, JSON relayed", "/v1/chat/completions", "application/json", UpstreamStreamOff, http.StatusOK},
		{"pass-through", "/v1/embeddings", "application/json", UpstreamStreamOn, http.StatusOK},
	} {
		for _, lean := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/lean=%v", tc.name, lean), func(t *testing.T) {
				engine := rawEngine(t, func(c net.Conn, req *http.Request) bool {
					if req.URL.Path != tc.path {
						_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
						return true
					}
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: "+tc.ct+"\r\nContent-Length: 100000\r\n\r\n"+
						`data: {"id":"x","choices":[{"index":0,"delta":{"content":"a"}}]}`+"\n\n")
					_ = c.(*net.TCPConn).SetLinger(0) // Close sends RST
					return false
				})
				f := rawFixture(t, Options{UpstreamStream: tc.mode}, engine)
				addr := strings.TrimPrefix(f.http.URL, "http://")
				if lean {
					addr = startLean(t, f.http.Config.Handler)
				}
				body := chatBody(testModel, false, "sys", "hi")
				if tc.path == "/v1/embeddings" {
					body = `{"model":"` + testModel + `","input":"hi"}`
				}
				c, err := net.Dial("tcp", addr)
				require.NoError(t, err)
				defer c.Close()
				// A bound for a broken gateway only: the answer comes at once.
				require.NoError(t, c.SetDeadline(time.Now().Add(time.Minute)))
				_, err = fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", tc.path, len(body), body)
				require.NoError(t, err)
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				require.NoError(t, err, "the client gets a status line, not 0 bytes")
				b, rerr := io.ReadAll(resp.Body)
				require.Equal(t, tc.want, resp.StatusCode, "%s", b)
				if tc.want == http.StatusOK {
					assert.ErrorIs(t, rerr, io.ErrUnexpectedEOF, "the body is cut short of its declared length")
					assert.Contains(t, string(b), `data: {"id":"x"`, "what the engine sent is passed on")
					return
				}
				require.NoError(t, rerr)
				assert.Equal(t, "upstream_error", *decodeError(t, b).Code)
			})
		}
	}
}

package httpgw

import (
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

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

package httpgw

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/internal/httpclient"
)

const rawAnswer = `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"real answer"},"finish_reason":"stop"}]}`

func rawOK(body string) string {
	return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// An engine's interim (1xx) responses before its answer are skipped, as
// http.Transport skips them: the client gets the real answer, not the 1xx
// and an empty 200 (issue 13, finding 2). A 101, which the gateway never
// asks for, is an upstream failure.
func TestEngineInterimResponses(t *testing.T) {
	tests := []struct {
		name     string
		interim  string
		wantCode int
		wantBody string // substring
	}{
		{"100 continue", "HTTP/1.1 100 Continue\r\n\r\n", http.StatusOK, "real answer"},
		{"102 processing", "HTTP/1.1 102 Processing\r\n\r\n", http.StatusOK, "real answer"},
		{"103 early hints with headers", "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n", http.StatusOK, "real answer"},
		{"several", strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", 3) + "HTTP/1.1 103 Early Hints\r\n\r\n", http.StatusOK, "real answer"},
		{"a flood over the head limit", strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", 3000), http.StatusBadGateway, "response header"},
		{"101 unasked", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", http.StatusBadGateway, "101"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := rawEngine(t, func(c net.Conn, _ *http.Request) bool {
				_, err := io.WriteString(c, tt.interim+rawOK(rawAnswer))
				return err == nil
			})
			f := rawFixture(t, Options{}, addr)
			for i := range 2 { // the second request reuses the connection when kept
				resp := f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "q"+strconv.Itoa(i)))
				b := readAll(t, resp)
				require.Equal(t, tt.wantCode, resp.StatusCode, "request %d: %s", i, b)
				assert.Contains(t, string(b), tt.wantBody, "request %d", i)
			}
		})
	}
}

// The interim responses are not relayed to the client either: a raw
// client sees one response, the engine's answer.
func TestEngineInterimResponseNotRelayed(t *testing.T) {
	addr := rawEngine(t, func(c net.Conn, _ *http.Request) bool {
		_, err := io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n"+rawOK(rawAnswer))
		return err == nil
	})
	f := rawFixture(t, Options{}, addr)
	c, err := net.Dial("tcp", strings.TrimPrefix(f.http.URL, "http://"))
	require.NoError(t, err)
	defer c.Close()
	body := chatBody(testModel, false, "sys", "q")
	_, err = io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: "+
		strconv.Itoa(len(body))+"\r\nConnection: close\r\n\r\n"+body)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	b := readAll(t, resp)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the first response the client reads is the answer, not a relayed 1xx")
	assert.Equal(t, rawAnswer, string(b))
}

// An engine response head over the limit is not relayed: the client gets
// a 502 naming the cause (issue 13, finding 5).
func TestEngineHugeResponseHeader(t *testing.T) {
	big := strings.Repeat("a", 20<<20)
	addr := rawEngine(t, func(c net.Conn, _ *http.Request) bool {
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Big: "+big+"\r\n"+rawOK(rawAnswer)[len("HTTP/1.1 200 OK\r\n"):])
		return false
	})
	f := rawFixture(t, Options{}, addr)
	resp := f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "q"))
	b := readAll(t, resp)
	require.Equal(t, http.StatusBadGateway, resp.StatusCode, "%.200s", b)
	assert.Less(t, len(b), 4096, "the header is not relayed")
	msg := decodeError(t, b).Message
	assert.Contains(t, msg, "response header")
	assert.Contains(t, msg, "bytes")
	assert.True(t, strings.HasPrefix(msg, "gateway: upstream failure: "), msg)
}

// Apply closes the idle connections to engines it drops; Close closes all.
func TestIdleConnectionsOfDroppedEnginesClosed(t *testing.T) {
	f := newFixture(t, 2, gateway.ModeRoundRobin, enginetest.Options{})
	for i := range 2 {
		resp := f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "q"+strconv.Itoa(i)))
		readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	host := func(i int) string { return strings.TrimPrefix(f.engines[i].URL(), "http://") }
	f.settle() // a handler returns its engine connection after answering
	require.Equal(t, map[string]int{host(0): 1, host(1): 1}, f.srv.opts.Transport.(*httpclient.Pool).IdleCounts())

	require.NoError(t, f.srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {
		Replicas: []config.Replica{{Name: "e0", Address: f.engines[0].URL()}}}}}))
	assert.Equal(t, map[string]int{host(0): 1}, f.srv.opts.Transport.(*httpclient.Pool).IdleCounts(), "the dropped engine's idle connection is closed")

	require.NoError(t, f.srv.Close())
	assert.Empty(t, f.srv.opts.Transport.(*httpclient.Pool).IdleCounts())
	resp := f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "after close"))
	readAll(t, resp)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the server stays usable after Close")
}

// An engine that accepts the connection and the request but never answers
// holds a request only for the first-byte timeout or, not streamed, the
// response timeout (here short real ones): then the client gets a 502 or
// a 504 naming it (issue 13, finding 5).
func TestEngineNeverAnswers(t *testing.T) {
	for _, stream := range []bool{true, false} {
		t.Run("stream="+strconv.FormatBool(stream), func(t *testing.T) {
			release := make(chan struct{})
			addr := rawEngine(t, func(net.Conn, *http.Request) bool {
				<-release // reads the request, answers nothing
				return false
			})
			t.Cleanup(func() { close(release) }) // before rawEngine's cleanup waits
			// Off: a non-streamed request is forwarded as it is, its
			// wait bounded by ResponseTimeout (TestUpstreamStreamTimeout
			// has the default).
			opts := Options{FirstByteTimeout: time.Hour, ResponseTimeout: time.Hour, UpstreamStream: UpstreamStreamOff}
			want := &opts.ResponseTimeout
			if stream {
				want = &opts.FirstByteTimeout
			}
			*want = 20 * time.Millisecond
			f := rawFixture(t, opts, addr)
			resp := f.post("/v1/chat/completions", chatBody(testModel, stream, "sys", "q"))
			b := readAll(t, resp)
			wantStatus, wantMsg := http.StatusBadGateway, "no response byte within the first-byte timeout (20ms)"
			if !stream {
				wantStatus, wantMsg = http.StatusGatewayTimeout, "the answer was not complete within the response timeout (20ms)"
			}
			require.Equal(t, wantStatus, resp.StatusCode, "%s", b)
			assert.Contains(t, decodeError(t, b).Message, wantMsg)
		})
	}
}

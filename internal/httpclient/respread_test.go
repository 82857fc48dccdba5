package httpclient

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReadResponseMatchesNetHTTP reads each answer with readResponse and
// with http.ReadResponse and compares what the gateway uses: status,
// protocol, headers, length, connection reuse, body and what is left on the
// connection after it. simple says whether the fast path must decode it.
func TestReadResponseMatchesNetHTTP(t *testing.T) {
	const next = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n" // a pipelined next answer
	for _, tc := range []struct {
		name   string
		raw    string
		method string
		simple bool
	}{
		{"fasthttp", "HTTP/1.1 200 OK\r\nServer: fasthttp\r\nDate: Sun, 29 Nov 2026 10:13:09 GMT\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\nhello", "POST", true},
		{"uvicorn lower case", "HTTP/1.1 200 OK\r\ndate: Sun, 29 Nov 2026 10:13:09 GMT\r\nserver: uvicorn\r\ncontent-length: 2\r\ncontent-type: application/json\r\nx-request-id: a-b\r\n\r\n{}", "POST", true},
		{"no reason", "HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok", "POST", true},
		{"error status", "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nRetry-After: 1\r\n\r\nbusy", "POST", true},
		{"repeated header", "HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nX-A: 1\r\nSet-Cookie: b=2\r\nContent-Length: 1\r\n\r\nx", "POST", true},
		{"empty value and spaces", "HTTP/1.1 200 OK\r\nX-Empty:\r\nX-Pad: \t v \t\r\nContent-Length: 1\r\n\r\nx", "POST", true},
		{"empty body", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", "GET", true},
		{"pragma with cache-control", "HTTP/1.1 200 OK\r\nPragma: no-cache\r\nCache-Control: no-store\r\nContent-Length: 1\r\n\r\nx", "POST", true},
		{"chunked", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n5\r\ndata:\r\n0\r\n\r\n", "POST", false},
		{"no length", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil close", "POST", false},
		{"connection close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", "POST", false},
		{"http 1.0", "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", "POST", false},
		{"no content", "HTTP/1.1 204 No Content\r\n\r\n", "POST", false},
		{"continue first", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", "POST", false},
		{"folded header", "HTTP/1.1 200 OK\r\nX-Long: a\r\n b\r\nContent-Length: 2\r\n\r\nok", "POST", false},
		{"pragma alone", "HTTP/1.1 200 OK\r\nPragma: no-cache\r\nContent-Length: 1\r\n\r\nx", "POST", false},
		{"two lengths", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok", "POST", false},
		{"non-ascii value", "HTTP/1.1 200 OK\r\nX-Name: é\r\nContent-Length: 2\r\n\r\nok", "POST", false},
		{"head request", "HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n", "HEAD", false},
		{"bad status", "HTTP/1.1 2x0 OK\r\nContent-Length: 2\r\n\r\nok", "POST", false},
		{"bad length", "HTTP/1.1 200 OK\r\nContent-Length: -2\r\n\r\nok", "POST", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, "http://127.0.0.1:8000/v1/completions", nil)
			require.NoError(t, err)
			raw := tc.raw + next
			br := bufio.NewReader(strings.NewReader(raw))
			_, _ = br.Peek(1)
			buf, _ := br.Peek(br.Buffered())
			fast, _ := parseSimpleResponse(buf, br, req)
			assert.Equal(t, tc.simple, fast != nil, "fast path")

			got, gerr := readResponse(bufio.NewReader(strings.NewReader(raw)), req)
			wbr := bufio.NewReader(strings.NewReader(raw))
			want, werr := http.ReadResponse(wbr, req)
			if werr != nil {
				assert.Error(t, gerr)
				return
			}
			require.NoError(t, gerr)
			assert.Equal(t, want.Status, got.Status)
			assert.Equal(t, want.StatusCode, got.StatusCode)
			assert.Equal(t, want.Proto, got.Proto)
			assert.Equal(t, want.ProtoMajor, got.ProtoMajor)
			assert.Equal(t, want.ProtoMinor, got.ProtoMinor)
			assert.Equal(t, want.Header, got.Header)
			assert.Equal(t, want.ContentLength, got.ContentLength)
			assert.Equal(t, want.Close, got.Close)
			assert.Equal(t, want.TransferEncoding, got.TransferEncoding)
			wb, werr := io.ReadAll(want.Body)
			gb, gerr := io.ReadAll(got.Body)
			assert.Equal(t, werr, gerr)
			assert.Equal(t, string(wb), string(gb))
		})
	}
}

// The fast path leaves the connection's reader just after the body, so a
// kept-alive connection reads the next answer from the right place.
func TestReadResponseLeavesNextAnswer(t *testing.T) {
	raw := "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello" + "HTTP/1.1 201 Created\r\nContent-Length: 3\r\n\r\nbye"
	req, err := http.NewRequest(http.MethodPost, "http://e/v1/completions", nil)
	require.NoError(t, err)
	br := bufio.NewReader(strings.NewReader(raw))
	for _, want := range []struct {
		code int
		body string
	}{{200, "hello"}, {201, "bye"}} {
		resp, err := readResponse(br, req)
		require.NoError(t, err)
		assert.Equal(t, want.code, resp.StatusCode)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, want.body, string(b))
	}
	assert.Equal(t, 0, br.Buffered())
}

// A body cut short by the engine is an error, as with net/http's bodies,
// and its last bytes come with io.EOF.
func TestLengthBody(t *testing.T) {
	b := &lengthBody{br: bufio.NewReader(strings.NewReader("abc")), n: 5}
	got, err := io.ReadAll(b)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.Equal(t, "abc", string(got))

	b = &lengthBody{br: bufio.NewReader(strings.NewReader("abcdef")), n: 3}
	p := make([]byte, 10)
	n, err := b.Read(p)
	assert.Equal(t, 3, n)
	assert.Equal(t, io.EOF, err)
}

// A connection that fails before any byte of the answer gives the error
// http.ReadResponse gives.
func TestReadResponseErrors(t *testing.T) {
	req, err := http.NewRequest(http.MethodPost, "http://e/v1/completions", nil)
	require.NoError(t, err)
	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		r    func() io.Reader
	}{
		{"closed", func() io.Reader { return strings.NewReader("") }},
		{"failed", func() io.Reader { return iotest.ErrReader(boom) }},
		{"cut in the head", func() io.Reader { return strings.NewReader("HTTP/1.1 200 OK\r\nContent-Le") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, werr := http.ReadResponse(bufio.NewReader(tc.r()), req)
			_, gerr := readResponse(bufio.NewReader(tc.r()), req)
			require.Error(t, werr)
			assert.Equal(t, werr, gerr)
		})
	}
}

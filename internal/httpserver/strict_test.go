package httpserver

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The probes of issue 13 (findings 3 and 4, and the request smuggling of
// its introduction), each sent to this server and to net/http's with their
// default head limit over TCP: both must answer with the listed status
// codes and call the handler for the listed requests only.
func TestStrictLikeNetHTTP(t *testing.T) {
	lean, std := startBoth(t, "tcp", func(string) string { return "127.0.0.1:0" }, 0)
	const h = "Host: x\r\n"
	tests := []struct {
		name   string
		raw    string
		status []int
		calls  []string // method and target of each handler call
		bodies []string // the bodies the handler read, if checked
	}{
		// RFC 9112 §5.1: no whitespace between a field name and the
		// colon. Accepted, "Content-Length : 32" was not the body's
		// length and the second request was served: smuggling.
		{name: "space before colon in Content-Length",
			raw:    "GET /v1/models HTTP/1.1\r\n" + h + "Content-Length : 32\r\n\r\nGET /stats HTTP/1.1\r\n" + h + "\r\n",
			status: []int{400}},
		{name: "space before colon in Transfer-Encoding",
			raw:    "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding : chunked\r\n\r\n0\r\n\r\nGET /b HTTP/1.1\r\n" + h + "\r\n",
			status: []int{400}},
		{name: "space in a field name", raw: "GET /a HTTP/1.1\r\n" + h + "X Foo: bar\r\n\r\n", status: []int{400}},
		{name: "NUL in a field value", raw: "GET /a HTTP/1.1\r\n" + h + "X-Foo: a\x00b\r\n\r\n", status: []int{400}},
		{name: "malformed target", raw: "GET x HTTP/1.1\r\n" + h + "\r\n", status: []int{400}},
		{name: "bad escape in target", raw: "GET /%zz HTTP/1.1\r\n" + h + "\r\n", status: []int{400}},
		{name: "HTTP/1.0 ignores Expect: 100-continue",
			raw:    "POST /a HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi",
			status: []int{200}, calls: []string{"POST /a"}, bodies: []string{"hi"}},
		{name: "unknown expectation", raw: "POST /a HTTP/1.1\r\n" + h + "Expect: magic\r\nContent-Length: 1\r\n\r\nx", status: []int{417}},
		{name: "empty Host", raw: "GET /a HTTP/1.1\r\nHost:\r\n\r\n", status: []int{200}, calls: []string{"GET /a"}},
		{name: "missing Host", raw: "GET /a HTTP/1.1\r\n\r\n", status: []int{400}},
		{name: "absolute-form without Host", raw: "GET http://x/a HTTP/1.1\r\n\r\n", status: []int{400}},
		{name: "absolute-form with a bad Host", raw: "GET http://x/a HTTP/1.1\r\nHost: a b\r\n\r\n", status: []int{400}},
		{name: "absolute-form with Host", raw: "GET http://x/a HTTP/1.1\r\nHost: y\r\n\r\n", status: []int{200}, calls: []string{"GET http://x/a"}},
		{name: "folded Host", raw: "GET /a HTTP/1.1\r\nHost: x\r\n y\r\n\r\n", status: []int{400}},
		{name: "two Hosts", raw: "GET /a HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", status: []int{400}},
		{name: "OPTIONS * is the server's", raw: "OPTIONS * HTTP/1.1\r\n" + h + "\r\nGET /b HTTP/1.1\r\n" + h + "\r\n",
			status: []int{200, 200}, calls: []string{"GET /b"}},
		// 100,000 fields of 2.2 MB: past the head limit in the middle
		// of a line (net/http tells the limit before the error).
		{name: "too many fields", raw: "GET /a HTTP/1.1\r\n" + h + manyFields(100_000) + "\r\n", status: []int{431}},
		{name: "unsupported transfer coding", raw: "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: gzip\r\n\r\n", status: []int{501}},
		{name: "too many transfer codings", raw: "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: gzip, chunked\r\n\r\n", status: []int{501}},
		{name: "head cut short", raw: "GET /a HTTP/1.1\r\n" + h, status: []int{400}},
		{name: "HTTP/1.0 keep-alive", raw: "GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /b HTTP/1.0\r\n\r\nGET /c HTTP/1.0\r\n\r\n",
			status: []int{200, 200}, calls: []string{"GET /a", "GET /b"}},
		{name: "CRLF after a POST body", raw: "POST /a HTTP/1.1\r\n" + h + "Content-Length: 1\r\n\r\nx\r\nGET /b HTTP/1.1\r\n" + h + "\r\n",
			status: []int{200, 200}, calls: []string{"POST /a", "GET /b"}},
		{name: "HTTP/2 preface goes to the handler", raw: "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", status: []int{200}, calls: []string{"PRI *"}},
		{name: "HTTP/3.0", raw: "GET /a HTTP/3.0\r\n" + h + "\r\n", status: []int{505}},
		{name: "chunked body with trailer", raw: "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n",
			status: []int{200}, calls: []string{"POST /a"}, bodies: []string{"abc"}},
		{name: "two differing Content-Lengths", raw: "POST /a HTTP/1.1\r\n" + h + "Content-Length: 3\r\nContent-Length: 5\r\n\r\nabcde", status: []int{400}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, srv := range []*diffServer{lean, std} {
				res := srv.exchange([]byte(tt.raw), "")
				require.False(t, res.TimedOut, srv.name)
				assert.Empty(t, res.ParseErr, srv.name)
				var got []int
				for _, r := range res.Resps {
					got = append(got, r.Status)
				}
				assert.Equal(t, tt.status, got, "%s: status codes", srv.name)
				var calls, bodies []string
				for _, c := range res.Calls {
					calls = append(calls, c.Method+" "+c.RequestURI)
					bodies = append(bodies, c.Body)
				}
				assert.Equal(t, tt.calls, calls, "%s: handler calls", srv.name)
				if tt.bodies != nil {
					assert.Equal(t, tt.bodies, bodies, "%s: bodies", srv.name)
				}
			}
		})
	}
}

// RFC 9112 §6.1 and §6.3: a request with both Transfer-Encoding and
// Content-Length, or an HTTP/1.0 request with Transfer-Encoding, has
// framing that an intermediary may read otherwise (the smuggling of
// CL.TE and TE.CL); the server "MUST close the connection after
// responding". This server does; net/http serves the rest of the
// connection as further requests (accepted difference 4 of diff_test.go).
func TestAmbiguousFramingCloses(t *testing.T) {
	lean, std := startBoth(t, "tcp", func(string) string { return "127.0.0.1:0" }, 0)
	const h = "Host: x\r\n"
	const next = "GET /b HTTP/1.1\r\n" + h + "\r\n"
	for _, tt := range []struct{ name, raw, body string }{
		{"CL.TE", "POST /a HTTP/1.1\r\n" + h + "Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + next, ""},
		{"TE.CL", "POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\ncontent-length: 3\r\n\r\n1\r\nx\r\n0\r\n\r\n" + next, "x"},
		// net/http ignores Transfer-Encoding on HTTP/1.0 (issue 12785):
		// the body is empty and its chunks would be the next request.
		{"HTTP/1.0 with Transfer-Encoding", "POST /a HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n" + next, ""},
		{"HTTP/1.0 with both", "POST /a HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-encoding: chunked\r\nContent-Length: 0\r\n\r\n" + next, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			want := diffCall{Method: "POST", RequestURI: "/a", Body: tt.body}
			for _, srv := range []*diffServer{lean, std} {
				res := srv.exchange([]byte(tt.raw), "")
				require.False(t, res.TimedOut, srv.name)
				require.Empty(t, res.ParseErr, srv.name)
				require.NotEmpty(t, res.Calls, srv.name)
				got := diffCall{Method: res.Calls[0].Method, RequestURI: res.Calls[0].RequestURI, Body: res.Calls[0].Body}
				assert.Equal(t, want, got, srv.name)
				require.NotEmpty(t, res.Resps, srv.name)
				assert.Equal(t, http.StatusOK, res.Resps[0].Status, srv.name)
				if srv == std {
					assert.Len(t, res.Calls, 2, "net/http serves GET /b")
					continue
				}
				assert.Len(t, res.Calls, 1, "GET /b served after a request of ambiguous framing")
				assert.Len(t, res.Resps, 1, "statuses %s", statuses(res.Resps))
				assert.True(t, res.Resps[0].Close, "the answer does not announce the close")
			}
		})
	}
	// Transfer-Encoding alone on HTTP/1.1, Content-Length alone on
	// HTTP/1.0: the connection is kept.
	for _, raw := range []string{
		"POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + next,
		"POST /a HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\nx" + next,
	} {
		res := lean.exchange([]byte(raw), "")
		assert.Len(t, res.Calls, 2, "%q", raw)
	}
}

// Finding 3: a handler's field name that is not a token (CR LF in it: a
// field injected) is dropped, and CR or LF in a value becomes a space, as
// net/http does: the raw head of both servers has the same fields.
func TestResponseFieldsSanitized(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header()["X-A\r\nX-Injected"] = []string{"evil"}
		w.Header()["X B"] = []string{"1"}
		w.Header()["X-C:"] = []string{"1"}
		w.Header()["X-Ok"] = []string{"a\r\nX-Injected2: b"}
		w.Header()["X-Trim"] = []string{"  v\t"}
		w.WriteHeader(http.StatusOK)
		w.WriteHeader(http.StatusTeapot) // superfluous
	})
	rawHead := func(addr string) []string {
		conn := dialRaw(t, addr)
		defer conn.Close()
		_, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		require.NoError(t, err)
		raw, err := io.ReadAll(conn)
		require.NoError(t, err)
		head, _, ok := strings.Cut(string(raw), "\r\n\r\n")
		require.True(t, ok, "%q", raw)
		var lines []string
		for _, l := range strings.Split(head, "\r\n")[1:] {
			if !strings.HasPrefix(l, "Date: ") && !strings.HasPrefix(l, "Content-Type: ") {
				lines = append(lines, l)
			}
		}
		return lines
	}
	leanAddr, _ := startServer(t, h, Options{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := &http.Server{Handler: h}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })

	lean := rawHead(leanAddr)
	assert.ElementsMatch(t, []string{"X-Ok: a  X-Injected2: b", "X-Trim: v", "Content-Length: 0", "Connection: close"}, lean)
	assert.ElementsMatch(t, rawHead(ln.Addr().String()), lean, "net/http writes the same fields")
}

// Finding 5: a body that comes too slowly is cut off at ReadTimeout (from
// the head's first byte): the handler's read fails with a timeout and the
// connection is closed after the answer. A body in time is read whole.
func TestReadTimeoutCutsSlowBody(t *testing.T) {
	read := make(chan error, 1)
	addr, _ := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		read <- err
		if err != nil {
			w.WriteHeader(http.StatusRequestTimeout)
			return
		}
		_, _ = w.Write(b)
	}), Options{ReadTimeout: 200 * time.Millisecond})

	conn := dialRaw(t, addr)
	defer conn.Close()
	_, err := io.WriteString(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab")
	require.NoError(t, err)
	// The rest of the body never comes: the read must fail, not wait.
	select {
	case err := <-read:
		var ne net.Error
		require.True(t, errors.As(err, &ne) && ne.Timeout(), "body read error %v", err)
	case <-time.After(waitLimit):
		t.Fatal("a stalled body was not cut off")
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
	assert.True(t, resp.Close, "the connection is closed after a failed body")
	_, _ = io.ReadAll(resp.Body)
	_, err = br.ReadByte()
	assert.ErrorIs(t, err, io.EOF)

	// A body sent in time (the default ReadTimeout, a minute) is read
	// whole, over several writes.
	addr, _ = startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		read <- err
		_, _ = w.Write(b)
	}), Options{})
	conn2 := dialRaw(t, addr)
	defer conn2.Close()
	_, err = io.WriteString(conn2, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab")
	require.NoError(t, err)
	_, err = io.WriteString(conn2, "cd")
	require.NoError(t, err)
	require.NoError(t, <-read)
	resp, err = http.ReadResponse(bufio.NewReader(conn2), nil)
	require.NoError(t, err)
	assert.Equal(t, "abcd", string(readAll(t, resp)))
}

// manyFields returns n header fields of distinct names.
func manyFields(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString("X-Header-" + strconv.Itoa(i) + ": value\r\n")
	}
	return b.String()
}

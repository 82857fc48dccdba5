package httpclient

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// cannedEngine is a loopback server that answers each request with the
// bytes registered under the request's X-Case header, then closes the
// connection (so that an answer without a length ends).
type cannedEngine struct {
	l     net.Listener
	cases sync.Map // id → []byte
	next  atomic.Int64
	wg    sync.WaitGroup
}

func newCannedEngine(tb testing.TB) *cannedEngine {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	e := &cannedEngine{l: l}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				if b, ok := e.cases.Load(req.Header.Get("X-Case")); ok {
					_, _ = c.Write(b.([]byte))
				}
			}()
		}
	}()
	tb.Cleanup(func() {
		l.Close()
		e.wg.Wait()
	})
	return e
}

// outcome is what a client made of an answer: what the gateway reads of
// it.
type outcome struct {
	err           bool
	status        int
	proto         string
	header        http.Header
	contentLength int64
	close         bool
	te            []string
	body          string
	bodyErr       bool
	trailer       http.Header
}

func (o outcome) String() string {
	if o.err {
		return "error"
	}
	return fmt.Sprintf("%d %s header=%v length=%d close=%v te=%v body=%q bodyErr=%v trailer=%v",
		o.status, o.proto, o.header, o.contentLength, o.close, o.te, o.body, o.bodyErr, o.trailer)
}

// roundTrip sends a POST through rt to the engine, which answers raw, on a
// fresh connection.
func (e *cannedEngine) roundTrip(tb testing.TB, rt http.RoundTripper, raw []byte) outcome {
	tb.Helper()
	id := strconv.FormatInt(e.next.Add(1), 10)
	e.cases.Store(id, raw)
	defer e.cases.Delete(id)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const body = `{"model":"m","prompt":"hi"}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+e.l.Addr().String()+"/v1/completions", strings.NewReader(body))
	require.NoError(tb, err)
	req.Header.Set("X-Case", id)
	req.Header.Set("Content-Type", "application/json")
	resp, err := rt.RoundTrip(req)
	if ctx.Err() != nil {
		tb.Fatalf("answer %q: the round trip hung", raw)
	}
	if err != nil {
		return outcome{err: true}
	}
	defer resp.Body.Close()
	o := outcome{status: resp.StatusCode, proto: resp.Proto, header: resp.Header, contentLength: resp.ContentLength,
		close: resp.Close, te: resp.TransferEncoding}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// http.Transport hands over the raw connection as the body of a
		// protocol switch; a Pool gives none (the gateway fails a 101).
		return o
	}
	b, err := io.ReadAll(resp.Body)
	if ctx.Err() != nil {
		tb.Fatalf("answer %q: reading the body hung", raw)
	}
	o.body, o.bodyErr, o.trailer = string(b), err != nil, resp.Trailer
	return o
}

// compareWithTransport checks that a Pool and http.Transport, configured
// alike, make the same of the engine answer raw.
func compareWithTransport(tb testing.TB, e *cannedEngine, raw []byte) {
	tb.Helper()
	p := New(Options{})
	tr := NewTransport(0)
	defer p.CloseIdleConnections()
	defer tr.CloseIdleConnections()
	got := e.roundTrip(tb, p, raw)
	want := e.roundTrip(tb, tr, raw)
	if got.String() != want.String() {
		tb.Fatalf("answer %q:\n Pool           %v\n http.Transport %v", raw, got, want)
	}
}

// engineAnswers are answers engines give, and malformed ones.
var engineAnswers = []string{
	// Common answers (the Pool's fast path).
	"HTTP/1.1 200 OK\r\nServer: fasthttp\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\nhello",
	"HTTP/1.1 200 OK\r\ndate: Sun, 29 Nov 2026 10:13:09 GMT\r\nserver: uvicorn\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}",
	"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nRetry-After: 1\r\n\r\nbusy",
	"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nX-Empty:\r\nX-Pad: \t v \t\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok and more bytes",
	// Streams and other framings.
	"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata:\n\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n1\r\na\r\n0\r\nX-T: v\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n\r\n1\r\na\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n1\r\na\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;ext=v\r\na\r\n1 ; q=\"x\"\r\nb\r\n0;last\r\nX-T: v\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n1\r\na\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Length: 002\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Length: 2 \r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive, close\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX: a\x00b\r\n\r\nok",
	"HTTP/1.1  200 OK\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\n\tX: v\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 103 Early Hints\r\nContent-Length: 3\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil close",
	"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.0 200 OK\r\n\r\nuntil close",
	"HTTP/1.1 204 No Content\r\n\r\n",
	"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n",
	"HTTP/1.1 200 OK\r\nPragma: no-cache\r\nContent-Length: 1\r\n\r\nx",
	// Interim answers.
	"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
	strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", 5) + "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
	strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", 6) + "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 100 Continue\r\n\r\n",
	"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\nraw",
	"HTTP/1.1 199 Whatever\r\nContent-Length: 3\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
	// Malformed.
	"",
	"HTTP/1.1 200 OK\r\nContent-Le",
	"HTTP/1.1 2x0 OK\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Length: -2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
	"HTTP/1.1 200 OK\r\nX-Long: a\r\n b\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nBad Name: v\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nX-Name: é\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
	"HTTP/2.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 1000 OK\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 099 OK\r\nContent-Length: 2\r\n\r\nok",
	"ICY 200 OK\r\n\r\nok",
	"garbage\r\n\r\n",
}

// A Pool makes the same of each answer as http.Transport: the same
// failures, and otherwise the same status, headers, framing and body.
func TestPoolMatchesTransport(t *testing.T) {
	e := newCannedEngine(t)
	for i, raw := range engineAnswers {
		t.Run(strconv.Itoa(i), func(t *testing.T) { compareWithTransport(t, e, []byte(raw)) })
	}
}

// FuzzPoolMatchesTransport runs TestPoolMatchesTransport's comparison on
// answers the fuzzer mutates from engineAnswers.
func FuzzPoolMatchesTransport(f *testing.F) {
	for _, raw := range engineAnswers {
		f.Add([]byte(raw))
	}
	e := newCannedEngine(f)
	f.Fuzz(func(t *testing.T, raw []byte) {
		if len(raw) > 64<<10 {
			return // beyond the head limit the read pattern decides
		}
		compareWithTransport(t, e, raw)
	})
}

// The response heads of a request, interim ones included, are bounded as
// http.Transport bounds them: a head of exactly the limit passes, one
// byte more fails with ErrResponseHeaderTooLarge.
func TestPoolHeaderLimit(t *testing.T) {
	const limit = 256
	e := newCannedEngine(t)
	head := func(n int, prefix string) []byte {
		// A head of exactly n bytes, after prefix (interim answers).
		const start, end = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Pad: ", "\r\n\r\n"
		return []byte(prefix + start + strings.Repeat("p", n-len(prefix)-len(start)-len(end)) + end + "ok")
	}
	interim := "HTTP/1.1 100 Continue\r\n\r\n"
	for _, tt := range []struct {
		name string
		raw  []byte
		ok   bool
	}{
		{"at the limit", head(limit, ""), true},
		{"one byte over", head(limit+1, ""), false},
		{"interim answers count", head(limit, interim), true},
		{"interim answers count, over", head(limit+1, interim), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := New(Options{MaxResponseHeaderBytes: limit})
			defer p.CloseIdleConnections()
			tr := NewTransport(limit)
			defer tr.CloseIdleConnections()
			got, want := e.roundTrip(t, p, tt.raw), e.roundTrip(t, tr, tt.raw)
			require.Equal(t, want.String(), got.String(), "Pool and http.Transport")
			require.Equal(t, !tt.ok, got.err)
		})
	}
	// The error names the cause.
	p := New(Options{MaxResponseHeaderBytes: limit})
	defer p.CloseIdleConnections()
	id := strconv.FormatInt(e.next.Add(1), 10)
	e.cases.Store(id, head(limit+1, ""))
	req, err := http.NewRequest(http.MethodGet, "http://"+e.l.Addr().String()+"/", nil)
	require.NoError(t, err)
	req.Header.Set("X-Case", id)
	_, err = p.RoundTrip(req)
	require.ErrorIs(t, err, ErrResponseHeaderTooLarge)
	require.Contains(t, err.Error(), "256 bytes")
}

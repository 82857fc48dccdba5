package httpclient

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// closeCounter counts Close calls on a request body.
type closeCounter struct {
	io.Reader
	closed int
}

func (c *closeCounter) Close() error { c.closed++; return nil }

// TestWriteRequestMatchesRequestWrite checks that writeRequest sends what
// req.Write sends, as an HTTP server reads it: method, target, host,
// headers (in any order), length and body; and that it takes the fast path
// only for the requests it handles itself (the others are byte for byte
// req.Write's).
func TestWriteRequestMatchesRequestWrite(t *testing.T) {
	body := `{"model":"m1","prompt":"hi"}`
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Add(kv[i], kv[i+1])
		}
		return h
	}
	for _, tc := range []struct {
		name   string
		method string
		url    string
		host   string
		header http.Header
		body   string
		cl     int64 // -1: unknown
		close  bool
		simple bool
	}{
		{"post", "POST", "http://127.0.0.1:8000/v1/chat/completions", "", hdr("Content-Type", "application/json", "X-Session-ID", "s1"), body, int64(len(body)), false, true},
		{"post with query", "POST", "http://127.0.0.1:8000/v1/completions?x=1&y=%20", "", hdr("Content-Type", "application/json"), body, int64(len(body)), false, true},
		{"user agent kept", "POST", "http://e:80/v1/completions", "", hdr("User-Agent", "curl/8"), body, int64(len(body)), false, true},
		{"empty user agent", "POST", "http://e:80/v1/completions", "", hdr("User-Agent", ""), body, int64(len(body)), false, true},
		{"multi-valued headers", "POST", "http://e:80/v1/completions", "", hdr("Accept", "a", "Accept", "b", "X-Trim", "  v \t"), body, int64(len(body)), false, true},
		{"excluded headers", "POST", "http://e:80/v1/completions", "", hdr("Host", "other", "Content-Length", "9", "Trailer", "x"), body, int64(len(body)), false, true},
		{"explicit host", "POST", "http://127.0.0.1:8000/v1/completions", "engine.local:8000", nil, body, int64(len(body)), false, true},
		{"get", "GET", "http://127.0.0.1:8000/health", "", nil, "", 0, false, true},
		{"empty post", "POST", "http://127.0.0.1:8000/v1/completions", "", nil, "", 0, false, true},
		{"unknown length", "POST", "http://e:80/v1/completions", "", nil, body, -1, false, false},
		{"close", "POST", "http://e:80/v1/completions", "", nil, body, int64(len(body)), true, false},
		{"non-ascii header", "POST", "http://e:80/v1/completions", "", hdr("X-Session-ID", "sésame"), body, int64(len(body)), false, false},
		{"line break in header", "POST", "http://e:80/v1/completions", "", hdr("X-Bad", "a\r\nX-Injected: 1"), body, int64(len(body)), false, false},
		{"bad header name", "POST", "http://e:80/v1/completions", "", hdr("Bad Name", "v"), body, int64(len(body)), false, false},
		{"put", "PUT", "http://e:80/x", "", nil, body, int64(len(body)), false, false},
		{"ipv6 zone", "POST", "http://[fe80::1%25eth0]:80/v1/completions", "", nil, body, int64(len(body)), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			build := func() (*http.Request, *closeCounter) {
				req, err := http.NewRequest(tc.method, tc.url, nil)
				require.NoError(t, err)
				if tc.header != nil {
					req.Header = tc.header.Clone()
				}
				req.Host = tc.host
				if tc.host == "" {
					req.Host = req.URL.Host
				}
				req.Close = tc.close
				var cc *closeCounter
				if tc.body != "" {
					cc = &closeCounter{Reader: strings.NewReader(tc.body)}
					req.Body = cc
				}
				req.ContentLength = tc.cl
				return req, cc
			}
			req, _ := build()
			assert.Equal(t, tc.simple, simpleRequest(req), "simpleRequest")

			var mine, std bytes.Buffer
			req, cc := build()
			bw := bufio.NewWriter(&mine)
			require.NoError(t, writeRequest(bw, req))
			require.NoError(t, bw.Flush())
			if cc != nil {
				assert.Equal(t, 1, cc.closed, "body closed")
			}
			req, _ = build()
			require.NoError(t, req.Write(&std))
			if !tc.simple {
				assert.Equal(t, std.String(), mine.String())
				return
			}
			got, err := http.ReadRequest(bufio.NewReader(&mine))
			require.NoError(t, err, "%q", mine.String())
			want, err := http.ReadRequest(bufio.NewReader(&std))
			require.NoError(t, err)
			assert.Equal(t, want.Method, got.Method)
			assert.Equal(t, want.RequestURI, got.RequestURI)
			assert.Equal(t, want.Host, got.Host)
			assert.Equal(t, want.Header, got.Header)
			assert.Equal(t, want.ContentLength, got.ContentLength)
			assert.Equal(t, want.TransferEncoding, got.TransferEncoding)
			gb, err := io.ReadAll(got.Body)
			require.NoError(t, err)
			wb, err := io.ReadAll(want.Body)
			require.NoError(t, err)
			assert.Equal(t, string(wb), string(gb))
		})
	}
}

func TestWriteRequestBodyLength(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		cl   int64
	}{
		{"short body", "abc", 5},
		{"long body", "abcdefg", 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1:8000/v1/completions", nil)
			require.NoError(t, err)
			req.Body = io.NopCloser(strings.NewReader(tc.body))
			req.ContentLength = tc.cl
			err = writeRequest(bufio.NewWriter(io.Discard), req)
			assert.ErrorIs(t, err, errBodyLength)
		})
	}
}

// FuzzWriteRequest compares writeRequest with req.Write on requests with
// fuzzed targets, headers and bodies: an HTTP server reads the same
// request from both (or the fast path declined and the bytes are
// req.Write's).
func FuzzWriteRequest(f *testing.F) {
	f.Add("v1/chat/completions", "X-Session-ID", "s1", []byte(`{"model":"m"}`))
	f.Add("v1/completions?x=1&y=%20", "content-type", "application/json", []byte("{}"))
	f.Add("a b", "Bad Name", "v", []byte("x"))
	f.Add("x", "X-Bad", "a\r\nX-Injected: 1", []byte(""))
	f.Add("é", "X-Name", "sésame", []byte("body"))
	f.Add("%zz", "User-Agent", "", []byte(nil))
	f.Fuzz(func(t *testing.T, path, name, value string, body []byte) {
		build := func() *http.Request {
			req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1:8000/"+path, bytes.NewReader(body))
			if err != nil {
				return nil
			}
			req.Header[name] = []string{value}
			return req
		}
		if build() == nil {
			return
		}
		var mine, std bytes.Buffer
		bw := bufio.NewWriter(&mine)
		merr := writeRequest(bw, build())
		_ = bw.Flush()
		serr := build().Write(&std)
		if (merr == nil) != (serr == nil) {
			t.Fatalf("writeRequest error %v, req.Write error %v", merr, serr)
		}
		if merr != nil || !simpleRequest(build()) {
			if mine.String() != std.String() {
				t.Fatalf("not the fast path, yet\n%q\n%q", mine.String(), std.String())
			}
			return
		}
		got, gerr := http.ReadRequest(bufio.NewReader(&mine))
		want, werr := http.ReadRequest(bufio.NewReader(&std))
		if (gerr == nil) != (werr == nil) {
			t.Fatalf("server reads writeRequest's with error %v, req.Write's with %v:\n%q\n%q", gerr, werr, mine.String(), std.String())
		}
		if gerr != nil {
			return
		}
		gb, _ := io.ReadAll(got.Body)
		wb, _ := io.ReadAll(want.Body)
		if got.Method != want.Method || got.RequestURI != want.RequestURI || got.Host != want.Host ||
			fmt.Sprint(got.Header) != fmt.Sprint(want.Header) || got.ContentLength != want.ContentLength || string(gb) != string(wb) {
			t.Fatalf("requests differ:\n%q\n%q", mine.String(), std.String())
		}
	})
}

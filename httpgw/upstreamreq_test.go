package httpgw

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
)

// writeCounter counts the writes it receives.
type writeCounter struct {
	n   int
	buf []byte
}

func (w *writeCounter) Write(p []byte) (int, error) {
	w.n++
	w.buf = append(w.buf, p...)
	return len(p), nil
}

// TestUpstreamRequest checks the request forwarded to an engine: the URL
// is the engine's base followed by the client's path and query, the body
// can be read again for a resend, and the head and the body reach the
// connection in one write (as the connection pool sends it: through a
// buffered writer, then one flush), not the head flushed first.
func TestUpstreamRequest(t *testing.T) {
	body := []byte(`{"model":"m1","prompt":"hi"}`)
	for _, tc := range []struct {
		name, base, uri string
		hostOnly        bool // the base is scheme and host only
	}{
		{"host only", "http://127.0.0.1:8000", "/v1/chat/completions", true},
		{"host name", "http://engine-0.local:8000", "/v1/completions", true},
		{"ipv6", "http://[::1]:8000", "/v1/completions", true},
		{"query", "http://127.0.0.1:8000", "/v1/completions?debug=1", true},
		{"base path", "http://127.0.0.1:8000/prefix", "/v1/chat/completions", false},
		{"https", "https://engine.example:443", "/v1/chat/completions", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ep := fleet.NewEndpoint(tc.base)
			assert.Equal(t, tc.hostOnly, ep.HostOnly != nil, "hostOnly")
			u, err := url.ParseRequestURI(tc.uri)
			require.NoError(t, err)
			out, err := upstreamRequest(context.Background(), ep, u, body)
			require.NoError(t, err)
			assert.Equal(t, tc.base+tc.uri, out.URL.String())
			assert.Equal(t, http.MethodPost, out.Method)
			assert.Equal(t, int64(len(body)), out.ContentLength)
			want, err := http.NewRequest(http.MethodPost, tc.base+tc.uri, nil)
			require.NoError(t, err)
			assert.Equal(t, want.Host, out.Host)

			w := &writeCounter{}
			bw := bufio.NewWriterSize(w, 16<<10)
			require.NoError(t, out.Write(bw))
			require.NoError(t, bw.Flush())
			assert.Equal(t, 1, w.n, "writes reaching the connection")
			assert.Contains(t, string(w.buf), "\r\n\r\n"+string(body))

			rc, err := out.GetBody()
			require.NoError(t, err)
			again, err := io.ReadAll(rc)
			require.NoError(t, err)
			assert.Equal(t, body, again)
		})
	}
}

func TestUpstreamRequestBadAddress(t *testing.T) {
	ep := fleet.NewEndpoint("http://bad host:80")
	assert.Nil(t, ep.HostOnly)
	_, err := upstreamRequest(context.Background(), ep, &url.URL{Path: "/v1/completions"}, []byte("{}"))
	assert.Error(t, err)
}

func TestCopyHeadersDropsHopHeaders(t *testing.T) {
	src := http.Header{
		"Content-Type":      {"application/json"},
		"Connection":        {"keep-alive, X-Private"},
		"X-Private":         {"secret"},
		"Keep-Alive":        {"timeout=5"},
		"Transfer-Encoding": {"chunked"},
		"te":                {"trailers"}, // set by hand, not canonical
		"X-Multi":           {"a", "b"},
	}
	dst := http.Header{}
	copyHeaders(dst, src)
	assert.Equal(t, http.Header{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}}, dst)
	dst["X-Multi"] = append(dst["X-Multi"], "c")
	assert.Equal(t, []string{"application/json"}, dst["Content-Type"], "values do not share capacity")
	assert.Equal(t, []string{"a", "b"}, src["X-Multi"], "source untouched")
}

// A header named in any Connection field line is hop-by-hop (RFC 9110
// 7.6.1: Connection may be sent as several lines, as net/http's server
// keeps them), not only in the first.
func TestCopyHeadersDropsHeadersOfEveryConnectionLine(t *testing.T) {
	src := http.Header{
		"Connection": {"keep-alive", "X-Private, X-Other"},
		"X-Private":  {"secret"},
		"X-Other":    {"o"},
		"X-Kept":     {"k"},
	}
	dst := http.Header{}
	copyHeaders(dst, src)
	assert.Equal(t, http.Header{"X-Kept": {"k"}}, dst)
}

func TestIsHopHeader(t *testing.T) {
	for _, tt := range []struct {
		key string
		hop bool
	}{
		{"Connection", true}, {"connection", true}, {"TRANSFER-ENCODING", true}, {"te", true}, {"Te", true},
		{"Proxy-Authorization", true}, {"Content-Type", false}, {"X-Te", false}, {"Tee", false}, {"", false},
	} {
		t.Run(tt.key, func(t *testing.T) {
			assert.Equal(t, tt.hop, isHopHeader(tt.key))
		})
	}
	allocs := testing.AllocsPerRun(10, func() { isHopHeader("Content-Type"); isHopHeader("Keep-Alive") })
	assert.Zero(t, allocs, "a canonical key is checked without allocating")
}

// The gateway sends a complete answer as soon as the engine's body ends,
// without changing how it is framed: with the engine's Content-Length when
// it gave one; otherwise net/http frames it once the handler returns (a
// small answer gets a Content-Length), not chunked by an early flush.
func TestAnswerFraming(t *testing.T) {
	answer := `{"id":"x","choices":[{"index":0,"text":"ok"}]}`
	for _, tc := range []struct {
		name    string
		length  bool // the engine declares Content-Length
		wantLen int64
	}{
		{"content length", true, int64(len(answer))},
		{"chunked", false, int64(len(answer))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/json")
				if tc.length {
					w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
				}
				_, _ = io.WriteString(w, answer[:10])
				if !tc.length {
					w.(http.Flusher).Flush() // forces chunked encoding
				}
				_, _ = io.WriteString(w, answer[10:])
			}))
			reg := prometheus.NewRegistry()
			s, err := New(Options{Registerer: reg, Gatherer: reg, Logger: quietLogger()})
			require.NoError(t, err)
			require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {
				Mode: gateway.ModeRoundRobin, Replicas: []config.Replica{{Name: "e0", Address: eng.URL}}}}}))
			gw := newHTTPTestServer(t, s)
			resp, err := http.Post(gw.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"m1","prompt":"hi"}`))
			require.NoError(t, err)
			b := readAll(t, resp)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, answer, string(b))
			assert.Equal(t, tc.wantLen, resp.ContentLength)
		})
	}
}

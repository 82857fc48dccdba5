package httpgw

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/examlops/gateway"

	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/keys"
	"github.com/prometheus/client_golang/prometheus"
)

// benchEngine answers every inference request with a fixed small body, so
// that a benchmark through the gateway measures the gateway.
func benchEngine() *httptest.Server {
	answer := []byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}`)
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
	}))
}

// benchServer returns a gateway serving model m1 in cache-aware mode from
// one replica at addr, through transport (nil: the default).
func benchServer(b *testing.B, transport http.RoundTripper, addr string) *Server {
	b.Helper()
	reg := prometheus.NewRegistry()
	s, err := New(Options{Registerer: reg, Gatherer: reg, Logger: quietLogger(), Transport: transport})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Apply(&config.File{Version: 1, Models: map[string]config.Model{"m1": {Mode: gateway.ModeCacheAware,
		Replicas: []config.Replica{{Name: "e0", Address: addr}}}}}); err != nil {
		b.Fatal(err)
	}
	return s
}

var benchBody = []byte(`{"model":"m1","max_tokens":1,"messages":[{"role":"system","content":"You are a terse assistant that answers in one word."},{"role":"user","content":"Say one word."}]}`)

func benchCall(b *testing.B, c *http.Client, url string) {
	resp, err := c.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(benchBody))
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("status %d", resp.StatusCode)
	}
}

// BenchmarkRequest compares one request sent straight to an engine with
// one sent through the gateway (both on loopback, in process); the
// difference between the two is the gateway's cost per request.
func BenchmarkRequest(b *testing.B) {
	eng := benchEngine()
	defer eng.Close()
	s := benchServer(b, nil, eng.URL)
	gw := httptest.NewServer(s)
	defer gw.Close()
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8, DisableCompression: true}}
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			benchCall(b, c, eng.URL)
		}
	})
	b.Run("gateway", func(b *testing.B) {
		for b.Loop() {
			benchCall(b, c, gw.URL)
		}
	})
}

// BenchmarkHandler measures the gateway's handler alone (parse, key,
// route, forward to a loopback engine, relay), without the client's hop.
func BenchmarkHandler(b *testing.B) {
	eng := benchEngine()
	defer eng.Close()
	s := benchServer(b, nil, eng.URL)
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(benchBody))
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			b.Fatalf("status %d", w.Code)
		}
	}
}

// BenchmarkParseAndKey measures request decoding and prefix-key hashing
// for a chat with a 16 KiB system prompt and a few turns.
func BenchmarkParseAndKey(b *testing.B) {
	sys := strings.Repeat("You are a helpful assistant for the ACME corporation. ", 300)
	body := []byte(chatBody("m1", false, sys, "first question about the contract terms?", "an answer that is fairly long and detailed", "a follow-up question"))
	h, err := keys.NewHasher(keys.TextBlockBytes)
	if err != nil {
		b.Fatal(err)
	}
	hdr := http.Header{}
	key := make(gateway.Key, 0, 512)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		req, err := parseRequest(endpointChat, body)
		if err != nil {
			b.Fatal(err)
		}
		key = appendKey(h, key[:0], req, hdr)
	}
}

// cannedTransport answers every request with a fixed response, without a
// network, so that BenchmarkHandlerCPU measures the handler's own work.
type cannedTransport struct{ body []byte }

func (c cannedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	_, _ = io.Copy(io.Discard, r.Body)
	return &http.Response{StatusCode: http.StatusOK, ProtoMajor: 1, ProtoMinor: 1, ContentLength: int64(len(c.body)),
		Header: http.Header{"Content-Type": {"application/json"}, "Content-Length": {strconv.Itoa(len(c.body))}},
		Body:   io.NopCloser(bytes.NewReader(c.body)), Request: r}, nil
}

// BenchmarkHandlerCPU measures the handler's own work per request (parse,
// key, route, metrics, headers, relay) with an engine transport that
// answers from memory: the gateway's cost beyond any proxy's hop.
func BenchmarkHandlerCPU(b *testing.B) {
	answer := []byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
	s := benchServer(b, cannedTransport{answer}, "http://127.0.0.1:9")
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "Go-http-client/1.1")
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		req.Body = io.NopCloser(bytes.NewReader(benchBody))
		clear(w.h)
		w.code = 0
		s.ServeHTTP(w, req)
		if w.code != http.StatusOK {
			b.Fatalf("status %d", w.code)
		}
	}
}

// discardWriter is a reusable http.ResponseWriter that drops the body.
type discardWriter struct {
	h    http.Header
	code int
}

func (w *discardWriter) Header() http.Header { return w.h }
func (w *discardWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}
func (w *discardWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return len(p), nil
}

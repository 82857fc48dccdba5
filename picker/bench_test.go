package picker

import (
	"context"
	"io"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// The request and answer of httpgw's benchmarks (httpgw/bench_test.go), so
// that the picker's cost per request compares with the HTTP gateway's.
var (
	benchBody   = []byte(`{"model":"m1","max_tokens":1,"messages":[{"role":"system","content":"You are a terse assistant that answers in one word."},{"role":"user","content":"Say one word."}]}`)
	benchAnswer = []byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}`)
)

// benchMessages is Envoy's side of one exchange: request headers as a
// typical Envoy sends them, the body in one chunk, response headers, the
// response body in one chunk.
func benchMessages() []*extprocv3.ProcessingRequest {
	return []*extprocv3.ProcessingRequest{
		reqHeaders(false, nil, ":authority", "gateway.example", ":path", "/v1/chat/completions", ":method", "POST",
			":scheme", "http", "content-type", "application/json", "content-length", "166", "user-agent", "Go-http-client/1.1",
			"accept-encoding", "gzip", "x-forwarded-proto", "http", "x-request-id", "3c0d2b8e-8a7f-4f1e-9c55-0c1f2a9d7e10"),
		reqBody(benchBody, true),
		respHeaders(false, ":status", "200", "content-type", "application/json", "content-length", "190",
			"date", "Mon, 01 Dec 2025 00:00:00 GMT", "server", "uvicorn"),
		respBody(benchAnswer, true),
	}
}

// BenchmarkPicker measures one whole exchange (request headers, body,
// response headers, response body, stream end) over an in-process gRPC
// connection (bufconn), routed by a GatewayRouter over one cache-aware
// replica, as httpgw's BenchmarkHandler routes. Time and allocations
// include both ends of the gRPC stream (the Envoy side is this Go client)
// and the HTTP/2 framing between them.
func BenchmarkPicker(b *testing.B) {
	gw := newGateway(b, 1)
	h := startPicker(b, newRouter(b, gw, 0), Options{})
	msgs := benchMessages()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		st, err := h.client.Process(ctx)
		if err != nil {
			b.Fatal(err)
		}
		for i, want := range []int{0, 2, 1, 1} { // answers expected after each message
			if err := st.Send(msgs[i]); err != nil {
				b.Fatal(err)
			}
			for range want {
				m, err := st.Recv()
				if err != nil {
					b.Fatal(err)
				}
				if m.GetImmediateResponse() != nil {
					b.Fatalf("immediate response %v", m)
				}
			}
		}
		if err := st.CloseSend(); err != nil {
			b.Fatal(err)
		}
		if _, err := st.Recv(); err != io.EOF {
			b.Fatalf("stream end: %v", err)
		}
	}
	if fl := inFlight(gw); fl[0] != 0 {
		b.Fatalf("in flight %v", fl)
	}
}

// BenchmarkPickerCPU measures the picker's own work per exchange without
// gRPC: the same messages served from memory (header copying, body
// accumulation, BodyKey's encoding/json decode, routing, building the
// answers), as httpgw's BenchmarkHandlerCPU measures the handler's own.
func BenchmarkPickerCPU(b *testing.B) {
	gw := newGateway(b, 1)
	s, err := New(newRouter(b, gw, 0), Options{})
	if err != nil {
		b.Fatal(err)
	}
	msgs := benchMessages()
	st := &memStream{ctx: context.Background()}
	b.ReportAllocs()
	for b.Loop() {
		st.msgs, st.sent = msgs, st.sent[:0]
		if err := s.serve(st); err != nil {
			b.Fatal(err)
		}
		if len(st.sent) != 4 || st.sent[0].GetRequestHeaders() == nil {
			b.Fatalf("answers %v", st.sent)
		}
	}
}

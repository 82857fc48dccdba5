package fleetpick

import (
	"context"
	"io"
	"net"
	"strconv"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/picker"
	"github.com/examlops/gateway/picker/pickertest"
)

// The picker's cost per request, beside the HTTP gateway's
// (httpgw/bench_test.go: BenchmarkHandler, BenchmarkHandlerCPU): the same
// model (m1, cache-aware, one replica), the same request body and answer,
// routed by the Router over a fleet. Run them taking turns, as
// docs/picker.md ("Cost") shows, and compare with benchstat.

// benchAnswer is the engine's answer, as benchEngine sends it.
var benchAnswer = []byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}`)

// benchExchange is Envoy's side of one exchange: request headers as a
// typical Envoy sends them, the body in one chunk, response headers, the
// response body in one chunk (picker/bench_test.go sends the same).
func benchExchange() []*extprocv3.ProcessingRequest {
	return []*extprocv3.ProcessingRequest{
		pickertest.RequestHeaders(false, nil, ":authority", "gateway.example", ":path", "/v1/chat/completions", ":method", "POST",
			":scheme", "http", "content-type", "application/json", "content-length", strconv.Itoa(len(benchBody)), "user-agent", "Go-http-client/1.1",
			"accept-encoding", "gzip", "x-forwarded-proto", "http", "x-request-id", "3c0d2b8e-8a7f-4f1e-9c55-0c1f2a9d7e10"),
		pickertest.RequestBody(benchBody, true),
		pickertest.ResponseHeaders(false, ":status", "200", "content-type", "application/json", "content-length", strconv.Itoa(len(benchAnswer)),
			"date", "Mon, 01 Dec 2025 00:00:00 GMT", "server", "uvicorn"),
		pickertest.ResponseBody(benchAnswer, true),
	}
}

// benchAnswers is how many answers the picker sends after each message.
var benchAnswers = []int{0, 2, 1, 1}

// benchPicker returns the ext_proc server over a fleet serving m1 from
// one replica (nothing listens there: the picker only names it).
func benchPicker(b *testing.B) (*fleet.Fleet, *picker.Server) {
	s := pickServer(b, gateway.ModeCacheAware, "http://127.0.0.1:9")
	r, err := New(s, Options{})
	if err != nil {
		b.Fatal(err)
	}
	pk, err := picker.New(r, picker.Options{})
	if err != nil {
		b.Fatal(err)
	}
	return s, pk
}

// BenchmarkPicker measures one whole exchange (request headers, body,
// response headers, response body, stream end) over an in-process gRPC
// connection (bufconn): parse, key, route, answers, and the response
// phase's bookkeeping (first token, done, metrics). Time and allocations
// include both ends of the gRPC stream (the Envoy side is a Go client)
// and the HTTP/2 framing between them; Envoy's own cost, and its hop to
// the engine, are not in it.
func BenchmarkPicker(b *testing.B) {
	s, pk := benchPicker(b)
	lis := bufconn.Listen(1 << 20)
	g := grpc.NewServer()
	pk.Register(g)
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := extprocv3.NewExternalProcessorClient(conn)
	msgs := benchExchange()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		st, err := client.Process(ctx)
		if err != nil {
			b.Fatal(err)
		}
		for i, want := range benchAnswers {
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
	b.StopTimer()
	benchCheckIdle(b, s)
}

// memProcess is an ext_proc server stream served from memory, so that
// BenchmarkPickerCPU measures the picker without gRPC.
type memProcess struct {
	grpc.ServerStream // not used: the picker calls only the methods below
	ctx               context.Context
	msgs              []*extprocv3.ProcessingRequest
	sent              int
}

func (m *memProcess) Context() context.Context { return m.ctx }
func (m *memProcess) Recv() (*extprocv3.ProcessingRequest, error) {
	if len(m.msgs) == 0 {
		return nil, io.EOF
	}
	r := m.msgs[0]
	m.msgs = m.msgs[1:]
	return r, nil
}
func (m *memProcess) Send(*extprocv3.ProcessingResponse) error { m.sent++; return nil }

// BenchmarkPickerCPU measures the picker's own work per exchange, the same
// messages served from memory: header copying, body accumulation, the
// HTTP gateway's parsing and key, routing, the answers, the response
// phase's bookkeeping (the counterpart of BenchmarkHandlerCPU).
func BenchmarkPickerCPU(b *testing.B) {
	s, pk := benchPicker(b)
	msgs := benchExchange()
	st := &memProcess{ctx: context.Background()}
	b.ReportAllocs()
	for b.Loop() {
		st.msgs, st.sent = msgs, 0
		if err := pk.Process(st); err != nil {
			b.Fatal(err)
		}
		if st.sent != 4 {
			b.Fatalf("%d answers, want 4", st.sent)
		}
	}
	b.StopTimer()
	benchCheckIdle(b, s)
}

// BenchmarkPickerPick measures the Router alone: Pick, FirstToken, Done.
func BenchmarkPickerPick(b *testing.B) {
	s := pickServer(b, gateway.ModeCacheAware, "http://127.0.0.1:9")
	r, err := New(s, Options{})
	if err != nil {
		b.Fatal(err)
	}
	req := &picker.PickRequest{Method: "POST", Path: "/v1/chat/completions", Body: benchBody,
		Header: picker.Headers{{Name: "content-type", Value: "application/json"}, {Name: "x-request-id", Value: "3c0d2b8e"}}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		p, err := r.Pick(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		p.Tracker.FirstToken()
		p.Tracker.Done(picker.Outcome{Status: 200})
	}
	b.StopTimer()
	benchCheckIdle(b, s)
}

// benchCheckIdle fails the benchmark if a request's load was not released.
func benchCheckIdle(b *testing.B, s *fleet.Fleet) {
	for _, r := range s.Snapshot().Models["m1"].Gateway.Replicas() {
		if r.InFlight != 0 {
			b.Fatalf("replica %s: %d in flight", r.Name, r.InFlight)
		}
	}
}

var benchBody = []byte(`{"model":"m1","max_tokens":1,"messages":[{"role":"system","content":"You are a terse assistant that answers in one word."},{"role":"user","content":"Say one word."}]}`)

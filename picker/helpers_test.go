package picker

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/keys"
)

// endpointN is the endpoint of test replica i.
func endpointN(i int) string { return fmt.Sprintf("10.0.0.%d:8000", i+1) }

// newGateway returns a cache-aware gateway over n replicas r0..r{n-1} at
// http://10.0.0.{i+1}:8000. Nothing listens there: the picker only names
// endpoints.
func newGateway(t testing.TB, n int, opts ...gateway.Option) *gateway.Gateway {
	t.Helper()
	reps := make([]gateway.Replica, n)
	for i := range reps {
		reps[i] = gateway.Replica{Name: fmt.Sprintf("r%d", i), Address: "http://" + endpointN(i)}
	}
	gw, err := gateway.New(reps, append(opts, gateway.WithMode(gateway.ModeCacheAware))...)
	if err != nil {
		t.Fatal(err)
	}
	return gw
}

// newRouter returns a GatewayRouter over gw keyed by BodyKey (model m1).
func newRouter(t testing.TB, gw *gateway.Gateway, fallbacks int) *GatewayRouter {
	t.Helper()
	key, err := BodyKey(keys.TextBlockBytes, "m1")
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewGatewayRouter(gw, key, fallbacks)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// harness is a picker served over an in-process gRPC connection (bufconn).
type harness struct {
	srv    *Server
	conn   *grpc.ClientConn
	client extprocv3.ExternalProcessorClient
}

func startPicker(t testing.TB, r Router, opts Options) *harness {
	t.Helper()
	srv, err := New(r, opts)
	if err != nil {
		t.Fatal(err)
	}
	lis := bufconn.Listen(1 << 20)
	g := grpc.NewServer()
	srv.Register(g)
	go func() { _ = g.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		g.Stop()
	})
	return &harness{srv: srv, conn: conn, client: extprocv3.NewExternalProcessorClient(conn)}
}

// envoy plays Envoy's side of one ext_proc stream.
type envoy struct {
	t      testing.TB
	stream extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
}

func (h *harness) open(t testing.TB) *envoy {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	st, err := h.client.Process(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(cancel)
	return &envoy{t: t, stream: st, cancel: cancel}
}

func (e *envoy) send(m *extprocv3.ProcessingRequest) {
	e.t.Helper()
	if err := e.stream.Send(m); err != nil {
		e.t.Fatalf("send: %v", err)
	}
}

func (e *envoy) recv() *extprocv3.ProcessingResponse {
	e.t.Helper()
	m, err := e.stream.Recv()
	if err != nil {
		e.t.Fatalf("recv: %v", err)
	}
	return m
}

// hdrs builds an Envoy header map; name/value pairs, values as raw_value
// as Envoy sends them by default.
func hdrs(kv ...string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return m
}

func reqHeaders(eos bool, md *corev3.Metadata, kv ...string) *extprocv3.ProcessingRequest {
	if len(kv) == 0 {
		kv = []string{":method", "POST", ":path", "/v1/chat/completions", ":authority", "gw", ":scheme", "http",
			"content-type", "application/json", "x-request-id", "rid"}
	}
	return &extprocv3.ProcessingRequest{
		Request:         &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs(kv...), EndOfStream: eos}},
		MetadataContext: md,
	}
}

func reqBody(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

func respHeaders(eos bool, kv ...string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hdrs(kv...), EndOfStream: eos}}}
}

func respBody(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

// subsetMD is filter metadata carrying a subset hint with value v (a
// []any list, a string, or any structpb-convertible value).
func subsetMD(t testing.TB, v any) *corev3.Metadata {
	t.Helper()
	s, err := structpb.NewStruct(map[string]any{SubsetKey: v})
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{SubsetNamespace: s}}
}

// chat is a chat-completions body for model m1.
func chat(system, session, user string) []byte {
	return fmt.Appendf(nil, `{"model":"m1","user":%q,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, session, system, user)
}

// routed is the request-phase answer: the destination named by the
// headers response and the body streamed back.
type routed struct {
	dest, metaDest, contentLength string
	clearRouteCache               bool
	body                          []byte
	chunks                        []int // sizes of the body chunks
	lastEOS                       bool
	immediate                     *extprocv3.ImmediateResponse
}

// request sends request headers and body (in chunks of chunk bytes; the
// whole body at once if chunk is 0) and reads the request-phase answer.
func (e *envoy) request(md *corev3.Metadata, body []byte, chunk int) routed {
	e.t.Helper()
	e.send(reqHeaders(false, md))
	if chunk <= 0 {
		chunk = max(len(body), 1)
	}
	for off := 0; ; off += chunk {
		end := min(off+chunk, len(body))
		e.send(reqBody(body[off:end], end == len(body)))
		if end == len(body) {
			break
		}
	}
	return e.readRouted()
}

// readRouted reads the headers response, then body chunks until
// end_of_stream; or an immediate response.
func (e *envoy) readRouted() routed {
	e.t.Helper()
	var r routed
	m := e.recv()
	if im := m.GetImmediateResponse(); im != nil {
		r.immediate = im
		return r
	}
	hr := m.GetRequestHeaders()
	if hr == nil {
		e.t.Fatalf("first answer is %T, want request headers", m.GetResponse())
	}
	r.clearRouteCache = hr.GetResponse().GetClearRouteCache()
	for _, o := range hr.GetResponse().GetHeaderMutation().GetSetHeaders() {
		switch strings.ToLower(o.GetHeader().GetKey()) {
		case DestinationKey:
			r.dest = string(o.GetHeader().GetRawValue())
		case "content-length":
			r.contentLength = string(o.GetHeader().GetRawValue())
		}
	}
	r.metaDest = m.GetDynamicMetadata().GetFields()[DestinationNamespace].GetStructValue().GetFields()[DestinationKey].GetStringValue()
	for !r.lastEOS {
		m := e.recv()
		sr := m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			e.t.Fatalf("body answer is %v, want a streamed_response", m)
		}
		r.body = append(r.body, sr.GetBody()...)
		r.chunks = append(r.chunks, len(sr.GetBody()))
		r.lastEOS = sr.GetEndOfStream()
	}
	return r
}

// respond plays a response: headers, then each chunk (the last with
// end_of_stream), reading the picker's answers; it returns the echoed body.
func (e *envoy) respond(contentType string, chunks ...[]byte) []byte {
	e.t.Helper()
	e.send(respHeaders(len(chunks) == 0, ":status", "200", "content-type", contentType))
	if e.recv().GetResponseHeaders() == nil {
		e.t.Fatal("no response headers answer")
	}
	var echoed []byte
	for i, c := range chunks {
		eos := i == len(chunks)-1
		e.send(respBody(c, eos))
		n := max(1, (len(c)+MaxChunkBytes-1)/MaxChunkBytes)
		for j := range n {
			sr := e.recv().GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				e.t.Fatal("response body answer is not a streamed_response")
			}
			if len(sr.GetBody()) > MaxChunkBytes {
				e.t.Fatalf("response chunk of %d bytes, over %d", len(sr.GetBody()), MaxChunkBytes)
			}
			if want := eos && j == n-1; sr.GetEndOfStream() != want {
				e.t.Fatalf("response chunk %d of %d: end_of_stream %v, want %v", j+1, n, sr.GetEndOfStream(), want)
			}
			echoed = append(echoed, sr.GetBody()...)
		}
	}
	return echoed
}

// inFlight returns the gateway's in-flight count per replica.
func inFlight(gw *gateway.Gateway) []int {
	var out []int
	for _, r := range gw.Replicas() {
		out = append(out, r.InFlight)
	}
	return out
}

// waitInFlight polls until every replica's in-flight count is zero: the
// server's goroutine finishes a stream after the client sees it end.
func waitInFlight(t testing.TB, gw *gateway.Gateway) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		fl := inFlight(gw)
		if !slices.ContainsFunc(fl, func(n int) bool { return n != 0 }) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("in-flight counts stay at %v", fl)
		}
		time.Sleep(time.Millisecond)
	}
}

type corev3Metadata = corev3.Metadata

var extprocRequestTrailers = extprocv3.ProcessingRequest{
	Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}},
}

// servedMD is response metadata reporting the endpoint that served.
func servedMD(t testing.TB, ep string) *corev3.Metadata {
	t.Helper()
	s, err := structpb.NewStruct(map[string]any{ServedKey: ep})
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{DestinationNamespace: s}}
}

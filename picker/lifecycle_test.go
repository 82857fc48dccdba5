package picker

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// recorder is a Router that picks a fixed endpoint and records what its
// Trackers hear.
type recorder struct {
	endpoint string
	err      error

	mu       sync.Mutex
	reqs     []PickRequest
	first    int
	outcomes []Outcome
	doneCh   chan Outcome
}

func newRecorder(endpoint string) *recorder {
	return &recorder{endpoint: endpoint, doneCh: make(chan Outcome, 16)}
}

func (r *recorder) Pick(_ context.Context, req *PickRequest) (Pick, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := *req
	c.Header = append(Headers(nil), req.Header...)
	c.Body = append([]byte(nil), req.Body...)
	r.reqs = append(r.reqs, c)
	if r.err != nil {
		return Pick{}, r.err
	}
	return Pick{Endpoint: r.endpoint, Tracker: (*recTracker)(r)}, nil
}

type recTracker recorder

func (t *recTracker) FirstToken() {
	t.mu.Lock()
	t.first++
	t.mu.Unlock()
}

func (t *recTracker) Done(o Outcome) {
	t.mu.Lock()
	t.outcomes = append(t.outcomes, o)
	t.mu.Unlock()
	t.doneCh <- o
}

func (r *recorder) waitDone(t *testing.T) Outcome {
	t.Helper()
	select {
	case o := <-r.doneCh:
		return o
	case <-time.After(10 * time.Second):
		t.Fatal("Tracker.Done was not called")
	}
	return Outcome{}
}

// fakeClock advances by step on every reading.
type fakeClock struct {
	mu   sync.Mutex
	now  time.Time
	step time.Duration
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(c.step)
	return c.now
}

// TestTracker: first token at the response headers of a plain response,
// at the first body bytes of an event stream; Done once, at the end of the
// body, with the latency to the first token; a 5xx is an error; the
// served endpoint is reported; the request's fields reach the Router.
func TestTracker(t *testing.T) {
	for _, tc := range []struct {
		name        string
		contentType string
		status      string
		chunks      [][]byte
		wantLatency time.Duration
		wantErr     bool
	}{
		// Clock readings: request headers (t=1s), routing (2s), then the
		// first token (3s).
		{name: "json", contentType: "application/json", status: "200", chunks: [][]byte{[]byte("{}")}, wantLatency: 2 * time.Second},
		{name: "sse", contentType: "text/event-stream", status: "200",
			chunks: [][]byte{{}, []byte("data: {}\n\n"), []byte("data: [DONE]\n\n")}, wantLatency: 2 * time.Second},
		{name: "5xx", contentType: "application/json", status: "503", chunks: [][]byte{[]byte("{}")}, wantErr: true},
		{name: "4xx is an answer", contentType: "application/json", status: "400", chunks: [][]byte{[]byte("{}")}, wantLatency: 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder("10.1.2.3:8000")
			clk := &fakeClock{step: time.Second}
			h := startPicker(t, rec, Options{Clock: clk.Now})
			e := h.open(t)
			body := chat("s", "s", "q")
			e.send(reqHeaders(false, nil, ":method", "POST", ":path", "/v1/chat/completions", ":authority", "gw.example",
				":scheme", "https", "X-Session-ID", "sess-1"))
			e.send(reqBody(body, true))
			r := e.readRouted()
			if r.dest != "10.1.2.3:8000" {
				t.Fatalf("destination %q", r.dest)
			}
			e.send(respHeaders(false, ":status", tc.status, "content-type", tc.contentType))
			e.recv()
			rec.mu.Lock()
			firstAtHeaders := rec.first
			rec.mu.Unlock()
			if want := map[bool]int{true: 0, false: 1}[tc.contentType == "text/event-stream"]; firstAtHeaders != want {
				t.Errorf("first-token reports after the response headers: %d, want %d", firstAtHeaders, want)
			}
			for i, c := range tc.chunks {
				m := respBody(c, i == len(tc.chunks)-1)
				if i == len(tc.chunks)-1 {
					m.MetadataContext = servedMD(t, "10.1.2.3:8000")
				}
				e.send(m)
				e.recv()
			}
			o := rec.waitDone(t)
			if (o.Err != nil) != tc.wantErr {
				t.Fatalf("outcome error %v, want error %v", o.Err, tc.wantErr)
			}
			if o.Latency != tc.wantLatency {
				t.Errorf("latency %v, want %v", o.Latency, tc.wantLatency)
			}
			if o.Served != "10.1.2.3:8000" {
				t.Errorf("served %q", o.Served)
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if rec.first != 1 || len(rec.outcomes) != 1 {
				t.Errorf("first token %d times, done %d times; want once each", rec.first, len(rec.outcomes))
			}
			got := rec.reqs[0]
			if got.Method != "POST" || got.Path != "/v1/chat/completions" || got.Authority != "gw.example" || got.Scheme != "https" {
				t.Errorf("pseudo-headers %q %q %q %q", got.Method, got.Path, got.Authority, got.Scheme)
			}
			if got.Header.Get("x-session-id") != "sess-1" || got.Header.Get(":path") != "" {
				t.Errorf("headers %v", got.Header)
			}
			if string(got.Body) != string(body) || got.Subset != nil {
				t.Errorf("body %q subset %v", got.Body, got.Subset)
			}
		})
	}
}

// TestClientCancel: a stream that ends early — the client goes away
// before the response or in the middle of a streamed one, or Envoy just
// closes the stream — reports Done with an error and returns the
// gateway's in-flight count to zero.
func TestClientCancel(t *testing.T) {
	for _, tc := range []struct {
		name string
		play func(e *envoy)
	}{
		{name: "before response", play: func(e *envoy) { e.cancel() }},
		{name: "mid stream", play: func(e *envoy) {
			e.send(respHeaders(false, ":status", "200", "content-type", "text/event-stream"))
			e.recv()
			e.send(respBody([]byte("data: {}\n\n"), false))
			e.recv()
			e.cancel()
		}},
		{name: "half close", play: func(e *envoy) {
			e.send(respHeaders(false, ":status", "200", "content-type", "application/json"))
			e.recv()
			if err := e.stream.CloseSend(); err != nil {
				e.t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gw := newGateway(t, 2)
			rec := newRecorder("10.0.0.9:1")
			router := newRouter(t, gw, 0)
			h := startPicker(t, teeRouter{router, rec}, Options{})
			e := h.open(t)
			if r := e.request(nil, chat("s", "s", "q"), 0); r.immediate != nil {
				t.Fatalf("immediate %v", r.immediate)
			}
			if fl := inFlight(gw); fl[0]+fl[1] != 1 {
				t.Fatalf("in flight %v, want one", fl)
			}
			tc.play(e)
			o := rec.waitDone(t)
			if !errors.Is(o.Err, errStreamEnded) {
				t.Errorf("outcome error %v, want errStreamEnded", o.Err)
			}
			waitInFlight(t, gw)
		})
	}
}

// teeRouter picks with r and reports outcomes to both r's tracker and rec.
type teeRouter struct {
	r   Router
	rec *recorder
}

func (tr teeRouter) Pick(ctx context.Context, req *PickRequest) (Pick, error) {
	p, err := tr.r.Pick(ctx, req)
	if err == nil {
		p.Tracker = teeTracker{p.Tracker, (*recTracker)(tr.rec)}
	}
	return p, err
}

type teeTracker struct{ a, b Tracker }

func (t teeTracker) FirstToken()    { t.a.FirstToken(); t.b.FirstToken() }
func (t teeTracker) Done(o Outcome) { t.a.Done(o); t.b.Done(o) }

// TestMalformed: messages out of Envoy's sequence fail the stream with a
// status naming what was wrong, and a request already picked is released.
func TestMalformed(t *testing.T) {
	routedThen := func(ms ...*extprocv3.ProcessingRequest) []*extprocv3.ProcessingRequest {
		return append([]*extprocv3.ProcessingRequest{reqHeaders(false, nil), reqBody(chat("s", "s", "q"), true)}, ms...)
	}
	for _, tc := range []struct {
		name    string
		msgs    []*extprocv3.ProcessingRequest
		code    codes.Code
		mention string
		picked  bool
	}{
		{name: "empty message", msgs: []*extprocv3.ProcessingRequest{{}}, code: codes.InvalidArgument, mention: "sets none"},
		{name: "body first", msgs: []*extprocv3.ProcessingRequest{reqBody([]byte("{}"), true)}, code: codes.InvalidArgument, mention: "request_body arrived before the request headers"},
		{name: "response first", msgs: []*extprocv3.ProcessingRequest{respHeaders(false, ":status", "200")}, code: codes.InvalidArgument, mention: "response_headers"},
		{name: "headers twice", msgs: []*extprocv3.ProcessingRequest{reqHeaders(false, nil), reqHeaders(false, nil)}, code: codes.InvalidArgument, mention: "request_headers arrived while reading"},
		{name: "response body before headers", msgs: routedThen(respBody([]byte("x"), true)), code: codes.InvalidArgument, mention: "response_body", picked: true},
		{name: "body after routing", msgs: routedThen(reqBody([]byte("x"), true)), code: codes.InvalidArgument, mention: "request_body arrived before the response headers", picked: true},
		{name: "observability mode", msgs: []*extprocv3.ProcessingRequest{{ObservabilityMode: true, Request: reqHeaders(false, nil).Request}}, code: codes.FailedPrecondition, mention: "observability_mode"},
		{name: "buffered body mode", msgs: []*extprocv3.ProcessingRequest{{
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: extprocfilterv3.ProcessingMode_BUFFERED},
			Request:        reqHeaders(false, nil).Request}}, code: codes.FailedPrecondition, mention: "BUFFERED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder("10.0.0.1:80")
			h := startPicker(t, rec, Options{})
			e := h.open(t)
			for _, m := range tc.msgs {
				if err := e.stream.Send(m); err != nil {
					break
				}
			}
			var err error
			for err == nil {
				_, err = e.stream.Recv()
			}
			st, _ := status.FromError(err)
			if st.Code() != tc.code || !contains(st.Message(), tc.mention) {
				t.Fatalf("stream ended with %v, want %v mentioning %q", err, tc.code, tc.mention)
			}
			if tc.picked {
				if o := rec.waitDone(t); o.Err == nil {
					t.Error("picked request released without an error")
				}
			}
		})
	}
}

func contains(s, sub string) bool { return len(sub) == 0 || indexOf(s, sub) >= 0 }

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// TestRouterErrors: a Router's errors map to immediate responses; a Pick
// naming an endpoint that is not ip:port, or one outside the subset, is
// refused and its Tracker released.
func TestRouterErrors(t *testing.T) {
	for _, tc := range []struct {
		name     string
		endpoint string
		err      error
		md       bool
		status   int
		released bool
	}{
		{name: "no endpoint", err: ErrNoEndpoint, status: 503},
		{name: "shed", err: ErrShed, status: 429},
		{name: "bad request", err: ErrBadRequest, status: 400},
		{name: "unknown model", err: ErrUnknownModel, status: 404},
		{name: "other", err: errors.New("boom"), status: 500},
		{name: "hostname endpoint", endpoint: "engine:8000", status: 500, released: true},
		{name: "list endpoint", endpoint: "10.0.0.1:1,10.0.0.2:1", status: 500, released: true},
		{name: "outside subset", endpoint: "10.0.0.7:1", md: true, status: 503, released: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder(tc.endpoint)
			rec.err = tc.err
			h := startPicker(t, rec, Options{})
			var md *corev3Metadata
			if tc.md {
				md = subsetMD(t, []any{"10.0.0.1:1"})
			}
			r := h.open(t).request(md, chat("s", "s", "q"), 0)
			if r.immediate == nil || int(r.immediate.GetStatus().GetCode()) != tc.status {
				t.Fatalf("got %+v, want immediate %d", r, tc.status)
			}
			if tc.released {
				if o := rec.waitDone(t); o.Err == nil {
					t.Error("refused pick released without an error")
				}
			}
		})
	}
}

// TestHealth: the gRPC health service reports SERVING, then NOT_SERVING
// after SetServing(false), for the empty name and the ext_proc service.
func TestHealth(t *testing.T) {
	h := startPicker(t, newRecorder("10.0.0.1:80"), Options{})
	hc := healthpb.NewHealthClient(h.conn)
	for _, serving := range []bool{true, false} {
		h.srv.SetServing(serving)
		want := healthpb.HealthCheckResponse_NOT_SERVING
		if serving {
			want = healthpb.HealthCheckResponse_SERVING
		}
		for _, svc := range []string{"", ServiceName} {
			resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
			if err != nil || resp.GetStatus() != want {
				t.Fatalf("service %q: %v %v, want %v", svc, resp.GetStatus(), err, want)
			}
		}
	}
}

// TestOptions: bad options are refused naming the field.
func TestOptions(t *testing.T) {
	for _, o := range []Options{{MaxBodyBytes: -1}, {MaxFallbacks: -2}} {
		if _, err := New(newRecorder("10.0.0.1:1"), o); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("%+v: %v, want ErrInvalidOptions", o, err)
		}
	}
	if _, err := New(nil, Options{}); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("nil router: %v", err)
	}
	gw := newGateway(t, 1)
	key, _ := BodyKey(64)
	if _, err := NewGatewayRouter(gw, key, -1); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("negative fallbacks: %v", err)
	}
}

// TestResponseBodyModes: with response_body_mode NONE the request ends at
// its response headers, successfully; in STREAMED mode body chunks are
// acknowledged without a mutation; the modes come from protocol_config.
func TestResponseBodyModes(t *testing.T) {
	for _, mode := range []extprocfilterv3.ProcessingMode_BodySendMode{extprocfilterv3.ProcessingMode_NONE, extprocfilterv3.ProcessingMode_STREAMED} {
		t.Run(mode.String(), func(t *testing.T) {
			rec := newRecorder("10.0.0.1:80")
			h := startPicker(t, rec, Options{})
			e := h.open(t)
			m := reqHeaders(false, nil)
			m.ProtocolConfig = &extprocv3.ProtocolConfiguration{
				RequestBodyMode: extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: mode}
			e.send(m)
			e.send(reqBody(chat("s", "s", "q"), true))
			e.readRouted()
			e.send(respHeaders(false, ":status", "200", "Content-Type", "application/json"))
			e.recv()
			if mode == extprocfilterv3.ProcessingMode_STREAMED {
				e.send(respBody([]byte("{}"), true))
				if a := e.recv().GetResponseBody(); a == nil || a.GetResponse() != nil {
					t.Fatalf("answer %v, want an empty body response", a)
				}
			}
			if o := rec.waitDone(t); o.Err != nil || o.Status != 200 {
				t.Fatalf("outcome %+v, want success", o)
			}
		})
	}
}

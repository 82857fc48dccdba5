package picker

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
)

// fakeTimer is a timer Server.after made: its duration and its channel,
// which the test fires.
type fakeTimer struct {
	d time.Duration
	c chan time.Time
}

// fakeTimers replaces s.after and s.afterFunc: every timer made is sent on
// the returned channel, and fires when the test sends on its c.
func fakeTimers(s *Server) chan fakeTimer {
	made := make(chan fakeTimer, 1024)
	s.after = func(d time.Duration) (<-chan time.Time, func() bool) {
		c := make(chan time.Time, 1)
		made <- fakeTimer{d, c}
		return c, func() bool { return true }
	}
	s.afterFunc = func(d time.Duration, f func()) func() bool {
		c, stopped := make(chan time.Time, 1), make(chan struct{})
		made <- fakeTimer{d, c}
		go func() {
			select {
			case <-c:
				f()
			case <-stopped:
			}
		}()
		var once sync.Once
		return func() bool { once.Do(func() { close(stopped) }); return true }
	}
	return made
}

// serveServer serves s (already configured) over bufconn, with opts, and
// returns a harness for it.
func serveServer(t testing.TB, s *Server, opts ...grpc.ServerOption) *harness {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	g := grpc.NewServer(opts...)
	s.Register(g)
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
	return &harness{srv: s, conn: conn, client: extprocv3.NewExternalProcessorClient(conn)}
}

// waitStats polls s.Stats until ok accepts them: the server's goroutines
// act after the client's messages are sent, with nothing to wait on.
func waitStats(t *testing.T, s *Server, what string, ok func(Stats) bool) Stats {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := s.Stats()
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: stats stay %+v", what, st)
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
}

// TestBodyBudget: streams that send a body without end_of_stream hold it;
// once their bodies fill MaxBufferedBytes, the next stream is answered 503
// at once instead of growing memory, and the budget comes back when the
// streams end.
func TestBodyBudget(t *testing.T) {
	const mib = 1 << 20
	// Room for 4 bodies and the 8 streams opened.
	const budget = 4*mib + 8*StreamBytes
	s, err := New(newRouter(t, newGateway(t, 2), 0), Options{MaxBodyBytes: mib, MaxBufferedBytes: budget})
	if err != nil {
		t.Fatal(err)
	}
	fakeTimers(s) // no request timeout fires
	h := serveServer(t, s)
	// A chat request of exactly 1 MiB.
	body := chat("sys", "s1", "")
	pad := bytes.Repeat([]byte("x"), mib-len(body))
	body = chat("sys", "s1", string(pad))
	var held []*envoy
	for i := range 8 {
		e := h.open(t)
		e.send(reqHeaders(false, nil))
		e.send(reqBody(body, false))
		before := s.Stats()
		st := waitStats(t, s, "the body to be held or refused", func(st Stats) bool {
			return st.BufferedBytes > before.BufferedBytes || st.Overloaded > before.Overloaded
		})
		if i < 4 {
			if st.Overloaded != 0 || st.BufferedBytes != int64(i+1)*mib || st.ReservedBytes != int64(i+1)*(mib+StreamBytes) {
				t.Fatalf("stream %d: stats %+v, want %d MiB held, with their streams, and none refused", i, st, i+1)
			}
			held = append(held, e)
			continue
		}
		if st.BufferedBytes != 4*mib {
			t.Fatalf("stream %d: %d bytes of bodies held, want 4 MiB", i, st.BufferedBytes)
		}
		im := e.recv().GetImmediateResponse()
		if im == nil || im.GetStatus().GetCode() != 503 {
			t.Fatalf("stream %d: answer %v, want an immediate 503", i, im)
		}
	}
	if st := s.Stats(); st.Overloaded != 4 {
		t.Fatalf("Overloaded %d, want 4", st.Overloaded)
	}
	// A held stream that completes its body is routed, and its buffer
	// returns to the budget while it waits for the response.
	held[0].send(reqBody(nil, true))
	if r := held[0].readRouted(); r.immediate != nil || r.dest == "" {
		t.Fatalf("held stream: %+v, want routed", r)
	}
	waitStats(t, s, "the routed stream's buffer to be released", func(st Stats) bool { return st.BufferedBytes == 3*mib })
	for _, e := range held {
		e.cancel()
	}
	waitStats(t, s, "every stream to end", func(st Stats) bool { return st.ReservedBytes == 0 && st.Streams == 0 })
}

// TestStreamBudget: each open stream takes StreamBytes of
// MaxBufferedBytes, whatever it sends; a stream that would take the sum
// past it ends as it opens, with RESOURCE_EXHAUSTED, and is counted; a
// stream's end gives its share back.
func TestStreamBudget(t *testing.T) {
	const body = 4096
	s, err := New(newRouter(t, newGateway(t, 2), 0), Options{MaxBodyBytes: body, MaxBufferedBytes: body + 3*StreamBytes})
	if err != nil {
		t.Fatal(err)
	}
	fakeTimers(s)
	h := serveServer(t, s)
	var held []*envoy
	for i := range 3 {
		e := h.open(t)
		e.send(reqHeaders(false, nil))
		held = append(held, e)
		waitStats(t, s, "the stream to be admitted", func(st Stats) bool { return st.ReservedBytes == int64(i+1)*StreamBytes })
	}
	// A body that fills the budget exactly is held.
	held[0].send(reqBody(bytes.Repeat([]byte("x"), body), false))
	waitStats(t, s, "the body", func(st Stats) bool { return st.BufferedBytes == body })
	for i := range 2 {
		e := h.open(t)
		// The picker may end the stream as it opens, before the headers
		// are sent: Send then reports io.EOF, and Recv the status.
		if err := e.stream.Send(reqHeaders(false, nil)); err != nil && err != io.EOF {
			t.Fatalf("send: %v", err)
		}
		if _, err := e.stream.Recv(); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("stream past the budget (%d): %v, want RESOURCE_EXHAUSTED", i, err)
		}
	}
	if st := s.Stats(); st.Overloaded != 2 || st.Streams != 3 || st.ReservedBytes != body+3*StreamBytes {
		t.Fatalf("stats %+v, want 2 refused, 3 streams and the budget held", st)
	}
	held[0].cancel()
	waitStats(t, s, "the first stream to end", func(st Stats) bool { return st.ReservedBytes == 2*StreamBytes })
	e := h.open(t)
	e.send(reqHeaders(false, nil))
	waitStats(t, s, "a new stream to be admitted", func(st Stats) bool { return st.ReservedBytes == 3*StreamBytes && st.Streams == 3 })
	for _, e := range append(held[1:], e) {
		e.cancel()
	}
	waitStats(t, s, "every stream to end", func(st Stats) bool { return st.ReservedBytes == 0 && st.Streams == 0 })
}

// TestRequestTimeout: streams that send request headers (with or without a
// first body chunk) and then nothing are answered 408 and end when
// RequestTimeout passes, and are counted.
func TestRequestTimeout(t *testing.T) {
	s, err := New(newRouter(t, newGateway(t, 2), 0), Options{RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	made := fakeTimers(s)
	h := serveServer(t, s)
	const n = 50
	es := make([]*envoy, n)
	for i := range es {
		es[i] = h.open(t)
		es[i].send(reqHeaders(false, nil))
		if i%2 == 1 {
			es[i].send(reqBody([]byte(`{"model":"m1",`), false))
		}
	}
	for range n {
		tm := <-made
		if tm.d != 5*time.Second {
			t.Fatalf("timer of %v, want RequestTimeout", tm.d)
		}
		tm.c <- time.Time{}
	}
	for i, e := range es {
		im := e.recv().GetImmediateResponse()
		if im == nil || im.GetStatus().GetCode() != 408 {
			t.Fatalf("stream %d: answer %v, want an immediate 408", i, im)
		}
	}
	st := waitStats(t, s, "every stream to end", func(st Stats) bool { return st.Streams == 0 })
	if st.RequestTimeouts != n || st.BufferedBytes != 0 {
		t.Fatalf("stats %+v, want %d request timeouts and nothing buffered", st, n)
	}
}

// TestResponseTimeout: a routed stream that never gets a response phase
// ends with DeadlineExceeded when ResponseTimeout passes, and the load
// booked for it is released.
func TestResponseTimeout(t *testing.T) {
	gw := newGateway(t, 2)
	s, err := New(newRouter(t, gw, 0), Options{ResponseTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	made := fakeTimers(s)
	h := serveServer(t, s)
	e := h.open(t)
	if r := e.request(nil, chat("sys", "s1", "hi"), 0); r.dest == "" {
		t.Fatalf("not routed: %+v", r)
	}
	if tm := <-made; tm.d != DefaultRequestTimeout {
		t.Fatalf("first timer %v, want the request timeout", tm.d)
	}
	tm := <-made
	if tm.d != time.Minute {
		t.Fatalf("second timer %v, want ResponseTimeout", tm.d)
	}
	if fl := inFlight(gw); fl[0]+fl[1] != 1 {
		t.Fatalf("in flight %v, want the routed request", fl)
	}
	tm.c <- time.Time{}
	_, err = e.stream.Recv()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("stream ended with %v, want DeadlineExceeded", err)
	}
	waitInFlight(t, gw)
	if st := waitStats(t, s, "the stream to end", func(st Stats) bool { return st.Streams == 0 }); st.ResponseTimeouts != 1 {
		t.Fatalf("stats %+v, want one response timeout", st)
	}
}

// TestResponseTimeoutEndsAtHeaders: ResponseTimeout bounds the wait for
// the response headers only: once they have come, a response body that
// streams on past it (a long generation) is relayed to its end, not cut
// with DeadlineExceeded.
func TestResponseTimeoutEndsAtHeaders(t *testing.T) {
	gw := newGateway(t, 2)
	s, err := New(newRouter(t, gw, 0), Options{ResponseTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	made := fakeTimers(s)
	h := serveServer(t, s)
	e := h.open(t)
	if r := e.request(nil, chat("sys", "s1", "hi"), 0); r.dest == "" {
		t.Fatalf("not routed: %+v", r)
	}
	<-made // RequestTimeout's
	tm := <-made
	if tm.d != time.Minute {
		t.Fatalf("second timer %v, want ResponseTimeout", tm.d)
	}
	e.send(respHeaders(false, ":status", "200", "content-type", "text/event-stream"))
	if e.recv().GetResponseHeaders() == nil {
		t.Fatal("no response headers answer")
	}
	tm.c <- time.Time{} // ResponseTimeout passes while the body streams
	for i, last := range []bool{false, false, true} {
		e.send(respBody([]byte("data: {}\n\n"), last))
		m, err := e.stream.Recv()
		if err != nil {
			t.Fatalf("chunk %d: the stream ended with %v after the response headers came", i, err)
		}
		if m.GetResponseBody() == nil {
			t.Fatalf("chunk %d: answer %v, want a response body", i, m)
		}
	}
	waitInFlight(t, gw)
	if err := e.stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if st := waitStats(t, s, "the stream to end", func(st Stats) bool { return st.Streams == 0 }); st.ResponseTimeouts != 0 {
		t.Fatalf("stats %+v, want no response timeout", st)
	}
}

// TestGRPCOptions: the transport limits apply; MaxConcurrentStreams
// makes a connection's stream beyond it wait.
func TestGRPCOptions(t *testing.T) {
	s, err := New(newRouter(t, newGateway(t, 1), 0), Options{})
	if err != nil {
		t.Fatal(err)
	}
	fakeTimers(s)
	h := serveServer(t, s, GRPCOptions(GRPCLimits{MaxConcurrentStreams: 2})...)
	a, b := h.open(t), h.open(t)
	a.send(reqHeaders(false, nil))
	b.send(reqHeaders(false, nil))
	waitStats(t, s, "two streams", func(st Stats) bool { return st.Streams == 2 })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	c, err := h.client.Process(ctx)
	if err == nil {
		// The stream is created lazily; its first message waits for
		// room, and the context ends first.
		_ = c.Send(reqHeaders(false, nil))
		_, err = c.Recv()
	}
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("third stream: %v, want it held back (DeadlineExceeded)", err)
	}
	if st := s.Stats(); st.Streams != 2 {
		t.Fatalf("%d streams served, want 2", st.Streams)
	}
	if n := len(GRPCOptions(GRPCLimits{MaxConnectionAge: time.Hour})); n != 6 {
		t.Fatalf("%d options, want 6", n)
	}
}

// TestBodyMemory measures the heap that streams holding bodies without
// end_of_stream take, with MaxBufferedBytes at its default and with no
// effective bound: 60 streams of 8 MiB bodies in 64 KiB chunks, over an
// in-process gRPC connection. It is a measurement (docs/picker.md,
// "Security"), run with EXA_MEASURE=1.
func TestBodyMemory(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("a measurement: set EXA_MEASURE=1")
	}
	for _, c := range []struct {
		name   string
		budget int64
	}{{"unbounded", 1 << 40}, {"default", 0}} {
		heap := func() uint64 {
			runtime.GC()
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			return m.HeapInuse
		}
		s, err := New(newRouter(t, newGateway(t, 2), 0), Options{MaxBufferedBytes: c.budget})
		if err != nil {
			t.Fatal(err)
		}
		fakeTimers(s)
		h := serveServer(t, s, GRPCOptions(GRPCLimits{})...)
		before := heap()
		chunk := make([]byte, 64<<10)
		var es []*envoy
		for range 60 {
			e := h.open(t)
			e.send(reqHeaders(false, nil))
			for range (8 << 20) / len(chunk) {
				if err := e.stream.Send(reqBody(chunk, false)); err != nil {
					// the server answered and ended the stream
					break
				}
			}
			es = append(es, e)
		}
		waitStats(t, s, "the bodies to arrive", func(st Stats) bool {
			return st.BufferedBytes%(8<<20) == 0 && int64(st.Overloaded)+st.BufferedBytes/(8<<20) == 60
		})
		after := heap()
		st := s.Stats()
		t.Logf("%s (MaxBufferedBytes %d MiB): heap in use %d MiB before, %d MiB with 60 streams of 8 MiB bodies (+%d MiB); buffered %d MiB; %d refused (503)",
			c.name, s.opts.MaxBufferedBytes>>20, before>>20, after>>20, (after-before)>>20, st.BufferedBytes>>20, st.Overloaded)
		for _, e := range es {
			e.cancel()
		}
		waitStats(t, s, "every stream to end", func(st Stats) bool { return st.Streams == 0 })
		h.conn.Close()
	}
}

// TestStreamMemory measures the heap per stream held after its request
// headers (1,000 streams on one connection), both ends of the in-process
// connection included. A measurement, run with EXA_MEASURE=1.
func TestStreamMemory(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("a measurement: set EXA_MEASURE=1")
	}
	const n = 1000
	s, err := New(newRouter(t, newGateway(t, 2), 0), Options{})
	if err != nil {
		t.Fatal(err)
	}
	made := fakeTimers(s)
	h := serveServer(t, s, GRPCOptions(GRPCLimits{MaxConcurrentStreams: 2 * n})...)
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	before := heap()
	es := make([]*envoy, n)
	for i := range es {
		es[i] = h.open(t)
		es[i].send(reqHeaders(false, nil))
	}
	waitStats(t, s, "the streams", func(st Stats) bool { return st.Streams == n })
	after := heap()
	t.Logf("%d header-only streams: heap in use %d MiB before, %d MiB after: %d bytes per stream (client and server)",
		n, before>>20, after>>20, (after-before)/n)
	for range n {
		(<-made).c <- time.Time{}
	}
	waitStats(t, s, "every stream to end", func(st Stats) bool { return st.Streams == 0 })
}

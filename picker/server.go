package picker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// ServiceName is the ext_proc gRPC service the picker serves, also the
// service name its health status is reported under (GIE's Envoy
// configuration health-checks the picker with it).
const ServiceName = "envoy.service.ext_proc.v3.ExternalProcessor"

// Server is an Envoy external processor (ext_proc) that picks each
// request's endpoint with a Router, following the Gateway API Inference
// Extension's endpoint picker protocol. Create one with New and Register
// it on a *grpc.Server. It is safe for concurrent use: each ext_proc
// stream (one HTTP request) is served by its own goroutine.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	router Router
	opts   Options
	health *health.Server
	pool   sync.Pool // *exchange
	bodies sync.Pool // *[]byte, request body buffers of at most retainBodyBytes

	// after starts a timer (time.NewTimer's C and Stop); tests replace it.
	after func(time.Duration) (<-chan time.Time, func() bool)
	// afterFunc runs f after d (time.AfterFunc; its Stop); tests replace it.
	afterFunc func(d time.Duration, f func()) (stop func() bool)

	reserved                       atomic.Int64 // MaxBufferedBytes in use: StreamBytes a stream, and the body buffers
	buffered                       atomic.Int64 // body buffer bytes reserved (exchange.grow)
	streams                        atomic.Int64
	reqTimeouts, respTimeouts, ovl atomic.Uint64
	// Upstream streaming (upstream.go): bytes the answers being
	// assembled hold (part of reserved), and its counters.
	assembled                          atomic.Int64
	asmStreamed, asmSkipped, asmFailed atomic.Uint64
}

// Stats counts what the Server's bounds did. All fields are totals since
// New except Streams, ReservedBytes and BufferedBytes, which are current.
type Stats struct {
	// Streams is the number of ext_proc streams being served.
	Streams int64
	// ReservedBytes is the memory the streams hold by the Server's
	// account, at most Options.MaxBufferedBytes: StreamBytes for each
	// stream admitted, plus BufferedBytes.
	ReservedBytes int64
	// BufferedBytes is the request body memory the streams hold.
	BufferedBytes int64
	// RequestTimeouts counts streams ended because their request phase
	// outlasted Options.RequestTimeout (answered 408).
	RequestTimeouts uint64
	// ResponseTimeouts counts routed streams ended because no response
	// headers came within Options.ResponseTimeout.
	ResponseTimeouts uint64
	// Overloaded counts streams refused because they would have taken
	// ReservedBytes past Options.MaxBufferedBytes: a body answered 503,
	// or a stream ended with RESOURCE_EXHAUSTED as it opened.
	Overloaded uint64
	// AssembledBytes is the memory the answers being assembled from
	// engines' streams hold (Pick.Assemble; part of ReservedBytes).
	AssembledBytes int64
	// UpstreamStreamed counts requests whose body was rewritten to
	// stream their answer from the engine; UpstreamStreamSkipped those a
	// Pick allowed to be, forwarded as they were because
	// Options.MaxBufferedBytes could not hold their answer's first step
	// (Overloaded counts them too); UpstreamStreamFailed the assembled
	// answers that failed (a malformed or cut stream, an error event, an
	// answer past its bound or the budget).
	UpstreamStreamed, UpstreamStreamSkipped, UpstreamStreamFailed uint64
}

// Stats returns the Server's counters.
func (s *Server) Stats() Stats {
	return Stats{Streams: s.streams.Load(), ReservedBytes: s.reserved.Load(), BufferedBytes: s.buffered.Load(),
		RequestTimeouts: s.reqTimeouts.Load(), ResponseTimeouts: s.respTimeouts.Load(), Overloaded: s.ovl.Load(),
		AssembledBytes: s.assembled.Load(), UpstreamStreamed: s.asmStreamed.Load(), UpstreamStreamSkipped: s.asmSkipped.Load(), UpstreamStreamFailed: s.asmFailed.Load()}
}

// StreamBytes is what each ext_proc stream takes from
// Options.MaxBufferedBytes while it is open, besides its body: 32 KiB, the
// memory a stream holds outside its body, rounded up. Measured with the
// exa binary (docs/picker.md, "Security"): 5,000 streams waiting for
// their bodies raised its RSS by 118 MB, 23.6 KB a stream: two goroutine
// stacks of 8 KiB (gRPC's handler and the stream's reader) and 7 KB of
// heap and runtime; the rest covers the body chunks a stream has in
// flight.
const StreamBytes = 32 << 10

// reserve takes n bytes of MaxBufferedBytes, or reports that they would
// take it past its bound (nothing is then taken).
func (s *Server) reserve(n int64) bool {
	if s.reserved.Add(n) > s.opts.MaxBufferedBytes {
		s.reserved.Add(-n)
		s.ovl.Add(1)
		return false
	}
	return true
}

// admit reserves a new stream's StreamBytes; the error, RESOURCE_EXHAUSTED,
// ends the stream before anything is read from it.
func (s *Server) admit() error {
	if s.reserve(StreamBytes) {
		return nil
	}
	return status.Errorf(codes.ResourceExhausted,
		"picker: overloaded: the streams open hold %d bytes, and a new one needs %d, past MaxBufferedBytes (%d)",
		s.reserved.Load(), StreamBytes, s.opts.MaxBufferedBytes)
}

var _ extprocv3.ExternalProcessorServer = (*Server)(nil)

// New returns a Server picking with r. Its health status starts SERVING.
func New(r Router, opts Options) (*Server, error) {
	if r == nil {
		return nil, fmt.Errorf("%w: nil Router", ErrInvalidOptions)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{router: r, opts: o, health: health.NewServer()}
	s.pool.New = func() any { return new(exchange) }
	s.bodies.New = func() any { return new([]byte) }
	s.after = func(d time.Duration) (<-chan time.Time, func() bool) {
		t := time.NewTimer(d)
		return t.C, t.Stop
	}
	s.afterFunc = func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }
	s.SetServing(true)
	return s, nil
}

// Register registers the ext_proc service and the gRPC health service
// (grpc.health.v1.Health) on g.
func (s *Server) Register(g *grpc.Server) {
	extprocv3.RegisterExternalProcessorServer(g, s)
	healthpb.RegisterHealthServer(g, s.health)
}

// SetServing sets the health status reported for the empty service name
// and for ServiceName: SERVING or NOT_SERVING (say, while draining).
func (s *Server) SetServing(serving bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(ServiceName, st)
}

// Process serves one ext_proc stream: one HTTP request and its response.
// The stream's messages are read by a goroutine of their own so that the
// stream can end on Options.RequestTimeout and Options.ResponseTimeout
// even while no message comes.
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	if err := s.admit(); err != nil {
		return err
	}
	defer s.reserved.Add(-StreamBytes)
	type recvd struct {
		m   *extprocv3.ProcessingRequest
		err error
	}
	msgs := make(chan recvd)
	done := make(chan struct{})
	defer close(done)
	go func() {
		// Recv returns once the handler has returned, if not before: gRPC
		// cancels the stream's context then.
		for {
			m, err := srv.Recv()
			select {
			case msgs <- recvd{m, err}:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	// The request phase's context: the stream's, also ended with cause
	// ErrRequestTimeout when RequestTimeout passes, which the receive
	// below watches while headers and body come and the Router's Pick
	// gets (a Router holding the request must let it go then).
	var req reqTimer
	req.ctx = srv.Context()
	if s.opts.RequestTimeout > 0 {
		ctx, cancel := context.WithCancelCause(req.ctx)
		req.ctx, req.stop = ctx, s.afterFunc(s.opts.RequestTimeout, func() { cancel(ErrRequestTimeout) })
		defer cancel(nil)
		defer req.stop()
	}
	var respC <-chan time.Time
	stopResp := func() bool { return false }
	defer func() { stopResp() }()
	return s.run(srv, req, func(x *exchange) (*extprocv3.ProcessingRequest, error) {
		var reqDone <-chan struct{}
		switch x.ph {
		case phaseHeaders, phaseBody:
			reqDone = req.ctx.Done()
		case phaseRouted:
			if respC == nil && s.opts.ResponseTimeout > 0 {
				respC, stopResp = s.after(s.opts.ResponseTimeout)
			}
		default:
			// The response headers came: ResponseTimeout bounds only
			// the wait for them, not a body that streams on.
			if respC != nil {
				stopResp()
				respC = nil
			}
		}
		select {
		case r := <-msgs:
			return r.m, r.err
		case <-reqDone:
			if req.timedOut() {
				return nil, errRequestTimedOut
			}
			r := <-msgs // the stream ended: its Recv says how
			return r.m, r.err
		case <-respC:
			return nil, errResponseTimedOut
		}
	})
}

// reqTimer is a stream's request phase: its context (the stream's, ended
// with cause ErrRequestTimeout when RequestTimeout passes) and the
// timer's stop, nil without one.
type reqTimer struct {
	ctx  context.Context
	stop func() bool
}

// timedOut reports whether RequestTimeout has passed.
func (r reqTimer) timedOut() bool { return context.Cause(r.ctx) == ErrRequestTimeout }

// stream is the part of an ext_proc server stream the picker uses, so
// tests and fuzzing can drive serve without gRPC.
type stream interface {
	Context() context.Context
	Recv() (*extprocv3.ProcessingRequest, error)
	Send(*extprocv3.ProcessingResponse) error
}

// errStreamEnded is the Outcome error of a request whose stream ended
// before its response did.
var errStreamEnded = errors.New("picker: ext_proc stream ended before the response did")

// The errors a Process receive function returns when a deadline passes.
var (
	errRequestTimedOut  = errors.New("request phase timed out")
	errResponseTimedOut = errors.New("response headers timed out")
)

// serve serves st with no deadlines, reading in the calling goroutine.
func (s *Server) serve(st stream) error {
	if err := s.admit(); err != nil {
		return err
	}
	defer s.reserved.Add(-StreamBytes)
	return s.run(st, reqTimer{ctx: st.Context()}, func(*exchange) (*extprocv3.ProcessingRequest, error) { return st.Recv() })
}

// run serves one stream, reading its messages with recv; req is its
// request phase (recv watches its end while headers and body come, the
// exchange while the Router picks).
func (s *Server) run(st stream, req reqTimer, recv func(*exchange) (*extprocv3.ProcessingRequest, error)) (err error) {
	s.streams.Add(1)
	x := s.pool.Get().(*exchange)
	x.reset(s, st)
	x.reqPhase = req
	defer func() {
		x.finish(err)
		x.release()
		s.pool.Put(x)
		s.streams.Add(-1)
	}()
	for {
		m, rerr := recv(x)
		switch {
		case rerr == io.EOF:
			return nil
		case rerr == errRequestTimedOut:
			return x.immediate(s.requestTimedOut())
		case rerr == errResponseTimedOut:
			s.respTimeouts.Add(1)
			return status.Errorf(codes.DeadlineExceeded, "picker: no response headers within ResponseTimeout (%v) of routing the request", s.opts.ResponseTimeout)
		case rerr != nil:
			if status.Code(rerr) == codes.Canceled || errors.Is(rerr, context.Canceled) {
				// Envoy cancels the stream when the client goes away;
				// finish reports it to the Tracker.
				x.cause = rerr
				return nil
			}
			return rerr
		}
		stop, herr := x.handle(m)
		if herr != nil || stop {
			return herr
		}
	}
}

// requestTimedOut counts a stream whose request phase outlasted
// RequestTimeout and returns the error it is answered with (408).
func (s *Server) requestTimedOut() error {
	s.reqTimeouts.Add(1)
	return fmt.Errorf("%w: the request phase (headers and body) did not end within RequestTimeout (%v)", ErrRequestTimeout, s.opts.RequestTimeout)
}

// Defaults of GRPCLimits.
const (
	// DefaultMaxConcurrentStreams is the default of
	// GRPCLimits.MaxConcurrentStreams: 1,024 streams (requests in
	// flight) per connection. Envoy opens another connection when its
	// HTTP/2 pool reaches a server's limit.
	DefaultMaxConcurrentStreams = 1024
	// DefaultKeepaliveMinTime is the default of GRPCLimits.KeepaliveMinTime:
	// 10s, below the intervals Envoy's connection_keepalive is usually
	// given (a client pinging more often is disconnected).
	DefaultKeepaliveMinTime = 10 * time.Second
	// DefaultKeepaliveTime and DefaultKeepaliveTimeout are the defaults
	// of GRPCLimits.KeepaliveTime and KeepaliveTimeout: a connection idle
	// for 30s is pinged and closed, with its streams, if the ping is not
	// answered within 10s.
	DefaultKeepaliveTime    = 30 * time.Second
	DefaultKeepaliveTimeout = 10 * time.Second
	// DefaultHandshakeTimeout is the default of GRPCLimits.HandshakeTimeout:
	// 10s for a new connection's TLS handshake (when served with TLS), its
	// HTTP/2 preface and its first SETTINGS frame.
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultMaxConnectionIdle is the default of GRPCLimits.MaxConnectionIdle:
	// a connection without streams for 5s is sent GOAWAY and closed (Envoy
	// opens a new one for its next request).
	DefaultMaxConnectionIdle = 5 * time.Second
)

// The HTTP/2 flow-control windows GRPCOptions sets, fixed. gRPC's default
// estimates the bandwidth-delay product and grows a connection's windows,
// and each of its streams', up to 16 MiB: on a fast link a stream could
// then have megabytes received that the picker has not read, outside
// Options.MaxBufferedBytes (issue 29, D4). With fixed windows a stream has
// at most StreamWindowBytes unread (or the message being read, when it is
// larger), and a connection at most ConnWindowBytes on the wire.
const (
	// StreamWindowBytes is each stream's window: 64 KiB, HTTP/2's initial
	// window rounded up; at a 0.5 ms round trip a stream still moves
	// 128 MB/s.
	StreamWindowBytes = 64 << 10
	// ConnWindowBytes is each connection's window: 1 MiB.
	ConnWindowBytes = 1 << 20
)

// GRPCLimits are the gRPC transport bounds GRPCOptions sets on the
// *grpc.Server a Server is registered on. The zero value takes every
// default.
type GRPCLimits struct {
	// MaxConcurrentStreams bounds the streams of one connection. Zero
	// means DefaultMaxConcurrentStreams.
	MaxConcurrentStreams uint32
	// KeepaliveMinTime is the shortest interval between a client's
	// keepalive pings the server accepts (enforcement policy, pings
	// without streams allowed); a client pinging more often is
	// disconnected. Zero means DefaultKeepaliveMinTime.
	KeepaliveMinTime time.Duration
	// KeepaliveTime and KeepaliveTimeout: the server pings a connection
	// idle for KeepaliveTime and closes it when no answer comes within
	// KeepaliveTimeout. Zero means DefaultKeepaliveTime,
	// DefaultKeepaliveTimeout.
	KeepaliveTime, KeepaliveTimeout time.Duration
	// HandshakeTimeout bounds a new connection's handshake: TLS (when
	// served with TLS), the client's HTTP/2 preface and its first SETTINGS
	// frame; a connection that has not sent them by then is closed (gRPC's
	// ConnectionTimeout, whose own default is 120s). Zero means
	// DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// MaxConnectionIdle: a connection that has had no stream for this long
	// is sent GOAWAY and closed once the client acknowledges it (or 5s
	// later: gRPC's wait for the acknowledging ping). Zero means
	// DefaultMaxConnectionIdle; negative, never.
	MaxConnectionIdle time.Duration
	// MaxConnectionAge, when positive, sends a connection GOAWAY after it
	// and closes it, with whatever streams it still has, after a further
	// MaxConnectionAgeGrace (zero: no forced close). Zero, the default,
	// never does: it is the backstop against a client that stops reading
	// its stream, which only the connection's end releases.
	MaxConnectionAge, MaxConnectionAgeGrace time.Duration
}

// GRPCOptions returns the gRPC server options that set l's bounds.
func GRPCOptions(l GRPCLimits) []grpc.ServerOption {
	if l.MaxConcurrentStreams == 0 {
		l.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if l.KeepaliveMinTime <= 0 {
		l.KeepaliveMinTime = DefaultKeepaliveMinTime
	}
	if l.KeepaliveTime <= 0 {
		l.KeepaliveTime = DefaultKeepaliveTime
	}
	if l.KeepaliveTimeout <= 0 {
		l.KeepaliveTimeout = DefaultKeepaliveTimeout
	}
	if l.HandshakeTimeout <= 0 {
		l.HandshakeTimeout = DefaultHandshakeTimeout
	}
	sp := keepalive.ServerParameters{Time: l.KeepaliveTime, Timeout: l.KeepaliveTimeout}
	switch {
	case l.MaxConnectionIdle == 0:
		sp.MaxConnectionIdle = DefaultMaxConnectionIdle
	case l.MaxConnectionIdle > 0:
		sp.MaxConnectionIdle = l.MaxConnectionIdle
	}
	if l.MaxConnectionAge > 0 {
		sp.MaxConnectionAge = l.MaxConnectionAge
		sp.MaxConnectionAgeGrace = l.MaxConnectionAgeGrace
		if sp.MaxConnectionAgeGrace <= 0 {
			sp.MaxConnectionAgeGrace = time.Duration(1<<63 - 1)
		}
	}
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(l.MaxConcurrentStreams),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: l.KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(sp),
		grpc.ConnectionTimeout(l.HandshakeTimeout),
		grpc.InitialWindowSize(StreamWindowBytes),
		grpc.InitialConnWindowSize(ConnWindowBytes),
	}
}

package picker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
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
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	return s.serve(srv)
}

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

func (s *Server) serve(st stream) (err error) {
	x := s.pool.Get().(*exchange)
	x.reset(s, st)
	defer func() {
		x.finish(err)
		x.release()
		s.pool.Put(x)
	}()
	for {
		m, rerr := st.Recv()
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
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

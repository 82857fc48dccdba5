package fleetpick

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/internal/fronttest"
	"github.com/examlops/gateway/picker"
	"github.com/examlops/gateway/picker/pickertest"
)

const testModel = "m1"

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newFleet returns a fleet built as `exa serve picker` builds it (the
// Router's Attach hook), its metrics on reg, with o's other options.
func newFleet(t testing.TB, reg prometheus.Registerer, o fleet.Options) *fleet.Fleet {
	t.Helper()
	o.Registerer, o.Logger, o.Attach = reg, quietLogger(), Attach
	if o.MaxEjectionPercent == 0 {
		o.MaxEjectionPercent = 100 // pools of one or two ejected whole; the cap is tested in fleet
	}
	fl, err := fleet.New(o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = fl.Close() })
	return fl
}

// pickServer is a fleet serving testModel over replicas at the given
// addresses (nothing listens there: Pick only names endpoints).
func pickServer(t testing.TB, mode gateway.Mode, addrs ...string) *fleet.Fleet {
	t.Helper()
	s := newFleet(t, prometheus.NewRegistry(), fleet.Options{})
	var reps []config.Replica
	for i, a := range addrs {
		reps = append(reps, config.Replica{Name: fmt.Sprintf("r%d", i), Address: a})
	}
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {Mode: mode, Replicas: reps}}}))
	return s
}

// pickFixture is a Router over a fleet served over an in-process gRPC
// connection, with pickertest.Envoy in front of it playing Envoy: the
// fixture's http server is Envoy's listener, the engines are real HTTP
// servers (enginetest) that Envoy reaches at the picked ip:port.
type pickFixture struct {
	t       *testing.T
	srv     *fleet.Fleet
	http    *httptest.Server
	engines []*enginetest.Engine
	reg     *prometheus.Registry
	// handlers counts Envoy's handlers still running.
	handlers sync.WaitGroup
	picker   *Router
	client   *pickertest.Client
	envoy    *pickertest.Envoy
	// md, when set, gives each request's filter metadata (a subset hint).
	md func(*http.Request) *corev3.Metadata
}

// pickSetup adjusts a pickFixture before it starts.
type pickSetup struct {
	popts      Options
	maxFB      int           // picker.Options.MaxFallbacks
	noUpstream bool          // picker.Options.DisableUpstreamStream
	reqTimeout time.Duration // picker.Options.RequestTimeout
	// clock, when set, is the picker's clock (picker.Options.Clock) in
	// place of the frozen one.
	clock     func() time.Time
	fallbacks bool
	model     func(*config.Model)
	fleet     func(*fleet.Options)
	engine    func(i int, o *enginetest.Options)
	// address, when set, gives replica i's address in place of engine
	// e's (a server in front of it).
	address func(i int, e *enginetest.Engine) string
}

func newPickFixture(t *testing.T, n int, mode gateway.Mode, eopts enginetest.Options, setup pickSetup) *pickFixture {
	t.Helper()
	f := &pickFixture{t: t, reg: prometheus.NewRegistry()}
	var reps []config.Replica
	for i := range n {
		o := eopts
		o.Model = testModel
		o.Name = "e" + string(rune('0'+i))
		if setup.engine != nil {
			setup.engine(i, &o)
		}
		e := enginetest.New(o)
		t.Cleanup(e.Close)
		f.engines = append(f.engines, e)
		addr := e.URL()
		if setup.address != nil {
			addr = setup.address(i, e)
		}
		reps = append(reps, config.Replica{Name: o.Name, Address: addr})
	}
	var fo fleet.Options
	if setup.fleet != nil {
		setup.fleet(&fo)
	}
	s := newFleet(t, f.reg, fo)
	m := config.Model{Mode: mode, Replicas: reps}
	if setup.model != nil {
		setup.model(&m)
	}
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: m}}))
	f.srv = s
	popts := setup.popts
	popts.Registerer, popts.Logger = f.reg, quietLogger()
	var err error
	f.picker, err = New(s, popts)
	require.NoError(t, err)
	// The picker's clock is frozen, so that answers teach the gateway no
	// speed: an in-process engine's times are scheduling noise, which
	// would price replicas apart at random (gateway.CacheAware in
	// predicted time). Tests of speeds teach them themselves (teach).
	frozen := time.Unix(1e9, 0)
	clock := setup.clock
	if clock == nil {
		clock = func() time.Time { return frozen }
	}
	pk, err := picker.New(f.picker, picker.Options{MaxFallbacks: setup.maxFB, DisableUpstreamStream: setup.noUpstream, Clock: clock, RequestTimeout: setup.reqTimeout})
	require.NoError(t, err)
	lis := bufconn.Listen(1 << 20)
	g := grpc.NewServer()
	pk.Register(g)
	go func() { _ = g.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(); g.Stop() })
	f.client = pickertest.NewClient(conn)
	f.envoy = &pickertest.Envoy{Client: f.client, Fallbacks: setup.fallbacks, Metadata: func(r *http.Request) *corev3.Metadata {
		if f.md != nil {
			return f.md(r)
		}
		return nil
	}}
	f.http = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.handlers.Add(1)
		defer f.handlers.Done()
		f.envoy.ServeHTTP(w, r)
	}))
	t.Cleanup(f.http.Close)
	return f
}

// endpoint is engine i's ip:port.
func (f *pickFixture) endpoint(i int) string {
	return strings.TrimPrefix(f.engines[i].URL(), "http://")
}

// engineOf returns the index of the engine at endpoint ep, -1 if none.
func (f *pickFixture) engineOf(ep string) int {
	return slices.IndexFunc(f.engines, func(e *enginetest.Engine) bool { return strings.TrimPrefix(e.URL(), "http://") == ep })
}

// inFlight returns the model's in-flight count per replica.
func (f *pickFixture) inFlight() []int {
	var out []int
	for _, r := range f.srv.Snapshot().Models[testModel].Gateway.Replicas() {
		out = append(out, r.InFlight)
	}
	return out
}

// waitIdle polls until no request of the model is in flight, in the
// gateway and in the in-flight gauge: a stream that the client ended is
// finished by the picker's goroutine after the client sees it end.
func (f *pickFixture) waitIdle() {
	f.t.Helper()
	f.settle()
	deadline := time.Now().Add(10 * time.Second)
	for {
		fl := f.inFlight()
		g := fronttest.Gauge(f.t, f.reg, "exa_gateway_in_flight_requests", nil)
		if !slices.ContainsFunc(fl, func(n int) bool { return n != 0 }) && g == 0 {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("in flight per replica %v, gauge %v", fl, g)
		}
		time.Sleep(time.Millisecond)
	}
}

func (f *pickFixture) post(path, body string, hdr ...string) *http.Response {
	f.t.Helper()
	return fronttest.Post(f.t, f.http.URL, path, body, hdr...)
}

// settle waits for Envoy's handlers to finish.
func (f *pickFixture) settle() { f.handlers.Wait() }

// counter returns the value of a counter series (summed over the series
// whose labels include labels), 0 when absent.
func (f *pickFixture) counter(name string, labels map[string]string) float64 {
	f.t.Helper()
	f.settle()
	return fronttest.Counter(f.t, f.reg, name, labels)
}

// histCount returns the sample count of a histogram (summed over the
// matching series), 0 when absent.
func (f *pickFixture) histCount(name string, labels map[string]string) uint64 {
	f.t.Helper()
	f.settle()
	return fronttest.HistCount(f.t, f.reg, name, labels)
}

var chatBody = fronttest.ChatBody

var (
	readAll     = fronttest.ReadAll
	decodeError = fronttest.DecodeError
)

package httpgw

import (
	"context"
	"net"
	"net/http"
	"slices"
	"strings"
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
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/picker"
	"github.com/examlops/gateway/picker/pickertest"
)

// pickFixture is the Server's Picker served over an in-process gRPC
// connection, with pickertest.Envoy in front of it playing Envoy: the
// fixture's http server is Envoy's listener, the engines are real HTTP
// servers (enginetest) that Envoy reaches at the picked ip:port.
type pickFixture struct {
	*fixture
	picker *Picker
	client *pickertest.Client
	envoy  *pickertest.Envoy
	// md, when set, gives each request's filter metadata (a subset hint).
	md func(*http.Request) *corev3.Metadata
}

// pickSetup adjusts a pickFixture before it starts.
type pickSetup struct {
	popts     PickerOptions
	maxFB     int // picker.Options.MaxFallbacks
	fallbacks bool
	model     func(*config.Model)
	opts      func(*Options)
	engine    func(i int, o *enginetest.Options)
}

func newPickFixture(t *testing.T, n int, mode gateway.Mode, eopts enginetest.Options, setup pickSetup) *pickFixture {
	t.Helper()
	f := &pickFixture{fixture: &fixture{t: t, reg: prometheus.NewRegistry()}}
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
		reps = append(reps, config.Replica{Name: o.Name, Address: e.URL()})
	}
	opts := Options{Registerer: f.reg, Gatherer: f.reg, Logger: quietLogger()}
	if setup.opts != nil {
		setup.opts(&opts)
	}
	s, err := New(opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	m := config.Model{Mode: mode, Replicas: reps}
	if setup.model != nil {
		setup.model(&m)
	}
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: m}}))
	f.srv = s
	f.picker, err = s.Picker(setup.popts)
	require.NoError(t, err)
	pk, err := picker.New(f.picker, picker.Options{MaxFallbacks: setup.maxFB})
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
	f.http = newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.handlers.Add(1)
		defer f.handlers.Done()
		f.envoy.ServeHTTP(w, r)
	}))
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
		g := f.counter("exa_gateway_in_flight_requests", nil)
		if !slices.ContainsFunc(fl, func(n int) bool { return n != 0 }) && g == 0 {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("in flight per replica %v, gauge %v", fl, g)
		}
		time.Sleep(time.Millisecond)
	}
}

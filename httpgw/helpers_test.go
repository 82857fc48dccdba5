package httpgw

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/internal/fronttest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

const testModel = "m1"

// fixture is a gateway in front of fake engines.
type fixture struct {
	t       *testing.T
	srv     *Server
	http    *httptest.Server
	engines []*enginetest.Engine
	reg     *prometheus.Registry
	// handlers counts the gateway's handlers still running: a complete
	// answer reaches the client before the handler's bookkeeping, so
	// counter waits for them.
	handlers sync.WaitGroup
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newFixture starts n fake engines and a gateway serving testModel over
// them in the given mode.
func newFixture(t *testing.T, n int, mode gateway.Mode, eopts enginetest.Options, set ...func(*Options)) *fixture {
	t.Helper()
	var opts Options
	for _, o := range set {
		o(&opts)
	}
	return newFixtureOpts(t, n, mode, eopts, opts)
}

// newFixtureOpts is newFixture with the Server's options (its registry and
// logger are the fixture's).
func newFixtureOpts(t *testing.T, n int, mode gateway.Mode, eopts enginetest.Options, opts Options) *fixture {
	t.Helper()
	f := &fixture{t: t, reg: prometheus.NewRegistry()}
	var reps []config.Replica
	for i := range n {
		o := eopts
		o.Model = testModel
		o.Name = "e" + string(rune('0'+i))
		e := enginetest.New(o)
		t.Cleanup(e.Close)
		f.engines = append(f.engines, e)
		reps = append(reps, config.Replica{Name: o.Name, Address: e.URL()})
	}
	opts.Registerer, opts.Gatherer, opts.Logger = f.reg, f.reg, quietLogger()
	uncapped(&opts)
	s, err := New(opts)
	require.NoError(t, err)
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {Mode: mode, Replicas: reps}}}))
	f.srv = s
	f.http = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.handlers.Add(1)
		defer f.handlers.Done()
		s.ServeHTTP(w, r)
	}))
	t.Cleanup(f.http.Close)
	return f
}

func (f *fixture) post(path, body string, hdr ...string) *http.Response {
	f.t.Helper()
	return fronttest.Post(f.t, f.http.URL, path, body, hdr...)
}

// settle waits for the gateway's handlers to finish their bookkeeping.
func (f *fixture) settle() { f.handlers.Wait() }

// stats is the gateway's Stats once its handlers have finished.
func (f *fixture) stats() Stats {
	f.settle()
	return f.srv.Stats()
}

// series returns the series of the named metric whose labels include
// labels, from the fixture's registry once its handlers have finished.
func (f *fixture) series(name string, labels map[string]string) []*dto.Metric {
	f.t.Helper()
	f.settle()
	return fronttest.Series(f.t, f.reg, name, labels)
}

// counter returns the value of a counter series from the fixture's
// registry (summed over the matching series), 0 when absent, once its
// handlers have finished.
func (f *fixture) counter(name string, labels map[string]string) float64 {
	f.t.Helper()
	f.settle()
	return fronttest.Counter(f.t, f.reg, name, labels)
}

// histCount returns the sample count of a histogram series (summed over
// the matching series), 0 when absent.
func (f *fixture) histCount(name string, labels map[string]string) uint64 {
	f.t.Helper()
	f.settle()
	return fronttest.HistCount(f.t, f.reg, name, labels)
}

func newHTTPTestServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s
}

// rawEngine is a fake engine on a raw TCP listener: for each request it
// reads (head and body) it calls answer, which writes whatever bytes the
// test needs on the connection; answer returning false closes it.
func rawEngine(t *testing.T, answer func(c net.Conn, req *http.Request) bool) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var conns sync.WaitGroup
	t.Cleanup(func() {
		l.Close()
		conns.Wait()
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer conns.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					if !answer(c, req) {
						return
					}
				}
			}()
		}
	}()
	return "http://" + l.Addr().String()
}

// rawFixture is a gateway serving testModel from the engines at addrs
// (named e0, e1…) with opts, behind a net/http test server.
func rawFixture(t *testing.T, opts Options, addrs ...string) *fixture {
	t.Helper()
	f := &fixture{t: t, reg: prometheus.NewRegistry()}
	opts.Registerer, opts.Gatherer, opts.Logger = f.reg, f.reg, quietLogger()
	uncapped(&opts)
	s, err := New(opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	var reps []config.Replica
	for i, a := range addrs {
		reps = append(reps, config.Replica{Name: "e" + strconv.Itoa(i), Address: a})
	}
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {Replicas: reps}}}))
	f.srv = s
	f.http = newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.handlers.Add(1)
		defer f.handlers.Done()
		s.ServeHTTP(w, r)
	}))
	return f
}

var (
	readAll     = fronttest.ReadAll
	decodeError = fronttest.DecodeError
)

// uncapped lifts the ejection cap the options leave at its default: these
// tests eject engines of pools of one or two; the cap has tests of its
// own (fleet's TestProbeTimeoutsEjectAtMostTheShare).
func uncapped(o *Options) {
	if o.Fleet.MaxEjectionPercent == 0 {
		o.Fleet.MaxEjectionPercent = 100
	}
}

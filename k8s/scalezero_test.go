package k8s

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/flow"
	"github.com/examlops/gateway/httpgw"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/internal/fronttest"
	"github.com/examlops/gateway/picker"
	"github.com/examlops/gateway/picker/fleetpick"
	"github.com/examlops/gateway/picker/pickertest"
)

// front is a front with flow control under test: what discovery applies
// to, the client's handler, and its metrics.
type front struct {
	apply   Applier
	handler http.Handler
	reg     *prometheus.Registry
}

// joinApplier passes configurations on, noting when model m first got a
// replica.
type joinApplier struct {
	Applier
	joined atomic.Pointer[time.Time]
}

func (a *joinApplier) Apply(f *config.File) error {
	err := a.Applier.Apply(f)
	if now := time.Now(); err == nil && len(f.Models["m"].Replicas) > 0 {
		a.joined.CompareAndSwap(nil, &now)
	}
	return err
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// gatewayFront is the HTTP gateway with flow control o.
func gatewayFront(t *testing.T, o flow.Options) front {
	reg := prometheus.NewRegistry()
	s, err := httpgw.New(httpgw.Options{Flow: o, Registerer: reg, Gatherer: reg, Logger: quiet()})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; _ = s.Close() })
	return front{apply: s, handler: s, reg: reg}
}

// pickerFront is the endpoint picker with flow control o, reached through
// pickertest's Envoy over an in-memory gRPC connection.
func pickerFront(t *testing.T, o flow.Options) front {
	reg := prometheus.NewRegistry()
	fl, err := fleet.New(fleet.Options{Registerer: reg, Logger: quiet(), Attach: fleetpick.Attach})
	require.NoError(t, err)
	r, err := fleetpick.New(fl, fleetpick.Options{Flow: o, Registerer: reg, Logger: quiet()})
	require.NoError(t, err)
	pk, err := picker.New(r, picker.Options{})
	require.NoError(t, err)
	lis := bufconn.Listen(1 << 20)
	g := grpc.NewServer()
	pk.Register(g)
	go func() { _ = g.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = fl.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; conn.Close(); g.Stop(); _ = fl.Close() })
	return front{apply: fl, handler: &pickertest.Envoy{Client: pickertest.NewClient(conn)}, reg: reg}
}

// TestScaleFromZero: on a real API server, a pool with no ready pod; with
// flow control on, requests sent meanwhile wait in the queue, and when
// the pod turns ready (its endpoint joins through discovery) every one is
// served: none lost within its time in queue. Through the gateway and
// through the picker; it logs how long the held requests took after the
// pod's readiness was written.
func TestScaleFromZero(t *testing.T) {
	cfg, c := apiServer(t)
	const n = 8
	for _, tc := range []struct {
		name  string
		front func(*testing.T, flow.Options) front
	}{{"gateway", gatewayFront}, {"picker", pickerFront}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			ns := newNamespace(t, c)
			e := enginetest.New(enginetest.Options{Model: "m"})
			t.Cleanup(e.Close)
			u, err := url.Parse(e.URL())
			require.NoError(t, err)
			port, err := strconv.Atoi(u.Port())
			require.NoError(t, err)
			require.NoError(t, c.Create(ctx, makePool(ns, int32(port))))
			// The pod exists but is not ready (its engine booting).
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sim-0", Namespace: ns, Labels: map[string]string{"app": "sim"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "engine", Image: "sim"}}}}
			require.NoError(t, c.Create(ctx, pod))
			setReady(t, c, pod, u.Hostname(), false)

			f := tc.front(t, flow.Options{Enabled: true, Queue: flow.Config{TTL: time.Minute}})
			ja := &joinApplier{Applier: f.apply}
			d := runDiscovery(t, Options{Config: cfg, Namespace: ns, Pool: "pool", Models: []string{"m"},
				Template: config.Model{Mode: gateway.ModeCacheAware}}, ja)
			cached(t, d.Synced) // applied: model m, no replica
			require.Empty(t, d.Replicas())
			srv := httptest.NewServer(f.handler)
			t.Cleanup(srv.Close)

			type answer struct {
				status int
				body   string
				at     time.Time
			}
			answers := make(chan answer, n)
			for i := range n {
				go func() {
					resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json",
						strings.NewReader(fronttest.ChatBody("m", false, "sys", "cold start "+strconv.Itoa(i))))
					if err != nil {
						answers <- answer{-1, err.Error(), time.Now()}
						return
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					answers <- answer{resp.StatusCode, string(b), time.Now()}
				}()
			}
			held := time.NewTicker(5 * time.Millisecond)
			defer held.Stop()
			for fronttest.Gauge(t, f.reg, "exa_gateway_flow_queue_requests", map[string]string{"model": "m"}) != n {
				select {
				case a := <-answers:
					t.Fatalf("a request was answered while no pod was ready: %d %s", a.status, a.body)
				case <-held.C:
				}
			}
			require.Zero(t, e.Requests())

			setReady(t, c, pod, u.Hostname(), true)
			ready := time.Now()
			var took, bound []time.Duration
			for range n {
				a := <-answers
				require.Equal(t, http.StatusOK, a.status, a.body)
				took = append(took, a.at.Sub(ready))
				bound = append(bound, a.at.Sub(*ja.joined.Load()))
			}
			require.Equal(t, int64(n), e.Requests())
			require.Equal(t, float64(n), fronttest.Counter(t, f.reg, "exa_gateway_flow_requests_total",
				map[string]string{"model": "m", "outcome": "dispatched"}))
			slices.Sort(took)
			slices.Sort(bound)
			t.Logf("%s: %d held requests served after the pod turned ready: API write returned -> answer first %v, median %v, last %v; discovery's Apply -> answer first %v, last %v (discovery debounce %v, flow retry %v)",
				tc.name, n, took[0], took[n/2], took[n-1], bound[0], bound[n-1], DefaultDebounce, flow.DefaultRetry)
		})
	}
}

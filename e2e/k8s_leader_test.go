//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/examlops/gateway/internal/k8stest"
	"github.com/examlops/gateway/picker"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
)

// haPicker is one `exa serve picker` replica started with GIE's chart
// arguments for three replicas.
type haPicker struct {
	*gatewayProc
	ext, health string // ext_proc (TLS) and gRPC health addresses
}

// readiness asks the health port's readiness service, as the kubelet
// probes it under GIE's chart with replicas > 1; NOT_SERVING on error.
func (h *haPicker) status(t *testing.T, service string) healthpb.HealthCheckResponse_ServingStatus {
	select {
	case <-h.p.done:
		return healthpb.HealthCheckResponse_NOT_SERVING
	default:
	}
	return healthOf(t, h.health, service)
}

// extHealth asks the ext_proc port's own gRPC health service (over TLS).
func (h *haPicker) extHealth(t *testing.T) healthpb.HealthCheckResponse_ServingStatus {
	conn, err := grpc.NewClient(h.ext, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: picker.ServiceName})
	require.NoError(t, err)
	return r.GetStatus()
}

// TestKubernetesPickerLeaderElection runs `exa serve picker` replicas
// with the arguments GIE's InferencePool chart v1.5.0 renders for an
// SGLang pool of three replicas (cmd/exa/testdata/gie-chart-v1.5.0.json:
// the SGLang metric flags and --ha-enable-leader-election), against a
// real kube-apiserver. Two replicas: exactly one reports ready (health
// service "readiness", as the chart probes it) and SERVING on its
// ext_proc health, the other NOT_SERVING on both while live. SIGTERM to
// the leader: the other reports ready within the lease duration (the
// Lease is released). A third replica joins; SIGKILL to the leader (no
// release): the third reports ready once the lease has expired. Lease
// timings 4 s / 3 s / 0.5 s (EXA_MEASURE=1: the defaults, 15 s / 10 s /
// 2 s); the takeover times are logged.
func TestKubernetesPickerLeaderElection(t *testing.T) {
	requireBinaries(t)
	env, cfg, err := k8stest.Start()
	if errors.Is(err, k8stest.ErrNoAssets) {
		t.Skipf("skipping: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Stop() })
	kubeconfig := writeKubeconfig(t, env)
	s := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(s))
	require.NoError(t, giev1.Install(s))
	c, err := crclient.New(cfg, crclient.Options{Scheme: s})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "llm"}}))
	pool := &giev1.InferencePool{ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: "llm"}}
	pool.Spec.Selector.MatchLabels = map[giev1.LabelKey]giev1.LabelValue{"app": "sglang"}
	pool.Spec.TargetPorts = []giev1.Port{{Number: 8000}}
	pool.Spec.EndpointPickerRef.Name = "pool-epp"
	pool.Spec.EndpointPickerRef.Port = &giev1.Port{Number: 9002}
	require.NoError(t, c.Create(ctx, pool))

	// GIE's chart arguments, rendered by deploy/chart/charttest.
	b, err := os.ReadFile("../cmd/exa/testdata/gie-chart-v1.5.0.json")
	require.NoError(t, err)
	var renders []struct {
		ModelServerType, PluginsFile string
		Replicas                     int
		Args                         []string
	}
	require.NoError(t, json.Unmarshal(b, &renders))
	var args []string
	plugins := filepath.Join(t.TempDir(), "default-plugins.yaml")
	for _, r := range renders {
		if r.ModelServerType == "sglang" && r.Replicas == 3 {
			require.NoError(t, os.WriteFile(plugins, []byte(r.PluginsFile), 0o600))
			for _, a := range r.Args {
				args = append(args, strings.Replace(a, "/config/default-plugins.yaml", plugins, 1))
			}
		}
	}
	require.Contains(t, args, "--ha-enable-leader-election")
	lease := []string{"--leader-lease-duration", "4s", "--leader-renew-deadline", "3s", "--leader-retry-period", "500ms"}
	leaseDur, retry := 4*time.Second, 500*time.Millisecond
	if os.Getenv("EXA_MEASURE") != "" {
		lease, leaseDur, retry = nil, 15*time.Second, 2*time.Second
	}
	start := func(name string) *haPicker {
		ext, admin, health := freePort(t), freePort(t), freePort(t)
		// GIE's fixed ports (:9002, :9003, :9090 on all interfaces) are
		// replaced so that the replicas share the host.
		all := append([]string{"serve", "picker"}, args...)
		all = append(all, lease...)
		all = append(all, "--listen", "127.0.0.1:"+strconv.Itoa(ext), "--admin-listen", "127.0.0.1:"+strconv.Itoa(admin),
			"--grpc-health-port", strconv.Itoa(health), "--kubeconfig", kubeconfig, "--pool-model", simModel)
		h := &haPicker{gatewayProc: &gatewayProc{url: "http://127.0.0.1:" + strconv.Itoa(admin)},
			ext: "127.0.0.1:" + strconv.Itoa(ext), health: "127.0.0.1:" + strconv.Itoa(health)}
		h.p = startProc(t, name, []string{"EXA_CONFIG=" + filepath.Join(t.TempDir(), "routing.json"), "POD_NAME=" + name}, exaBin, all...)
		waitFor(t, 30*time.Second, name+" /healthz", func() bool { return get(h.url+"/healthz") == 200 })
		return h
	}
	ready := func(h *haPicker) bool {
		return h.status(t, "readiness") == healthpb.HealthCheckResponse_SERVING
	}
	// awaitOne polls every 10 ms until exactly one of ps is ready, never
	// seeing two, and returns it and the time taken.
	awaitOne := func(limit time.Duration, ps ...*haPicker) (*haPicker, time.Duration) {
		t0 := time.Now()
		for {
			var leaders []*haPicker
			for _, p := range ps {
				if ready(p) {
					leaders = append(leaders, p)
				}
			}
			require.LessOrEqual(t, len(leaders), 1, "two replicas ready at once")
			if len(leaders) == 1 {
				return leaders[0], time.Since(t0)
			}
			require.Less(t, time.Since(t0), limit, "no replica ready")
			time.Sleep(10 * time.Millisecond)
		}
	}
	a, b2 := start("picker-a"), start("picker-b")
	leader, took := awaitOne(2*leaseDur+10*time.Second, a, b2)
	follower := b2
	if leader == b2 {
		follower = a
	}
	t.Logf("a leader ready %v after both were live", took.Round(time.Millisecond))
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, follower.status(t, "liveness"))
	require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, follower.status(t, "readiness"))
	require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, follower.extHealth(t))
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, leader.extHealth(t))
	require.Equal(t, 1.0, leader.metric(t, "exa_picker_leader", nil))
	require.Equal(t, 0.0, follower.metric(t, "exa_picker_leader", nil))

	// Graceful stop (the kubelet's SIGTERM): the Lease is released.
	require.NoError(t, leader.p.cmd.Process.Signal(syscall.SIGTERM))
	stopped := time.Now()
	next, _ := awaitOne(2*leaseDur+10*time.Second, follower)
	graceful := time.Since(stopped)
	require.Equal(t, follower, next)
	t.Logf("SIGTERM to the leader: the other replica ready after %v", graceful.Round(time.Millisecond))
	require.LessOrEqual(t, graceful, leaseDur, "takeover after a graceful stop within the lease duration")
	<-leader.p.done

	// Crash (SIGKILL, nothing released): a third replica takes over once
	// the lease has expired.
	c3 := start("picker-c")
	require.False(t, ready(c3))
	require.True(t, ready(follower))
	follower.p.kill()
	killed := time.Now()
	next, _ = awaitOne(3*leaseDur+10*time.Second, c3)
	crash := time.Since(killed)
	require.Equal(t, c3, next)
	t.Logf("SIGKILL to the leader: the other replica ready after %v (lease duration %v, retry period %v)", crash.Round(time.Millisecond), leaseDur, retry)
	require.LessOrEqual(t, crash, leaseDur+3*retry+2*time.Second, "takeover after a crash: the lease duration and a few retries")
}

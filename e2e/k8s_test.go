//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/examlops/gateway/internal/k8stest"
	"github.com/examlops/gateway/picker/pickertest"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
)

// TestKubernetesPicker runs `exa serve picker --pool-name` (and `exa
// serve gateway --pool-name` beside it) against a real
// kube-apiserver and etcd (envtest; e2e/k8s/install.sh installs them)
// with GIE's InferencePool CRD. The pods are API objects whose status the
// test sets as a kubelet would (Ready, pod IP); each pod IP is a loopback
// address 127.0.0.1N on the pool's target port, forwarded to a real
// llm-d-inference-sim engine (the engines listen on all interfaces, so
// they cannot share one port). Requests flow through the picker, Envoy
// played by pickertest.Envoy, while pods are added and removed: no request
// may fail, the added pod must take requests and the removed one stop
// getting them.
func TestKubernetesPicker(t *testing.T) {
	requireBinaries(t)
	start := time.Now()
	env, cfg, err := k8stest.Start()
	if errors.Is(err, k8stest.ErrNoAssets) {
		t.Skipf("skipping: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Stop() })
	t.Logf("control plane (kube-apiserver + etcd) started in %v", time.Since(start).Round(time.Millisecond))
	kubeconfig := writeKubeconfig(t, env)
	s := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(s))
	require.NoError(t, giev1.Install(s))
	c, err := crclient.New(cfg, crclient.Options{Scheme: s})
	require.NoError(t, err)
	ctx := context.Background()
	const ns = "llm"
	require.NoError(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))

	// Three engines, each behind 127.0.0.1N:port.
	port := freePort(t)
	ips := []string{"127.0.0.11", "127.0.0.12", "127.0.0.13"}
	eps := map[string]*sim{}
	for _, ip := range ips {
		sp := freePort(t)
		eps[net.JoinHostPort(ip, strconv.Itoa(port))] = startSim(t, sp, simArgs(sp, 1024, 20*time.Microsecond))
		forward(t, net.JoinHostPort(ip, strconv.Itoa(port)), "127.0.0.1:"+strconv.Itoa(sp))
	}
	pool := &giev1.InferencePool{ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: ns}}
	pool.Spec.Selector.MatchLabels = map[giev1.LabelKey]giev1.LabelValue{"app": "sim"}
	pool.Spec.TargetPorts = []giev1.Port{{Number: giev1.PortNumber(port)}}
	pool.Spec.EndpointPickerRef.Name = "exa-picker"
	pool.Spec.EndpointPickerRef.Port = &giev1.Port{Number: 9002}
	require.NoError(t, c.Create(ctx, pool), "GIE's CRD accepts the pool")
	podPut(t, c, ns, "sim-0", ips[0], true)
	podPut(t, c, ns, "sim-1", ips[1], true)

	health := freePort(t)
	pp := startPickerProc(t, "picker", filepath.Join(t.TempDir(), "routing.json"),
		"--pool-name", "pool", "--pool-namespace", ns, "--pool-model", simModel, "--kubeconfig", kubeconfig,
		"--secure-serving=false", "--grpc-health-port", strconv.Itoa(health), "--log-format", "json")
	// The HTTP gateway follows the same pool.
	gport := freePort(t)
	gw := &gatewayProc{url: "http://127.0.0.1:" + strconv.Itoa(gport)}
	gw.p = startProc(t, "gateway", []string{"EXA_CONFIG=" + filepath.Join(t.TempDir(), "routing.json")}, exaBin, "serve", "gateway",
		"--listen", "127.0.0.1:"+strconv.Itoa(gport), "--probe-interval", "200ms", "--probe-timeout", "500ms", "--scrape-interval", "200ms",
		"--pool-name", "pool", "--pool-namespace", ns, "--pool-model", simModel, "--kubeconfig", kubeconfig)
	waitFor(t, 20*time.Second, "gateway /healthz", func() bool { return get(gw.url+"/healthz") == http.StatusOK })
	replicasOf := func(g *gatewayProc) []string {
		var names []string
		for _, m := range g.stats(t).Models {
			for _, r := range m.Replicas {
				names = append(names, r.Name)
			}
		}
		sort.Strings(names)
		return names
	}
	// replicas is the picker's replica list once the gateway's is the same.
	replicas := func() []string {
		p, g := replicasOf(pp.gatewayProc), replicasOf(gw)
		if fmt.Sprint(p) != fmt.Sprint(g) {
			return nil
		}
		return p
	}
	waitFor(t, 30*time.Second, "the picker and the gateway to discover sim-0 and sim-1", func() bool { return fmt.Sprint(replicas()) == "[sim-0 sim-1]" })
	for _, svc := range []string{"inference-extension", "liveness", "readiness"} {
		require.Equal(t, healthpb.HealthCheckResponse_SERVING, healthOf(t, "127.0.0.1:"+strconv.Itoa(health), svc), svc)
	}

	// Requests flow while pods come and go: two workers through the
	// picker (Envoy played by the Go client), two through the gateway.
	// Each worker cycles through 7 prompts of the current phase. Affinity
	// rightly keeps a prompt where its prefix is cached, so a pod that
	// joins takes new prompts, not old ones (on a run where every prompt
	// was cached before sim-2 joined, it got none in 30 s through the
	// picker): the phase moves on after each change of the pool, as live
	// traffic brings new prefixes.
	url := pp.envoy(t, false)
	var (
		phase   atomic.Int64
		mu      sync.Mutex
		served  = map[string]int{}
		failed  []string
		sent    atomic.Int64
		done    [4]atomic.Int64 // requests each worker has had answered
		stopReq = make(chan struct{})
		wg      sync.WaitGroup
		stopped sync.Once
	)
	// stop stops the workers; the cleanup stops them too when the test
	// fails first (they would otherwise spin on the killed processes,
	// thousands of failed requests a second, through the later tests).
	stop := func() { stopped.Do(func() { close(stopReq) }); wg.Wait() }
	t.Cleanup(stop)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stopReq:
					return
				default:
				}
				to := url
				if w >= 2 {
					to = gw.url
				}
				p := pickChatNoFail(to, chatJSON(fmt.Sprintf("worker %d phase %d group %d", w, phase.Load(), i%7), fmt.Sprintf("q%d", i), i%2 == 0, 4))
				sent.Add(1)
				mu.Lock()
				switch {
				case p.status != http.StatusOK:
					failed = append(failed, fmt.Sprintf("%s: %d %s", to, p.status, p.body))
				case w >= 2:
					served["gateway"]++
				default:
					served[p.endpoint]++
				}
				mu.Unlock()
				done[w].Add(1)
			}
		}()
	}
	servedBy := func(ep string) int { mu.Lock(); defer mu.Unlock(); return served[ep] }
	ep := func(i int) string { return net.JoinHostPort(ips[i], strconv.Itoa(port)) }
	waitFor(t, 30*time.Second, "requests on sim-0 and sim-1", func() bool { return servedBy(ep(0)) > 0 && servedBy(ep(1)) > 0 })

	// Scale up: sim-2 joins and takes requests.
	t0 := time.Now()
	podPut(t, c, ns, "sim-2", ips[2], true)
	waitFor(t, 30*time.Second, "sim-2 to join", func() bool { return fmt.Sprint(replicas()) == "[sim-0 sim-1 sim-2]" })
	joined := time.Since(t0)
	phase.Add(1)
	waitFor(t, 30*time.Second, "requests on sim-2", func() bool { return servedBy(ep(2)) > 0 })
	took := time.Since(t0) - joined

	// Scale down as a kubelet does: sim-0 turns unready (its deletion
	// started), leaves the table, drains, then its engine stops and the
	// pod object goes.
	t0 = time.Now()
	podPut(t, c, ns, "sim-0", ips[0], false)
	waitFor(t, 30*time.Second, "sim-0 to leave", func() bool { return fmt.Sprint(replicas()) == "[sim-1 sim-2]" })
	left := time.Since(t0)
	phase.Add(1)
	// A request picked before sim-0 left may still be on its way to it
	// (picked, not yet running there): each worker, which sends one at a
	// time, has two more answered, the second sent after the leave.
	var since [4]int64
	for w := range done {
		since[w] = done[w].Load()
	}
	waitFor(t, 30*time.Second, "every worker to have two more answers", func() bool {
		for w := range done {
			if done[w].Load() < since[w]+2 {
				return false
			}
		}
		return true
	})
	waitFor(t, 30*time.Second, "sim-0 to drain", func() bool { return running(t, eps[ep(0)].url()) == 0 })
	before := servedBy(ep(0))
	eps[ep(0)].kill()
	require.NoError(t, c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sim-0", Namespace: ns}}, crclient.GracePeriodSeconds(0)))
	// Keep sending until sim-1 and sim-2 have served more.
	b1, b2 := servedBy(ep(1)), servedBy(ep(2))
	bg := servedBy("gateway")
	waitFor(t, 30*time.Second, "more requests after the scale-down", func() bool {
		return servedBy(ep(1)) > b1+10 && servedBy(ep(2)) > b2+10 && servedBy("gateway") > bg+20
	})
	stop()
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, failed, "requests lost across scale-up and scale-down (%d sent)", sent.Load())
	require.Equal(t, before, served[ep(0)], "no request reached sim-0 after it left")
	// GIE's series, for GIE's dashboards.
	for _, g := range []*gatewayProc{pp.gatewayProc, gw} {
		require.Equal(t, 2.0, g.metric(t, "inference_pool_ready_pods", map[string]string{"name": "pool"}))
		require.Greater(t, g.metric(t, "inference_objective_request_total", map[string]string{"model_name": simModel}), 0.0)
	}
	t.Logf("%d requests, none lost; served %v; discovery: join seen on /stats %v after the API write (first request picked there %v later), leave %v",
		sent.Load(), served, joined.Round(time.Millisecond), took.Round(time.Millisecond), left.Round(time.Millisecond))

	// GIE's own chart's arguments (config/charts/epplib v1.5.0,
	// _deployment.yaml) with its plugins file: the picker starts with TLS
	// (self-signed, as GIE's), answers the probes the chart sets and
	// routes. --listen/--admin-listen and the health port replace GIE's
	// fixed ports so the test does not bind all interfaces.
	plugins := filepath.Join(t.TempDir(), "default-plugins.yaml")
	require.NoError(t, os.WriteFile(plugins, []byte("apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"+
		"plugins:\n- type: queue-scorer\n- type: prefix-cache-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n"), 0o600))
	gieHealth := freePort(t)
	gp := startPickerProcCreds(t, "gie-args-picker", filepath.Join(t.TempDir(), "routing.json"),
		credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}),
		"--pool-name", "pool", "--pool-namespace", ns, "--pool-group", "inference.networking.k8s.io",
		"--zap-encoder", "json", "--config-file", plugins, "--tracing=false", "--metrics-endpoint-auth=false",
		"--grpc-health-port", strconv.Itoa(gieHealth), "--pool-model", simModel, "--kubeconfig", kubeconfig)
	waitFor(t, 30*time.Second, "the GIE-args picker to discover sim-1 and sim-2", func() bool { return fmt.Sprint(replicasOf(gp.gatewayProc)) == "[sim-1 sim-2]" })
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, healthOf(t, "127.0.0.1:"+strconv.Itoa(gieHealth), "inference-extension"))
	p := pickChatNoFail(gp.envoy(t, false), chatJSON("gie", "args", false, 4))
	require.Equal(t, http.StatusOK, p.status, "%s", p.body)
	require.Contains(t, []string{ep(1), ep(2)}, p.endpoint)
}

// pickChatNoFail sends one chat request through Envoy and reports the
// outcome without failing the test (it runs off the test goroutine).
func pickChatNoFail(url string, body []byte) picked {
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return picked{status: -1, body: []byte(err.Error())}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return picked{status: -1, body: []byte(err.Error())}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return picked{status: resp.StatusCode, endpoint: resp.Header.Get(pickertest.HeaderEndpoint), picked: resp.Header.Get(pickertest.HeaderPicked), body: b}
}

// running is the engine's requests running plus waiting (its /metrics).
func running(t *testing.T, base string) float64 {
	fams := metricFamilies(t, base)
	n := 0.0
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting"} {
		for _, m := range fams[name].GetMetric() {
			n += m.GetGauge().GetValue()
		}
	}
	return n
}

// podPut creates the pod (if missing) and sets its status as a kubelet
// would: Running, the pod IP, condition Ready.
func podPut(t *testing.T, c crclient.Client, ns, name, ip string, ready bool) {
	t.Helper()
	ctx := context.Background()
	p := &corev1.Pod{}
	if err := c.Get(ctx, crclient.ObjectKey{Namespace: ns, Name: name}, p); err != nil {
		p = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "sim"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "engine", Image: "llm-d-inference-sim"}}}}
		require.NoError(t, c.Create(ctx, p))
	}
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}}
	require.NoError(t, c.Status().Update(ctx, p))
}

// healthOf asks a gRPC health service (plaintext).
func healthOf(t *testing.T, addr, service string) healthpb.HealthCheckResponse_ServingStatus {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	require.NoError(t, err, "health %s", service)
	return r.GetStatus()
}

// writeKubeconfig writes a kubeconfig of an admin user of env.
func writeKubeconfig(t *testing.T, env *envtest.Environment) string {
	t.Helper()
	u, err := env.ControlPlane.AddUser(envtest.User{Name: "e2e-admin", Groups: []string{"system:masters"}}, nil)
	require.NoError(t, err)
	kc, err := u.KubeConfig()
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(path, kc, 0o600))
	return path
}

// forward relays TCP connections from listen to target until the test
// ends: the pod IP in front of an engine.
func forward(t *testing.T, listen, target string) {
	t.Helper()
	ln, err := net.Listen("tcp", listen)
	require.NoError(t, err)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]bool{}
	)
	track := func(c net.Conn, on bool) {
		mu.Lock()
		defer mu.Unlock()
		if on {
			conns[c] = true
		} else {
			delete(conns, c)
			c.Close()
		}
	}
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			track(in, true)
			track(out, true)
			var pair sync.WaitGroup
			pair.Add(2)
			wg.Add(3)
			go func() {
				defer wg.Done()
				defer pair.Done()
				_, _ = io.Copy(out, in)
				_ = out.(*net.TCPConn).CloseWrite()
			}()
			go func() {
				defer wg.Done()
				defer pair.Done()
				_, _ = io.Copy(in, out)
				_ = in.(*net.TCPConn).CloseWrite()
			}()
			go func() { defer wg.Done(); pair.Wait(); track(in, false); track(out, false) }()
		}
	}()
}

package k8s

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/internal/k8stest"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
)

// The control plane is started once per test binary, by the first test
// that needs it, and stopped by TestMain.
var (
	envOnce sync.Once
	env     *envtest.Environment
	envCfg  *rest.Config
	envErr  error
	nsSeq   atomic.Int64
)

func TestMain(m *testing.M) {
	code := m.Run()
	if env != nil {
		_ = env.Stop()
	}
	os.Exit(code)
}

// apiServer returns the control plane's configuration and a client, or
// skips the test when kube-apiserver and etcd are not installed.
func apiServer(t *testing.T) (*rest.Config, client.Client) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts kube-apiserver and etcd; not with -short")
	}
	envOnce.Do(func() {
		start := time.Now()
		env, envCfg, envErr = k8stest.Start()
		if envErr == nil {
			fmt.Fprintf(os.Stderr, "k8s: control plane started in %v\n", time.Since(start).Round(time.Millisecond))
		}
	})
	if errors.Is(envErr, k8stest.ErrNoAssets) {
		t.Skipf("skipping: %v", envErr)
	}
	require.NoError(t, envErr)
	s := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(s))
	require.NoError(t, giev1.Install(s))
	c, err := client.New(envCfg, client.Options{Scheme: s})
	require.NoError(t, err)
	return envCfg, c
}

// newNamespace creates a namespace of its own for a test.
func newNamespace(t *testing.T, c client.Client) string {
	ns := fmt.Sprintf("t%d", nsSeq.Add(1))
	require.NoError(t, c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	return ns
}

// recorder is an Applier that passes every applied configuration on.
type recorder struct {
	files chan *config.File
	fail  atomic.Bool
}

func newRecorder() *recorder { return &recorder{files: make(chan *config.File, 1024)} }

func (r *recorder) Apply(f *config.File) error {
	if r.fail.Load() {
		return errors.New("refused")
	}
	r.files <- f
	return nil
}

// await returns the first applied configuration whose model m has the
// replicas named want (in order), and how long it took.
func (r *recorder) await(t *testing.T, m string, want ...string) (*config.File, time.Duration) {
	t.Helper()
	start := time.Now()
	timeout := time.After(60 * time.Second)
	var last []string
	for {
		select {
		case f := <-r.files:
			last = last[:0]
			for _, rep := range f.Models[m].Replicas {
				last = append(last, rep.Name)
			}
			if slices.Equal(last, want) || (len(want) == 0 && len(last) == 0) {
				return f, time.Since(start)
			}
		case <-timeout:
			t.Fatalf("model %q never got replicas %v (last applied %v)", m, want, last)
		}
	}
}

func makePool(ns string, ports ...int32) *giev1.InferencePool {
	p := testPool(ports...)
	p.Namespace = ns
	p.Spec.EndpointPickerRef.Name = "exa-picker" // required by the CRD
	p.Spec.EndpointPickerRef.Port = &giev1.Port{Number: 9002}
	return p
}

// startPod creates a pod labelled app and marks it ready with ip.
func startPod(t *testing.T, c client.Client, ns, name, app, ip string) {
	t.Helper()
	ctx := context.Background()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": app}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "engine", Image: "sim"}}}}
	require.NoError(t, c.Create(ctx, p))
	setReady(t, c, p, ip, true)
}

func setReady(t *testing.T, c client.Client, p *corev1.Pod, ip string, ready bool) {
	t.Helper()
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}}
	require.NoError(t, c.Status().Update(context.Background(), p))
}

func deletePod(t *testing.T, c client.Client, ns, name string) {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	// No kubelet here: delete at once, as a kubelet would after the pod stopped.
	require.NoError(t, c.Delete(context.Background(), p, client.GracePeriodSeconds(0)))
}

// cached waits until the discovery's watch caches satisfy cond: the
// informers see API writes a little after they return.
func cached(t *testing.T, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	timeout := time.After(60 * time.Second)
	for !cond() {
		select {
		case <-tick.C:
		case <-timeout:
			t.Fatal("the watch caches never caught up")
		}
	}
}

func runDiscovery(t *testing.T, o Options, a Applier) *Discovery {
	t.Helper()
	d, err := New(o, a)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return d
}

func TestDiscoveryPoolFollowsPods(t *testing.T) {
	cfg, c := apiServer(t)
	ctx := context.Background()
	ns := newNamespace(t, c)
	require.NoError(t, c.Create(ctx, makePool(ns, 8000)))
	startPod(t, c, ns, "sim-a", "sim", "127.0.0.11")
	startPod(t, c, ns, "other", "other", "127.0.0.99") // not selected
	rec := newRecorder()
	base := &config.File{Version: config.Version, Models: map[string]config.Model{"m": {Mode: 1}}}
	d := runDiscovery(t, Options{Config: cfg, Namespace: ns, Pool: "pool", Models: []string{"m"},
		Base: func() (*config.File, error) { return base, nil }}, rec)
	f, _ := rec.await(t, "m", "sim-a")
	require.Equal(t, "http://127.0.0.11:8000", f.Models["m"].Replicas[0].Address)
	require.Equal(t, base.Models["m"].Mode, f.Models["m"].Mode, "the base model's routing is kept")
	// Synced turns true just after the apply the recorder saw.
	cached(t, d.Synced)

	var lat []time.Duration
	startPod(t, c, ns, "sim-b", "sim", "127.0.0.12")
	_, dt := rec.await(t, "m", "sim-a", "sim-b")
	lat = append(lat, dt)
	// A pod that turns unready leaves; ready again, it rejoins.
	var b corev1.Pod
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "sim-b"}, &b))
	setReady(t, c, &b, "127.0.0.12", false)
	_, dt = rec.await(t, "m", "sim-a")
	lat = append(lat, dt)
	setReady(t, c, &b, "127.0.0.12", true)
	_, dt = rec.await(t, "m", "sim-a", "sim-b")
	lat = append(lat, dt)
	deletePod(t, c, ns, "sim-a")
	_, dt = rec.await(t, "m", "sim-b")
	lat = append(lat, dt)
	// The last pod leaving empties the model: that is the pool's state, not an error.
	deletePod(t, c, ns, "sim-b")
	_, dt = rec.await(t, "m")
	lat = append(lat, dt)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("discovery latency (API write returned -> Apply), %d changes: median %v, max %v (debounce %v)",
		len(lat), lat[len(lat)/2], lat[len(lat)-1], DefaultDebounce)

	// The pool's selector and ports change: the replicas follow.
	startPod(t, c, ns, "sim-c", "sim2", "127.0.0.13")
	var pool giev1.InferencePool
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pool"}, &pool))
	pool.Spec.Selector.MatchLabels = map[giev1.LabelKey]giev1.LabelValue{"app": "sim2"}
	pool.Spec.TargetPorts = []giev1.Port{{Number: 9000}, {Number: 9001}}
	require.NoError(t, c.Update(ctx, &pool))
	f, _ = rec.await(t, "m", "sim-c-rank-0", "sim-c-rank-1")
	require.Equal(t, "http://127.0.0.13:9001", f.Models["m"].Replicas[1].Address)

	// The pool deleted: the running configuration is kept (a pod joining
	// meanwhile is not applied); recreated, the pool is followed again.
	require.NoError(t, c.Delete(ctx, &pool))
	startPod(t, c, ns, "sim-d", "sim2", "127.0.0.14")
	cached(t, func() bool {
		var p corev1.Pod
		return apierrors.IsNotFound(d.cache.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pool"}, &giev1.InferencePool{})) &&
			d.cache.Get(ctx, client.ObjectKey{Namespace: ns, Name: "sim-d"}, &p) == nil && PodReady(&p)
	})
	d.Replicas() // a rebuild in progress has counted its Apply once this returns
	n := d.Applied()
	d.rebuild(ctx)
	require.Equal(t, n, d.Applied())
	require.Equal(t, "sim-c-rank-0", d.Replicas()[0].Name)
	pool2 := makePool(ns, 8000)
	pool2.Spec.Selector.MatchLabels = map[giev1.LabelKey]giev1.LabelValue{"app": "sim2"}
	require.NoError(t, c.Create(ctx, pool2))
	f, _ = rec.await(t, "m", "sim-c", "sim-d")
	require.Equal(t, "http://127.0.0.14:8000", f.Models["m"].Replicas[1].Address)
}

func TestDiscoveryBaseErrorKeepsRunning(t *testing.T) {
	cfg, c := apiServer(t)
	ctx := context.Background()
	ns := newNamespace(t, c)
	require.NoError(t, c.Create(ctx, makePool(ns, 8000)))
	startPod(t, c, ns, "sim-a", "sim", "127.0.0.21")
	var baseErr atomic.Bool
	rec := newRecorder()
	d := runDiscovery(t, Options{Config: cfg, Namespace: ns, Pool: "pool", Debounce: -1,
		Base: func() (*config.File, error) {
			if baseErr.Load() {
				return nil, errors.New("corrupt file")
			}
			return &config.File{Version: config.Version, Models: map[string]config.Model{"m": {}}}, nil
		}}, rec)
	rec.await(t, "m", "sim-a")
	// The recorder sees the configuration before Applied counts it; Synced
	// is set after the count.
	cached(t, d.Synced)
	// The base unreadable, or the Apply refused: nothing is applied, and
	// the last good replicas stay recorded.
	baseErr.Store(true)
	n := d.Applied()
	deletePod(t, c, ns, "sim-a")
	startPod(t, c, ns, "sim-b", "sim", "127.0.0.22")
	cached(t, func() bool {
		var p corev1.Pod
		return d.cache.Get(ctx, client.ObjectKey{Namespace: ns, Name: "sim-b"}, &p) == nil && PodReady(&p)
	})
	d.rebuild(ctx)
	require.Equal(t, n, d.Applied())
	require.Equal(t, "sim-a", d.Replicas()[0].Name)
	baseErr.Store(false)
	rec.fail.Store(true)
	d.rebuild(ctx)
	require.Equal(t, n, d.Applied())
	rec.fail.Store(false)
	d.Resync()
	rec.await(t, "m", "sim-b")
}

func TestDiscoveryServiceEndpointSlices(t *testing.T) {
	cfg, c := apiServer(t)
	ctx := context.Background()
	ns := newNamespace(t, c)
	// The API server refuses loopback addresses in EndpointSlices; nothing
	// connects to these.
	yes, no := true, false
	port, name := int32(8000), "http"
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "svc-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "svc"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.0.0.31"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes},
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "e-a"}},
			{Addresses: []string{"10.0.0.32"}, Conditions: discoveryv1.EndpointConditions{Ready: &no},
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "e-b"}},
		}}
	require.NoError(t, c.Create(ctx, slice))
	other := slice.DeepCopy()
	other.Name, other.Labels = "other-1", map[string]string{discoveryv1.LabelServiceName: "other"}
	other.ResourceVersion = ""
	require.NoError(t, c.Create(ctx, other))
	rec := newRecorder()
	d := runDiscovery(t, Options{Config: cfg, Namespace: ns, Service: "svc", ServicePort: "http", Models: []string{"m"}}, rec)
	rec.await(t, "m", "e-a")
	slice.Endpoints[1].Conditions.Ready = &yes
	require.NoError(t, c.Update(ctx, slice))
	f, _ := rec.await(t, "m", "e-a", "e-b")
	require.Equal(t, "http://10.0.0.32:8000", f.Models["m"].Replicas[1].Address)
	// The port renamed away from --service-port: ready endpoints, none on
	// the port named; the running replicas are kept, not emptied.
	// The recorder sees the configuration inside Apply, before Applied
	// counts it (Synced was already true from the first Apply); rebuild
	// holds d.mu until then, and Replicas takes it.
	require.Len(t, d.Replicas(), 2)
	n := d.Applied()
	web := "web"
	slice.Ports[0].Name = &web
	require.NoError(t, c.Update(ctx, slice))
	cached(t, func() bool {
		var s discoveryv1.EndpointSlice
		return d.cache.Get(ctx, client.ObjectKey{Namespace: ns, Name: "svc-1"}, &s) == nil && len(s.Ports) == 1 && *s.Ports[0].Name == web
	})
	d.rebuild(ctx)
	require.Equal(t, n, d.Applied(), "no configuration applied for a misnamed port")
	require.Len(t, d.Replicas(), 2)
	require.NoError(t, c.Delete(ctx, slice))
	rec.await(t, "m")
}

func TestNewRejects(t *testing.T) {
	cfg := &rest.Config{Host: "http://127.0.0.1:1"}
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Namespace: "n", Pool: "p"}, "no API server"},
		{Options{Config: cfg, Pool: "p"}, `namespace ""`},
		{Options{Config: cfg, Namespace: "n"}, `pool "", service "" and selector map[]: set exactly one`},
		{Options{Config: cfg, Namespace: "n", Pool: "p", Service: "s"}, `pool "p", service "s" and selector map[]: set exactly one`},
		{Options{Config: cfg, Namespace: "n", Pool: "p", PoolGroup: "inference.networking.x-k8s.io"}, `pool group "inference.networking.x-k8s.io"`},
		{Options{Config: cfg, Namespace: "n", Pool: "p", Models: []string{" m"}}, `" m"`},
	} {
		_, err := New(tc.o, newRecorder())
		require.ErrorContains(t, err, tc.want)
	}
	_, err := New(Options{Config: cfg, Namespace: "n", Pool: "p"}, nil)
	require.ErrorContains(t, err, "nil Applier")
}

// logBuffer collects log lines; safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.buf.String(), s)
}

// TestDiscoveryFailuresLoggedOnce: a pool that does not exist (yet) and
// a base configuration that cannot be read keep the running
// configuration and are logged once each time they begin, not at every
// rebuild: every pod event of the namespace and every reload tick (1 s)
// rebuilds.
func TestDiscoveryFailuresLoggedOnce(t *testing.T) {
	cfg, c := apiServer(t)
	ctx := context.Background()
	ns := newNamespace(t, c)
	var logs logBuffer
	var baseErr atomic.Bool
	rec := newRecorder()
	d := runDiscovery(t, Options{Config: cfg, Namespace: ns, Pool: "pool", Models: []string{"m"}, Debounce: -1,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Base: func() (*config.File, error) {
			if baseErr.Load() {
				return nil, errors.New("corrupt file")
			}
			return nil, nil
		}}, rec)
	const missing, unreadable = "InferencePool not found", "reading the base configuration failed"
	cached(t, func() bool { return logs.count(missing) > 0 }) // Run's first rebuild
	for range 3 {
		d.rebuild(ctx)
	}
	require.Equal(t, 1, logs.count(missing), "a missing pool logged at every rebuild")

	require.NoError(t, c.Create(ctx, makePool(ns, 8000)))
	startPod(t, c, ns, "sim-a", "sim", "127.0.0.41")
	rec.await(t, "m", "sim-a")
	baseErr.Store(true)
	for range 3 {
		d.rebuild(ctx)
	}
	require.Equal(t, 1, logs.count(unreadable), "an unreadable base logged at every rebuild")
	baseErr.Store(false)
	d.rebuild(ctx)
	baseErr.Store(true)
	d.rebuild(ctx)
	require.Equal(t, 2, logs.count(unreadable), "a new failure after a good read is logged")
	baseErr.Store(false)
	// A refused Apply is retried at each rebuild, logged once.
	rec.fail.Store(true)
	startPod(t, c, ns, "sim-b", "sim", "127.0.0.42")
	cached(t, func() bool {
		var p corev1.Pod
		return d.cache.Get(ctx, client.ObjectKey{Namespace: ns, Name: "sim-b"}, &p) == nil && PodReady(&p)
	})
	for range 3 {
		d.rebuild(ctx)
	}
	require.Equal(t, 1, logs.count("applying the discovered replicas failed"), "a refused Apply logged at every rebuild")
	rec.fail.Store(false)
	d.rebuild(ctx)
	rec.await(t, "m", "sim-a", "sim-b")

	// Deleted, the pool is missing again: logged once more.
	require.NoError(t, c.Delete(ctx, makePool(ns, 8000)))
	cached(t, func() bool {
		return apierrors.IsNotFound(d.cache.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pool"}, &giev1.InferencePool{}))
	})
	for range 3 {
		d.rebuild(ctx)
	}
	require.Equal(t, 2, logs.count(missing))
	require.Len(t, d.Replicas(), 2, "the running replicas kept")
}

// TestDiscoveryTooManyReplicasLoggedOnce: more ready endpoints than a
// model may have (gateway.MaxReplicas) keep the first and are logged
// when that begins, not at every rebuild (every event of the Service's
// slices and every reload tick rebuilds), as the other failures are.
func TestDiscoveryTooManyReplicasLoggedOnce(t *testing.T) {
	cfg, c := apiServer(t)
	ctx := context.Background()
	ns := newNamespace(t, c)
	yes := true
	port, name := int32(8000), "http"
	const perSlice, slices = 1000, 5 // the API server's most endpoints a slice
	var made []*discoveryv1.EndpointSlice
	for s := range slices {
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: fmt.Sprintf("svc-%d", s), Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "svc"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port}}}
		for i := range perSlice {
			slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.%d.%d.%d", 1+s, i/250, 1+i%250)},
				Conditions: discoveryv1.EndpointConditions{Ready: &yes}})
		}
		require.NoError(t, c.Create(ctx, slice))
		made = append(made, slice)
	}
	var logs logBuffer
	rec := newRecorder()
	d := runDiscovery(t, Options{Config: cfg, Namespace: ns, Service: "svc", Models: []string{"m"}, Debounce: -1,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}, rec)
	const tooMany = "more replicas than a model may have"
	cached(t, func() bool { return len(d.Replicas()) == gateway.MaxReplicas })
	for range 3 {
		d.rebuild(ctx)
	}
	require.Equal(t, 1, logs.count(tooMany), "too many replicas logged at every rebuild")
	// Fewer again, then too many once more: logged again.
	last := made[slices-1]
	require.NoError(t, c.Delete(ctx, last))
	cached(t, func() bool { return len(d.Replicas()) == (slices-1)*perSlice })
	d.rebuild(ctx)
	require.Equal(t, 1, logs.count(tooMany))
	last.ResourceVersion, last.UID = "", ""
	require.NoError(t, c.Create(ctx, last))
	cached(t, func() bool { return len(d.Replicas()) == gateway.MaxReplicas })
	d.rebuild(ctx)
	require.Equal(t, 2, logs.count(tooMany))
}

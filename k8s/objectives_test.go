package k8s

import (
	"context"
	"maps"
	"net/http"
	"net/http/httptest"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"
)

func objective(name, pool string, prio *int, created int64) v1alpha2.InferenceObjective {
	return v1alpha2.InferenceObjective{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.Unix(created, 0)},
		Spec:       v1alpha2.InferenceObjectiveSpec{Priority: prio, PoolRef: v1alpha2.PoolObjectReference{Group: DefaultPoolGroup, Kind: "InferencePool", Name: v1alpha2.ObjectName(pool)}}}
}

func TestPoolObjectives(t *testing.T) {
	p := func(v int) *int { return &v }
	deleting := objective("gone", "pool", p(5), 1)
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Unix(9, 0)}
	otherGroup := objective("alpha", "pool", p(5), 1)
	otherGroup.Spec.PoolRef.Group = "inference.networking.x-k8s.io"
	noGroup := objective("nogroup", "pool", p(3), 1)
	noGroup.Spec.PoolRef.Group = ""
	for _, tc := range []struct {
		name    string
		items   []v1alpha2.InferenceObjective
		max     int
		want    map[string]int
		dropped int
	}{
		{"none", nil, 4, map[string]int{}, 0},
		{"pool's only", []v1alpha2.InferenceObjective{objective("chat", "pool", p(10), 1), objective("other", "pool2", p(7), 1)}, 4,
			map[string]int{"chat": 10}, 0},
		{"unset priority is 0, negative kept", []v1alpha2.InferenceObjective{objective("default", "pool", nil, 1), objective("batch", "pool", p(-1), 1)}, 4,
			map[string]int{"default": 0, "batch": -1}, 0},
		// GIE's reconciler takes an objective only when its poolRef's
		// group is the pool's; "" (written out: the CRD defaults an
		// absent group) is the core group, which has no InferencePool.
		{"deleting, other group and empty group ignored", []v1alpha2.InferenceObjective{deleting, otherGroup, noGroup}, 4,
			map[string]int{}, 0},
		{"past max the oldest kept, then by name", []v1alpha2.InferenceObjective{
			objective("new", "pool", p(1), 30), objective("b", "pool", p(2), 10), objective("a", "pool", p(3), 10), objective("mid", "pool", p(4), 20)}, 3,
			map[string]int{"a": 3, "b": 2, "mid": 4}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, dropped := PoolObjectives("pool", tc.items, tc.max)
			require.Equal(t, tc.want, m)
			require.Equal(t, tc.dropped, dropped)
		})
	}
}

func TestWatchObjectivesRejects(t *testing.T) {
	cfg := &rest.Config{Host: "http://127.0.0.1:1"}
	set := func(map[string]int) {}
	for _, tc := range []struct {
		o    ObjectiveOptions
		set  func(map[string]int)
		want string
	}{
		{ObjectiveOptions{Namespace: "n", Pool: "p"}, set, "no API server"},
		{ObjectiveOptions{Config: cfg, Pool: "p"}, set, `namespace ""`},
		{ObjectiveOptions{Config: cfg, Namespace: "n"}, set, `pool ""`},
		{ObjectiveOptions{Config: cfg, Namespace: "n", Pool: "p", Max: -1}, set, "objective limit -1"},
		{ObjectiveOptions{Config: cfg, Namespace: "n", Pool: "p"}, nil, "nil objectives setter"},
	} {
		require.ErrorContains(t, WatchObjectives(context.Background(), tc.o, tc.set), tc.want)
	}
}

// TestWatchObjectivesNoCRD: an API server that does not serve
// InferenceObjectives (GIE's CRDs not installed; here a stub whose
// discovery lists no group) is ErrNoObjectiveKind, at once, and set is
// never called: the CLI then logs a warning and keeps --objective's.
func TestWatchObjectivesNoCRD(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api":
			_, _ = w.Write([]byte(`{"kind":"APIVersions","versions":["v1"],"serverAddressByClientCIDRs":[]}`))
		case "/apis":
			_, _ = w.Write([]byte(`{"kind":"APIGroupList","apiVersion":"v1","groups":[]}`))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	err := WatchObjectives(context.Background(), ObjectiveOptions{Config: &rest.Config{Host: srv.URL}, Namespace: "n", Pool: "p"},
		func(map[string]int) { t.Error("objectives set without the kind") })
	require.ErrorIs(t, err, ErrNoObjectiveKind)
}

// objectiveSets records what WatchObjectives sets.
type objectiveSets chan map[string]int

// await returns once the objectives set equal want, and how long it took.
func (s objectiveSets) await(t *testing.T, want map[string]int) time.Duration {
	t.Helper()
	start := time.Now()
	timeout := time.After(60 * time.Second)
	var last map[string]int
	for {
		select {
		case m := <-s:
			if last = m; maps.Equal(m, want) {
				return time.Since(start)
			}
		case <-timeout:
			t.Fatalf("objectives never became %v (last set %v)", want, last)
		}
	}
}

func objectiveClient(t *testing.T, cfg *rest.Config) client.Client {
	s := runtime.NewScheme()
	require.NoError(t, v1alpha2.Install(s))
	c, err := client.New(cfg, client.Options{Scheme: s})
	require.NoError(t, err)
	return c
}

func runObjectives(t *testing.T, o ObjectiveOptions) objectiveSets {
	t.Helper()
	sets := make(objectiveSets, 1024)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- WatchObjectives(ctx, o, func(m map[string]int) { sets <- m }) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return sets
}

// TestWatchObjectives: on a real API server with GIE's CRDs, the pool's
// InferenceObjectives created, updated and deleted change the objectives
// set; one naming another pool is ignored; past Max the newest is left
// out until an older one goes.
func TestWatchObjectives(t *testing.T) {
	cfg, c0 := apiServer(t)
	ctx := context.Background()
	ns := newNamespace(t, c0)
	c := objectiveClient(t, cfg)
	create := func(name, pool string, prio *int) {
		t.Helper()
		o := objective(name, pool, prio, 0)
		o.CreationTimestamp, o.Namespace = metav1.Time{}, ns
		require.NoError(t, c.Create(ctx, &o))
	}
	p := func(v int) *int { return &v }
	create("interactive", "pool", p(10))
	sets := runObjectives(t, ObjectiveOptions{Config: cfg, Namespace: ns, Pool: "pool", Max: 3})
	var lat []time.Duration
	sets.await(t, map[string]int{"interactive": 10})

	create("batch", "pool", nil) // unset priority: 0, as GIE
	lat = append(lat, sets.await(t, map[string]int{"interactive": 10, "batch": 0}))
	create("elsewhere", "other-pool", p(99))
	create("scavenger", "pool", p(-5))
	lat = append(lat, sets.await(t, map[string]int{"interactive": 10, "batch": 0, "scavenger": -5}))

	var o v1alpha2.InferenceObjective
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "batch"}, &o))
	o.Spec.Priority = p(2)
	require.NoError(t, c.Update(ctx, &o))
	lat = append(lat, sets.await(t, map[string]int{"interactive": 10, "batch": 2, "scavenger": -5}))

	// A fourth past Max 3 is left out (the newest; of equal creation
	// seconds, the last by name), while a change to the others is seen;
	// it comes in when an older one goes.
	create("zzz-late", "pool", p(7))
	var s v1alpha2.InferenceObjective
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "scavenger"}, &s))
	s.Spec.Priority = p(-6)
	require.NoError(t, c.Update(ctx, &s))
	lat = append(lat, sets.await(t, map[string]int{"interactive": 10, "batch": 2, "scavenger": -6}))
	require.NoError(t, c.Delete(ctx, &o))
	lat = append(lat, sets.await(t, map[string]int{"interactive": 10, "scavenger": -6, "zzz-late": 7}))

	// Moved to another pool: it leaves.
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "interactive"}, &o))
	o.Spec.PoolRef.Name = "other-pool"
	require.NoError(t, c.Update(ctx, &o))
	lat = append(lat, sets.await(t, map[string]int{"scavenger": -6, "zzz-late": 7}))
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("objectives: API write returned -> set, %d changes: median %v, max %v (debounce %v)",
		len(lat), lat[len(lat)/2], lat[len(lat)-1], DefaultDebounce)
}

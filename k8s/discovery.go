package k8s

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
)

// DefaultPoolGroup is the API group of the InferencePool kind, the only
// one supported (as GIE v1.5.0's --pool-group default).
const DefaultPoolGroup = giev1.GroupName

// DefaultDebounce is how long a burst of events is coalesced before one
// Apply, when Options.Debounce is 0.
const DefaultDebounce = 50 * time.Millisecond

// Applier receives the configurations discovery builds; *fleet.Fleet
// satisfies it.
type Applier interface {
	Apply(*config.File) error
}

// Options configure a [Discovery]. Config, Namespace and one of Pool and
// Service are required.
type Options struct {
	// Config reaches the API server.
	Config *rest.Config
	// Namespace holds the pool or Service and its pods.
	Namespace string
	// Pool names an InferencePool whose pods are the replicas; "" when
	// Service is used.
	Pool string
	// PoolGroup is the InferencePool's API group; "" means
	// DefaultPoolGroup, the only one supported.
	PoolGroup string
	// Service names a Service whose ready EndpointSlice endpoints are the
	// replicas; "" when Pool is used.
	Service string
	// ServicePort names the EndpointSlice port to use; "" means each
	// slice's first port.
	ServicePort string
	// Selector, with TargetPorts, is GIE's standalone mode
	// (--endpoint-selector, --endpoint-target-ports): the ready pods of
	// Namespace matching these labels are the replicas, one per target
	// port, as for a pool of that spec with no InferencePool object
	// (ParseSelector, ParsePorts). nil when Pool or Service is used.
	Selector    map[string]string
	TargetPorts []int
	// Models are the models the discovered replicas serve; nil means every
	// model of the base configuration that is not disaggregated.
	Models []string
	// Template is the configuration of a model of Models that the base
	// configuration does not define; its zero value is round-robin.
	Template config.Model
	// Base returns the configuration the replicas are merged into (the
	// routing configuration file); nil means an empty one. An error keeps
	// the running configuration.
	Base func() (*config.File, error)
	// Debounce is how long events are coalesced before an Apply; 0 means
	// DefaultDebounce, negative means none.
	Debounce time.Duration
	// Logger logs applied changes and errors; nil discards.
	Logger *slog.Logger
}

// Discovery watches an InferencePool and its pods, or a Service's
// EndpointSlices, and applies the replicas they list. Its methods are safe
// for concurrent use. Create it with [New] and start it with Run.
type Discovery struct {
	o      Options
	apply  Applier
	cache  cache.Cache
	kick   chan struct{}
	synced atomic.Bool

	mu       sync.Mutex       // serialises rebuilds; guards last, lastRep, baseErr and applyErr
	last     *config.File     // last applied configuration
	lastRep  []config.Replica // its discovered replicas
	baseErr  string           // the base configuration's last read error, "" after a good read
	applyErr string           // the last Apply's error, "" after an Apply made
	applied  atomic.Int64     // count of Applies made
	// portMissing: the last listing had ready endpoints but no port
	// named ServicePort (logged when it becomes so).
	portMissing atomic.Bool
	// poolMissing: the InferencePool was not found at the last rebuild
	// (logged when it becomes so).
	poolMissing atomic.Bool
	// tooMany: the last listing had more than gateway.MaxReplicas
	// replicas (logged when it becomes so).
	tooMany atomic.Bool
}

// sources counts the discovery sources set.
func sources(set ...bool) int {
	n := 0
	for _, b := range set {
		if b {
			n++
		}
	}
	return n
}

// New checks o and returns a Discovery that applies to apply.
func New(o Options, apply Applier) (*Discovery, error) {
	switch {
	case o.Config == nil:
		return nil, errors.New("k8s: no API server configuration")
	case o.Namespace == "":
		return nil, errors.New("k8s: invalid namespace \"\": must be set")
	case sources(o.Pool != "", o.Service != "", o.Selector != nil) != 1:
		return nil, fmt.Errorf("k8s: invalid pool %q, service %q and selector %v: set exactly one", o.Pool, o.Service, o.Selector)
	case o.Selector != nil && len(o.Selector) == 0:
		return nil, errors.New("k8s: invalid selector {}: want at least one label")
	case o.Selector != nil && (len(o.TargetPorts) == 0 || len(o.TargetPorts) > MaxTargetPorts):
		return nil, fmt.Errorf("k8s: invalid target ports %v: want 1 to %d with a selector", o.TargetPorts, MaxTargetPorts)
	case o.Selector == nil && len(o.TargetPorts) > 0:
		return nil, fmt.Errorf("k8s: invalid target ports %v: only with a selector (a pool's are its targetPorts)", o.TargetPorts)
	case apply == nil:
		return nil, errors.New("k8s: nil Applier")
	}
	seen := map[int]bool{}
	for _, p := range o.TargetPorts {
		if p < 1 || p > 65535 || seen[p] {
			return nil, fmt.Errorf("k8s: invalid target ports %v: %d is not a port (1-65535) or is listed twice", o.TargetPorts, p)
		}
		seen[p] = true
	}
	if o.PoolGroup == "" {
		o.PoolGroup = DefaultPoolGroup
	}
	if o.PoolGroup != DefaultPoolGroup {
		return nil, fmt.Errorf("k8s: invalid pool group %q: only %s (InferencePool v1) is supported", o.PoolGroup, DefaultPoolGroup)
	}
	for _, m := range o.Models {
		if err := config.ValidateModelName(m); err != nil {
			return nil, err
		}
	}
	if o.Debounce == 0 {
		o.Debounce = DefaultDebounce
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := giev1.Install(scheme); err != nil {
		return nil, err
	}
	byObject := map[client.Object]cache.ByObject{}
	if o.Service != "" {
		byObject[&discoveryv1.EndpointSlice{}] = cache.ByObject{
			Label: labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: o.Service})}
	}
	c, err := cache.New(o.Config, cache.Options{Scheme: scheme,
		DefaultNamespaces: map[string]cache.Config{o.Namespace: {}},
		DefaultTransform:  cache.TransformStripManagedFields(),
		ByObject:          byObject})
	if err != nil {
		return nil, fmt.Errorf("k8s: %w", err)
	}
	return &Discovery{o: o, apply: apply, cache: c, kick: make(chan struct{}, 1)}, nil
}

// Synced reports whether the watches have synced and the first
// configuration was applied: a picker is ready then.
func (d *Discovery) Synced() bool { return d.synced.Load() }

// Replicas returns the replicas last applied (sorted by name); nil before
// the first Apply.
func (d *Discovery) Replicas() []config.Replica {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]config.Replica(nil), d.lastRep...)
}

// Applied returns how many configurations discovery has applied.
func (d *Discovery) Applied() int64 { return d.applied.Load() }

// Resync asks for the configuration to be rebuilt (for example when the
// base file changed); it is applied only if it differs from the last.
func (d *Discovery) Resync() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// Run watches until ctx ends, applying each change. It returns an error
// when the watches cannot start or sync.
func (d *Discovery) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	objs := []client.Object{&corev1.Pod{}, &giev1.InferencePool{}}
	switch {
	case d.o.Service != "":
		objs = []client.Object{&discoveryv1.EndpointSlice{}}
	case d.o.Selector != nil:
		objs = []client.Object{&corev1.Pod{}}
	}
	h := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { d.Resync() },
		UpdateFunc: func(any, any) { d.Resync() },
		DeleteFunc: func(any) { d.Resync() },
	}
	for _, o := range objs {
		inf, err := d.cache.GetInformer(ctx, o)
		if err != nil {
			return fmt.Errorf("k8s: watch %T: %w", o, err)
		}
		if _, err := inf.AddEventHandler(h); err != nil {
			return fmt.Errorf("k8s: watch %T: %w", o, err)
		}
	}
	errc := make(chan error, 1)
	go func() { errc <- d.cache.Start(ctx) }()
	if !d.cache.WaitForCacheSync(ctx) {
		cancel()
		if err := <-errc; err != nil {
			return fmt.Errorf("k8s: watches did not sync: %w", err)
		}
		return fmt.Errorf("k8s: watches did not sync: %w", ctx.Err())
	}
	d.o.Logger.Info("k8s: watching", "namespace", d.o.Namespace, "pool", d.o.Pool, "service", d.o.Service, "selector", d.o.Selector, "target_ports", d.o.TargetPorts)
	d.rebuild(ctx)
	var timer *time.Timer
	for {
		select {
		case <-ctx.Done():
			return <-errc
		case <-d.kick:
		}
		if d.o.Debounce > 0 {
			// Coalesce the burst: events arriving meanwhile refill kick,
			// which the next rebuild's read of the cache covers.
			if timer == nil {
				timer = time.NewTimer(d.o.Debounce)
			} else {
				timer.Reset(d.o.Debounce)
			}
			select {
			case <-ctx.Done():
				timer.Stop()
				return <-errc
			case <-timer.C:
			}
			select {
			case <-d.kick:
			default:
			}
		}
		d.rebuild(ctx)
	}
}

// rebuild reads the caches and the base configuration and applies the
// result when it differs from the last applied one.
// Rebuilds are serialised, so an older view is never applied after a
// newer one.
func (d *Discovery) rebuild(ctx context.Context) {
	d.mu.Lock()
	defer d.mu.Unlock()
	reps, ok := d.discover(ctx)
	if !ok {
		return
	}
	var base *config.File
	if d.o.Base != nil {
		b, err := d.o.Base()
		if err != nil {
			// Logged once per distinct error: every reload tick rebuilds.
			if msg := err.Error(); msg != d.baseErr {
				d.baseErr = msg
				d.o.Logger.Error("k8s: reading the base configuration failed; keeping the running configuration", "err", err)
			}
			return
		}
		d.baseErr = ""
		base = b
	}
	if len(reps) > gateway.MaxReplicas {
		// Logged when it becomes so: every event and reload tick rebuilds.
		if !d.tooMany.Swap(true) {
			d.o.Logger.Error("k8s: more replicas than a model may have; keeping the first", "replicas", len(reps), "max", gateway.MaxReplicas)
		}
		reps = reps[:gateway.MaxReplicas]
	} else {
		d.tooMany.Store(false)
	}
	next := Merge(base, d.o.Models, d.o.Template, reps)
	if d.last != nil && reflect.DeepEqual(d.last, next) {
		d.synced.Store(true)
		return
	}
	if err := d.apply.Apply(next); err != nil {
		// Retried at each rebuild, logged once per distinct error.
		if msg := err.Error(); msg != d.applyErr {
			d.applyErr = msg
			d.o.Logger.Error("k8s: applying the discovered replicas failed; keeping the running configuration", "err", err, "replicas", len(reps))
		}
		return
	}
	d.applyErr = ""
	d.applied.Add(1)
	d.o.Logger.Info("k8s: replicas applied", "replicas", len(reps), "models", len(next.Models))
	d.last, d.lastRep = next, reps
	d.synced.Store(true)
}

// discover lists the replicas from the caches; false when the source is
// missing or unreadable (the running configuration is kept).
func (d *Discovery) discover(ctx context.Context) ([]config.Replica, bool) {
	if d.o.Service != "" {
		var list discoveryv1.EndpointSliceList
		if err := d.cache.List(ctx, &list, client.InNamespace(d.o.Namespace),
			client.MatchingLabels{discoveryv1.LabelServiceName: d.o.Service}); err != nil {
			d.o.Logger.Error("k8s: listing EndpointSlices failed", "err", err)
			return nil, false
		}
		if ports, missing := missingPort(list.Items, d.o.ServicePort); missing {
			if !d.portMissing.Swap(true) {
				d.o.Logger.Warn("k8s: the Service's ready endpoints have no port of the name given; keeping the running configuration",
					"namespace", d.o.Namespace, "service", d.o.Service, "service_port", d.o.ServicePort, "ports", ports)
			}
			return nil, false
		}
		d.portMissing.Store(false)
		return SliceReplicas(list.Items, d.o.ServicePort), true
	}
	if d.o.Selector != nil {
		return d.podReplicas(ctx, standalonePool(d.o.Namespace, d.o.Selector, d.o.TargetPorts))
	}
	var pool giev1.InferencePool
	if err := d.cache.Get(ctx, types.NamespacedName{Namespace: d.o.Namespace, Name: d.o.Pool}, &pool); err != nil {
		if apierrors.IsNotFound(err) {
			// Logged when it becomes so: every pod event of the
			// namespace and every reload tick rebuilds.
			if !d.poolMissing.Swap(true) {
				d.o.Logger.Warn("k8s: InferencePool not found; keeping the running configuration", "namespace", d.o.Namespace, "pool", d.o.Pool)
			}
		} else {
			d.o.Logger.Error("k8s: reading the InferencePool failed", "err", err)
		}
		return nil, false
	}
	d.poolMissing.Store(false)
	return d.podReplicas(ctx, &pool)
}

// podReplicas lists the replicas of pool from the pod cache.
func (d *Discovery) podReplicas(ctx context.Context, pool *giev1.InferencePool) ([]config.Replica, bool) {
	var pods corev1.PodList
	if err := d.cache.List(ctx, &pods, client.InNamespace(d.o.Namespace),
		client.MatchingLabelsSelector{Selector: PoolSelector(pool)}); err != nil {
		d.o.Logger.Error("k8s: listing pods failed", "err", err)
		return nil, false
	}
	return PoolReplicas(pool, pods.Items), true
}

package k8s

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"
)

// Flow control's objectives from GIE's InferenceObjective resources
// (inference.networking.x-k8s.io/v1alpha2, GIE v1.5.0
// apix/v1alpha2/inferenceobjective_types.go): an objective's
// metadata.name is what a request names in x-gateway-inference-objective,
// spec.priority its priority (unset is 0), spec.poolRef the pool it
// belongs to. The objectives of a pool are those whose poolRef names it
// in the InferencePool's group (the CRD's default for an absent group; an
// explicit "" is the core group) and are not being deleted, as GIE's
// reconciler keeps them (pkg/epp/controller/inferenceobjective_reconciler.go).

// MaxObjectives is the most objectives of one pool WatchObjectives passes
// on when ObjectiveOptions.Max is 0. Every priority is a label value of
// flow control's series and a band of each model's queue, and anyone who
// may create InferenceObjectives in the namespace adds one, so the count
// is bounded: 256 is far past the handful of classes a pool has (GIE's
// guides use 2-3) and keeps the map and the series small (at most 257
// priorities, with 0, per model and series).
const MaxObjectives = 256

// ErrNoObjectiveKind is returned by WatchObjectives when the API server
// does not serve InferenceObjectives (GIE's CRD is not installed).
var ErrNoObjectiveKind = errors.New("k8s: the API server does not serve InferenceObjective (" + v1alpha2.GroupName + "/v1alpha2); install GIE's CRDs")

// ObjectiveOptions configure WatchObjectives. Config, Namespace and Pool
// are required.
type ObjectiveOptions struct {
	// Config reaches the API server.
	Config *rest.Config
	// Namespace holds the pool and its InferenceObjectives.
	Namespace string
	// Pool names the InferencePool whose objectives are watched.
	Pool string
	// Max is the most objectives passed on; 0 means MaxObjectives. Past
	// it the oldest are kept (by creation time, then name), so objectives
	// created later cannot displace those already in use.
	Max int
	// Debounce is how long events are coalesced; 0 means
	// DefaultDebounce, negative means none.
	Debounce time.Duration
	// Logger logs changes and errors; nil discards.
	Logger *slog.Logger
}

// WatchObjectives watches the InferenceObjectives of o.Namespace until ctx
// ends, and calls set with the objectives of o.Pool (name to priority)
// once the watch has synced and after each change that alters them. set
// is called from one goroutine and must not modify the map. It returns
// when ctx ends (nil), or an error when the watch cannot start or sync
// (ErrNoObjectiveKind when the CRD is absent).
func WatchObjectives(ctx context.Context, o ObjectiveOptions, set func(map[string]int)) error {
	switch {
	case o.Config == nil:
		return errors.New("k8s: no API server configuration")
	case o.Namespace == "":
		return errors.New("k8s: invalid namespace \"\": must be set")
	case o.Pool == "":
		return errors.New("k8s: invalid pool \"\": must be set")
	case o.Max < 0:
		return fmt.Errorf("k8s: invalid objective limit %d: must not be negative", o.Max)
	case set == nil:
		return errors.New("k8s: nil objectives setter")
	}
	if o.Max == 0 {
		o.Max = MaxObjectives
	}
	if o.Debounce == 0 {
		o.Debounce = DefaultDebounce
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	scheme := runtime.NewScheme()
	if err := v1alpha2.Install(scheme); err != nil {
		return err
	}
	c, err := cache.New(o.Config, cache.Options{Scheme: scheme,
		DefaultNamespaces: map[string]cache.Config{o.Namespace: {}},
		DefaultTransform:  slimObjective})
	if err != nil {
		return fmt.Errorf("k8s: %w", err)
	}
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	kick := make(chan struct{}, 1)
	poke := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	inf, err := c.GetInformer(ctx, &v1alpha2.InferenceObjective{})
	if err != nil {
		if meta.IsNoMatchError(err) {
			return fmt.Errorf("%w: %v", ErrNoObjectiveKind, err)
		}
		return fmt.Errorf("k8s: watch InferenceObjectives: %w", err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { poke() }, UpdateFunc: func(any, any) { poke() }, DeleteFunc: func(any) { poke() },
	}); err != nil {
		return fmt.Errorf("k8s: watch InferenceObjectives: %w", err)
	}
	errc := make(chan error, 1)
	go func() { errc <- c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		cancel()
		if err := <-errc; err != nil {
			return fmt.Errorf("k8s: the InferenceObjective watch did not sync: %w", err)
		}
		if parent.Err() != nil {
			return nil
		}
		return errors.New("k8s: the InferenceObjective watch did not sync")
	}
	var last map[string]int
	lastDropped := 0
	first := true
	var timer *time.Timer
	for {
		var list v1alpha2.InferenceObjectiveList
		if err := c.List(ctx, &list, client.InNamespace(o.Namespace)); err != nil {
			o.Logger.Error("k8s: listing InferenceObjectives failed; keeping the objectives", "err", err)
		} else {
			m, dropped := PoolObjectives(o.Pool, list.Items, o.Max)
			if dropped != lastDropped && dropped > 0 {
				o.Logger.Error("k8s: more InferenceObjectives than accepted; the newest are ignored",
					"pool", o.Pool, "objectives", len(m)+dropped, "max", o.Max)
			}
			lastDropped = dropped
			if first || !maps.Equal(m, last) {
				o.Logger.Info("k8s: objectives", "pool", o.Pool, "objectives", len(m))
				set(m)
				last, first = m, false
			}
		}
		select {
		case <-ctx.Done():
			return <-errc
		case <-kick:
		}
		if o.Debounce > 0 {
			if timer == nil {
				timer = time.NewTimer(o.Debounce)
			} else {
				timer.Reset(o.Debounce)
			}
			select {
			case <-ctx.Done():
				timer.Stop()
				return <-errc
			case <-timer.C:
			}
			select {
			case <-kick:
			default:
			}
		}
	}
}

// PoolObjectives returns the objectives among items that belong to pool
// (spec.poolRef names it, in the InferencePool's group; not being
// deleted), name to priority (unset is 0), at most max of them (max > 0):
// the oldest by creation time, then name. dropped counts those left out.
func PoolObjectives(pool string, items []v1alpha2.InferenceObjective, max int) (m map[string]int, dropped int) {
	mine := make([]*v1alpha2.InferenceObjective, 0, len(items))
	for i := range items {
		o := &items[i]
		ref := o.Spec.PoolRef
		if string(ref.Name) != pool || string(ref.Group) != DefaultPoolGroup || o.DeletionTimestamp != nil {
			continue
		}
		mine = append(mine, o)
	}
	slices.SortFunc(mine, func(a, b *v1alpha2.InferenceObjective) int {
		return cmp.Or(a.CreationTimestamp.Time.Compare(b.CreationTimestamp.Time), strings.Compare(a.Name, b.Name))
	})
	if len(mine) > max {
		dropped, mine = len(mine)-max, mine[:max]
	}
	m = make(map[string]int, len(mine))
	for _, o := range mine {
		p := 0
		if o.Spec.Priority != nil {
			p = *o.Spec.Priority
		}
		m[o.Name] = p
	}
	return m, dropped
}

// slimObjective keeps of an InferenceObjective only what PoolObjectives
// reads (and the cache's keys), so the watch cache holds little per
// object whatever labels, annotations or status they carry.
func slimObjective(obj any) (any, error) {
	o, ok := obj.(*v1alpha2.InferenceObjective)
	if !ok {
		return obj, nil
	}
	return &v1alpha2.InferenceObjective{TypeMeta: o.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: o.Name, Namespace: o.Namespace, UID: o.UID, ResourceVersion: o.ResourceVersion,
			CreationTimestamp: o.CreationTimestamp, DeletionTimestamp: o.DeletionTimestamp},
		Spec: o.Spec}, nil
}

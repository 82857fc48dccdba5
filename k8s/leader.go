package k8s

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// Leader election defaults: those of controller-runtime's manager, which
// GIE's endpoint picker (v1.5.0) uses with --ha-enable-leader-election.
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// LeaseName returns the Lease GIE's endpoint picker (v1.5.0,
// pkg/epp/server/controller_manager.go) elects its leader with for the
// InferencePool pool in namespace: the same name, so that GIE's pickers
// and these never lead one pool together, and GIE's chart's Role (any
// Lease in the namespace) covers it.
func LeaseName(namespace, pool string) string {
	return fmt.Sprintf("epp-%s-%s.gateway-api-inference-extension.sigs.k8s.io", namespace, pool)
}

// LeaderOptions configure a Leader.
type LeaderOptions struct {
	// Config is the cluster's client configuration; required.
	Config *rest.Config
	// Namespace and Name name the Lease (coordination.k8s.io/v1); both
	// required. The Lease is created when absent.
	Namespace, Name string
	// Identity is this candidate's holder identity; default $POD_NAME
	// (else the host name) followed by "_" and 8 random bytes in hex, as
	// controller-runtime's hostname_UUID.
	Identity string
	// LeaseDuration is how long a follower waits, from the last renewal
	// it saw, before taking the Lease over (default DefaultLeaseDuration,
	// 15s); RenewDeadline how long the leader retries its renewal before
	// giving up leadership (default DefaultRenewDeadline, 10s); RetryPeriod
	// how often candidates try (default DefaultRetryPeriod, 2s). They must
	// satisfy LeaseDuration > RenewDeadline > RetryPeriod × 1.2.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Logger receives client-go's leader election log lines and the
	// changes of leadership; default slog.Default().
	Logger *slog.Logger
	// OnChange, when set, is called with true when this candidate starts
	// leading and false when it stops, in that order, from the election's
	// goroutines, one call at a time; it must not call the Leader.
	OnChange func(leading bool)
}

// Leader campaigns for a Lease with client-go's leader election
// (tools/leaderelection, a LeaseLock) and reports whether it holds it.
// Leadership lost (a renewal failed past RenewDeadline) is campaigned for
// again, without exiting. Stopping Run releases a held Lease (its
// duration set to 1 s), so a follower takes over at its next retry rather
// than after LeaseDuration. Safe for concurrent use.
type Leader struct {
	opts LeaderOptions
	lock *resourcelock.LeaseLock

	mu      sync.Mutex
	leading bool
	term    context.Context // the term leading was set for
	holder  string          // the last leader observed
}

// NewLeader checks o and returns a Leader; Run campaigns. An invalid
// option is an error naming it.
func NewLeader(o LeaderOptions) (*Leader, error) {
	if o.Config == nil {
		return nil, errors.New("k8s: leader election: Config is required")
	}
	if o.Namespace == "" || o.Name == "" {
		return nil, fmt.Errorf("k8s: leader election: Lease namespace %q and name %q are required", o.Namespace, o.Name)
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.RenewDeadline == 0 {
		o.RenewDeadline = DefaultRenewDeadline
	}
	if o.RetryPeriod == 0 {
		o.RetryPeriod = DefaultRetryPeriod
	}
	if err := CheckLeaseTimes(o.LeaseDuration, o.RenewDeadline, o.RetryPeriod); err != nil {
		return nil, err
	}
	if o.Identity == "" {
		id, err := defaultIdentity()
		if err != nil {
			return nil, err
		}
		o.Identity = id
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	// Each request is bounded by half the renew deadline (at least 1 s),
	// as controller-runtime bounds its leader election client: one hung
	// renewal leaves time to retry before the term is given up.
	cfg := rest.CopyConfig(o.Config)
	cfg.Timeout = max(o.RenewDeadline/2, time.Second)
	client, err := coordinationv1.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("k8s: leader election: %w", err)
	}
	return &Leader{opts: o, lock: &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: o.Namespace, Name: o.Name},
		Client:     client,
		LockConfig: resourcelock.ResourceLockConfig{Identity: o.Identity},
	}}, nil
}

// CheckLeaseTimes returns an error naming the three durations unless
// lease > renew > 1.2 × retry > 0, as client-go's leader election wants.
func CheckLeaseTimes(lease, renew, retry time.Duration) error {
	if lease > renew && renew > time.Duration(leaderelection.JitterFactor*float64(retry)) && retry > 0 {
		return nil
	}
	return fmt.Errorf("k8s: leader election: lease duration %v, renew deadline %v, retry period %v: want lease duration > renew deadline > %v x retry period > 0",
		lease, renew, retry, leaderelection.JitterFactor)
}

// defaultIdentity is $POD_NAME (else the host name), "_", 8 random bytes.
func defaultIdentity() (string, error) {
	name := os.Getenv("POD_NAME")
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return "", fmt.Errorf("k8s: leader election: identity: %w", err)
		}
		name = h
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	return name + "_" + hex.EncodeToString(b[:]), nil
}

// Identity returns this candidate's holder identity.
func (l *Leader) Identity() string { return l.opts.Identity }

// Leading reports whether this candidate holds the Lease.
func (l *Leader) Leading() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leading
}

// Holder returns the identity of the last leader this candidate saw
// holding the Lease (itself when leading), "" before any.
func (l *Leader) Holder() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.holder
}

// set records leadership (leading true only while term, the term's
// context, is live) or the end of term. A term's goroutine that runs
// late, after the next term began, thus cannot end the next one.
func (l *Leader) set(term context.Context, leading bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !leading && term != l.term {
		return
	}
	l.change(term, leading)
}

// stopped records the end of whatever term is current: OnStoppedLeading,
// which client-go calls before any later term begins.
func (l *Leader) stopped() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.change(l.term, false)
}

// change records leadership and reports a change; l.mu is held.
func (l *Leader) change(term context.Context, leading bool) {
	if l.leading == leading || leading && term.Err() != nil {
		return
	}
	l.leading = leading
	l.term = nil
	if leading {
		l.term = term
	}
	l.opts.Logger.Info("k8s: leader election", "leading", leading, "identity", l.opts.Identity,
		"lease", l.opts.Namespace+"/"+l.opts.Name)
	if l.opts.OnChange != nil {
		l.opts.OnChange(leading)
	}
}

// Run campaigns until ctx is done, then releases the Lease if it holds
// it and returns (nil). Call it once.
func (l *Leader) Run(ctx context.Context) error {
	ctx = klog.NewContext(ctx, logr.FromSlogHandler(l.opts.Logger.Handler()))
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: l.lock, LeaseDuration: l.opts.LeaseDuration, RenewDeadline: l.opts.RenewDeadline,
			RetryPeriod: l.opts.RetryPeriod, ReleaseOnCancel: true, Name: l.opts.Name,
			Callbacks: leaderelection.LeaderCallbacks{
				// The term's context ends before OnStoppedLeading runs.
				OnStartedLeading: func(term context.Context) {
					l.set(term, true)
					<-term.Done()
					l.set(term, false)
				},
				OnStoppedLeading: l.stopped,
				OnNewLeader: func(id string) {
					l.mu.Lock()
					l.holder = id
					l.mu.Unlock()
				},
			},
		})
		if err != nil {
			return fmt.Errorf("k8s: leader election: %w", err)
		}
		le.Run(ctx)
		if ctx.Err() == nil {
			// Lost: wait a retry period before campaigning again.
			select {
			case <-ctx.Done():
			case <-time.After(l.opts.RetryPeriod):
			}
		}
	}
	return nil
}

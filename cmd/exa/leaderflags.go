package main

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/examlops/gateway/k8s"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
)

// leaderFlags are the lease timings of --ha-enable-leader-election (GIE's
// flag, in gieFlags); GIE's picker has none and uses controller-runtime's
// defaults, which these default to.
type leaderFlags struct {
	lease, renew, retry time.Duration
}

// register declares the lease timing flags on f.
func (l *leaderFlags) register(f *pflag.FlagSet) {
	f.DurationVar(&l.lease, "leader-lease-duration", k8s.DefaultLeaseDuration,
		"with --ha-enable-leader-election: how long after the leader's last renewal another replica takes the Lease over (a stopped leader releases it at once)")
	f.DurationVar(&l.renew, "leader-renew-deadline", k8s.DefaultRenewDeadline,
		"with --ha-enable-leader-election: how long the leader retries renewing the Lease before it stops leading (below --leader-lease-duration)")
	f.DurationVar(&l.retry, "leader-retry-period", k8s.DefaultRetryPeriod,
		"with --ha-enable-leader-election: how often the replicas try to take or renew the Lease")
}

// startLeader campaigns for the pool's Lease when --ha-enable-leader-election
// is set: leading then reports whether this replica leads (always true
// without), onChange is called on every change, and the gauge
// exa_picker_leader is registered on reg (onChange(false) is called
// first). stop releases the Lease if held and returns once the campaign
// has ended (at most --leader-renew-deadline); calling it again waits for
// the same.
func (fl *pickerFlags) startLeader(reg prometheus.Registerer, logger *slog.Logger, onChange func(bool)) (leading func() bool, stop func(), err error) {
	if !fl.gie.leaderElection {
		return func() bool { return true }, func() {}, nil
	}
	rc, err := fl.disc.restConfig()
	if err != nil {
		return nil, nil, err
	}
	ns, pool := fl.disc.namespace(), fl.disc.sourceName()
	l := fl.gie.leader
	el, err := k8s.NewLeader(k8s.LeaderOptions{Config: rc, Namespace: ns, Name: k8s.LeaseName(ns, pool),
		LeaseDuration: l.lease, RenewDeadline: l.renew, RetryPeriod: l.retry, Logger: logger, OnChange: onChange})
	if err != nil {
		return nil, nil, err // the timings were checked by gieFlags.apply
	}
	if err := reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "exa_picker_leader",
		Help: "1 while this picker replica holds the pool's Lease (--ha-enable-leader-election), else 0."},
		func() float64 {
			if el.Leading() {
				return 1
			}
			return 0
		})); err != nil {
		return nil, nil, err
	}
	logger.Info("k8s: leader election on", "lease", ns+"/"+k8s.LeaseName(ns, pool), "identity", el.Identity(),
		"lease_duration", l.lease, "renew_deadline", l.renew, "retry_period", l.retry)
	onChange(false)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = el.Run(ctx) }()
	var once sync.Once
	return el.Leading, func() { once.Do(func() { cancel(); <-done }) }, nil
}

package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/examlops/gateway/flow"
)

// flowFlags are flow control's flags (--flow-*, --objective), shared by
// `exa serve gateway` and `exa serve picker`; options turns them into
// flow.Options.
type flowFlags struct {
	on                bool
	ttl, retry        time.Duration
	maxBytes, bandMax int64
	maxReqs, bandReqs int
	maxFlows          int
	fairness, order   string
	fairnessHeader    string
	objectives        []string
	usageLimits       []string
}

func (f *flowFlags) register(fs *pflag.FlagSet) {
	fs.BoolVar(&f.on, "flow-control", false,
		"flow control: hold a model's requests past capacity (no replica with room under --shed-*, or none healthy) in a queue by priority and fairness, instead of answering 429, and route each when its turn comes (docs/flow-control.md)")
	fs.DurationVar(&f.ttl, "flow-ttl", flow.DefaultTTL, "flow control: longest a request waits in the queue; then 503")
	fs.Int64Var(&f.maxBytes, "flow-max-bytes", flow.DefaultMaxBytes, "flow control: bytes of request bodies all queues hold together (one budget for the process); past it a request displaces a longer flow's newest in its model's queue, or gets 429")
	fs.IntVar(&f.maxReqs, "flow-max-requests", flow.DefaultMaxRequests, "flow control: requests all queues hold together")
	fs.Int64Var(&f.bandMax, "flow-band-max-bytes", 0, "flow control: bytes one priority band holds (0 = --flow-max-bytes)")
	fs.IntVar(&f.bandReqs, "flow-band-max-requests", 0, "flow control: requests one priority band holds (0 = --flow-max-requests)")
	fs.IntVar(&f.maxFlows, "flow-max-flows", flow.DefaultMaxFlows, "flow control: fairness ids a priority band tells apart; more share one overflow flow")
	fs.StringVar(&f.fairness, "flow-fairness", "round-robin", "flow control: how a band's flows share it: round-robin (flows take turns) or global-strict (oldest first, GIE's default)")
	fs.StringVar(&f.order, "flow-order", "fcfs", "flow control: order within a flow: fcfs or edf (earliest deadline first)")
	fs.StringVar(&f.fairnessHeader, "fairness-header", flow.HeaderFairnessID, "flow control: the header carrying a request's fairness id (a tenant, a tier, an API key)")
	fs.StringArrayVar(&f.objectives, "objective", nil,
		"flow control: NAME=PRIORITY, an objective a request names in "+flow.HeaderObjective+" and its priority (higher first; negative: sheddable, never queued); repeatable; unnamed or unknown objectives have priority 0")
	fs.StringArrayVar(&f.usageLimits, "flow-usage-limit", nil,
		"flow control: PRIORITY=FRACTION, a band's usage limit (GIE's UsageLimitPolicy), 0 < FRACTION <= 1: its requests have room only under the --shed-* thresholds scaled by it, leaving headroom for higher bands; repeatable; unlisted priorities have 1")
	fs.DurationVar(&f.retry, "flow-retry", flow.DefaultRetry, "flow control: how often held requests are tried again between requests ending")
}

// options returns the flags as flow.Options, or a usage error naming the
// first bad flag and its value.
func (f *flowFlags) options() (flow.Options, error) {
	o := flow.Options{Enabled: f.on, FairnessHeader: f.fairnessHeader, Retry: f.retry,
		Queue: flow.Config{TTL: f.ttl, MaxFlows: f.maxFlows,
			Total: flow.Limits{MaxBytes: f.maxBytes, MaxRequests: f.maxReqs}, Band: flow.Limits{MaxBytes: f.bandMax, MaxRequests: f.bandReqs}}}
	switch {
	case f.ttl <= 0:
		return o, usagef("invalid --flow-ttl %q: must be positive", f.ttl)
	case f.retry <= 0:
		return o, usagef("invalid --flow-retry %q: must be positive", f.retry)
	case f.maxBytes < 1:
		return o, usagef("invalid --flow-max-bytes %q: must be at least 1", fmt.Sprint(f.maxBytes))
	case f.maxReqs < 1:
		return o, usagef("invalid --flow-max-requests %q: must be at least 1", fmt.Sprint(f.maxReqs))
	case f.bandMax < 0:
		return o, usagef("invalid --flow-band-max-bytes %q: must not be negative", fmt.Sprint(f.bandMax))
	case f.bandReqs < 0:
		return o, usagef("invalid --flow-band-max-requests %q: must not be negative", fmt.Sprint(f.bandReqs))
	case f.maxFlows < 1:
		return o, usagef("invalid --flow-max-flows %q: must be at least 1", fmt.Sprint(f.maxFlows))
	case strings.TrimSpace(f.fairnessHeader) == "" || strings.ContainsAny(f.fairnessHeader, " :\t"):
		return o, usagef("invalid --fairness-header %q: want a header name", f.fairnessHeader)
	}
	switch f.fairness {
	case "round-robin":
		o.Queue.Fairness = flow.RoundRobin
	case "global-strict":
		o.Queue.Fairness = flow.GlobalStrict
	default:
		return o, usagef("invalid --flow-fairness %q: want round-robin or global-strict", f.fairness)
	}
	switch f.order {
	case "fcfs":
		o.Queue.Order = flow.FCFS
	case "edf":
		o.Queue.Order = flow.EDF
	default:
		return o, usagef("invalid --flow-order %q: want fcfs or edf", f.order)
	}
	for _, kv := range f.objectives {
		name, p, ok := strings.Cut(kv, "=")
		prio, err := strconv.Atoi(p)
		if !ok || name == "" || err != nil {
			return o, usagef("invalid --objective %q: want NAME=PRIORITY, PRIORITY an integer", kv)
		}
		if o.Objectives == nil {
			o.Objectives = map[string]int{}
		}
		if _, dup := o.Objectives[name]; dup {
			return o, usagef("invalid --objective %q: objective %q is named twice", kv, name)
		}
		o.Objectives[name] = prio
	}
	if (len(f.objectives) > 0) && !f.on {
		return o, usagef("invalid --objective %q: objectives need --flow-control", f.objectives[0])
	}
	limits, err := usageLimits(f.usageLimits)
	if err != nil {
		return o, err
	}
	if len(limits) > 0 && !f.on {
		return o, usagef("invalid --flow-usage-limit %q: usage limits need --flow-control", f.usageLimits[0])
	}
	o.UsageLimits = limits
	return o, nil
}

// usageLimits parses --flow-usage-limit values, PRIORITY=FRACTION with
// 0 < FRACTION <= 1, each priority once; nil for none.
func usageLimits(kvs []string) (map[int]float64, error) {
	var m map[int]float64
	for _, kv := range kvs {
		p, v, ok := strings.Cut(kv, "=")
		prio, perr := strconv.Atoi(p)
		c, cerr := strconv.ParseFloat(v, 64)
		if !ok || perr != nil || cerr != nil || !flow.ValidUsageLimit(c) {
			return nil, usagef("invalid --flow-usage-limit %q: want PRIORITY=FRACTION, PRIORITY an integer, 0 < FRACTION <= 1", kv)
		}
		if m == nil {
			m = map[int]float64{}
		}
		if _, dup := m[prio]; dup {
			return nil, usagef("invalid --flow-usage-limit %q: priority %d is named twice", kv, prio)
		}
		m[prio] = c
	}
	return m, nil
}

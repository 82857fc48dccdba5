package main

import (
	"fmt"
	"math"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/examlops/gateway/flow"
)

// rateFlags are --rate-limit and its companions: both fronts' (each
// client's request rate) and, without the key and the bound on clients,
// the simulator's (each tenant's).
type rateFlags struct {
	rateLimit   float64
	rateBurst   int
	rateClients int
	rateKey     string
}

// registerRate registers the flags: limit and burst describe what is
// limited; keyHelp, when not "", registers --rate-limit-key with it and
// --rate-limit-clients.
func (r *rateFlags) registerRate(f *pflag.FlagSet, limit, burst, keyHelp string) {
	f.Float64Var(&r.rateLimit, "rate-limit", 0, limit)
	f.IntVar(&r.rateBurst, "rate-limit-burst", 0, burst)
	if keyHelp == "" {
		return
	}
	f.StringVar(&r.rateKey, "rate-limit-key", "ip", keyHelp)
	f.IntVar(&r.rateClients, "rate-limit-clients", flow.DefaultRateClients,
		"most clients --rate-limit keeps at once (36 bytes each: 2.2 MiB at the default); past it one whose burst is whole again makes room")
}

// rateLimitOptions turns the flags into a flow.RateLimit (PerSecond 0: none);
// a bad value is a usage error naming its flag.
func (r rateFlags) rateLimitOptions(cmd *cobra.Command) (flow.RateLimit, error) {
	if r.rateLimit == 0 {
		for _, name := range []string{"rate-limit-burst", "rate-limit-key", "rate-limit-clients"} {
			if f := cmd.Flags().Lookup(name); f != nil && f.Changed {
				return flow.RateLimit{}, usagef("invalid --%s %q: needs --rate-limit, which is off", name, f.Value.String())
			}
		}
		return flow.RateLimit{}, nil
	}
	burst := r.rateBurst
	if burst == 0 {
		burst = max(1, int(math.Ceil(r.rateLimit)))
	}
	o := flow.RateLimit{Rate: flow.Rate{PerSecond: r.rateLimit, Burst: burst}}
	keyed := cmd.Flags().Lookup("rate-limit-key") != nil // the fronts', not the simulator's
	if keyed {
		o.Key, o.MaxClients = r.rateKey, r.rateClients
	}
	if r.rateBurst < 0 {
		return o, usagef("invalid --rate-limit-burst %q: must not be negative (0 = --rate-limit rounded up)", fmt.Sprint(r.rateBurst))
	}
	if keyed && r.rateClients < 1 {
		return o, usagef("invalid --rate-limit-clients %q: must be at least 1", fmt.Sprint(r.rateClients))
	}
	// Each flag checked on its own, so that the error names it.
	if o.Rate.Validate() != nil {
		return o, usagef("invalid --rate-limit %q: want 0 (no limit) or a rate of at least 1e-6 requests/s", fmt.Sprint(r.rateLimit))
	}
	if (flow.RateLimit{Key: o.Key}).Validate() != nil {
		return o, usagef("invalid --rate-limit-key %q: want ip or header:NAME", r.rateKey)
	}
	return o, nil
}

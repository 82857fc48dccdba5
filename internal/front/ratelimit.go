package front

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/examlops/gateway/flow"
)

// CodeRateLimited is the error code of a request refused because its
// client is over its rate (both fronts' RateLimit option).
const CodeRateLimited = "rate_limited"

// NewRateLimiter makes o's limiter, nil when off, and registers its
// series on reg (when not nil): exa_gateway_rate_limited_total,
// exa_gateway_rate_limit_clients and
// exa_gateway_rate_limit_forgotten_total.
func NewRateLimiter(o flow.RateLimit, reg prometheus.Registerer) (*flow.RateLimiter, error) {
	l, err := flow.NewRateLimiter(o)
	if err != nil || l == nil {
		return nil, err
	}
	if reg == nil {
		return l, nil
	}
	for _, c := range []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "exa_gateway_rate_limited_total",
			Help: "Requests refused with 429 rate_limited because their client was over --rate-limit."},
			func() float64 { return float64(l.Stats().Limited) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "exa_gateway_rate_limit_clients",
			Help: "Clients whose request rate the gateway keeps (at most --rate-limit-clients)."},
			func() float64 { return float64(l.Stats().Clients) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "exa_gateway_rate_limit_forgotten_total",
			Help: "Clients dropped to make room for new ones while their burst was not whole again (each may send a burst early)."},
			func() float64 { return float64(l.Stats().Forgotten) }),
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// RateLimitedText is the message of a request refused under o, which one
// would be admitted after wait.
func RateLimitedText(o flow.RateLimit, wait time.Duration) string {
	return fmt.Sprintf("gateway: client over its rate limit of %g requests/s (burst %d); retry in %.3g s", o.PerSecond, o.Burst, wait.Seconds())
}

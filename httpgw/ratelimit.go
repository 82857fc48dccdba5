package httpgw

import (
	"fmt"
	"math"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/examlops/gateway/flow"
	"github.com/examlops/gateway/internal/front"
)

// CodeRateLimited is the error code of a request refused by
// Options.RateLimit.
const CodeRateLimited = "rate_limited"

// newRateLimiter makes Options.RateLimit's limiter, nil when off, and
// registers its series on reg: exa_gateway_rate_limited_total,
// exa_gateway_rate_limit_clients and
// exa_gateway_rate_limit_forgotten_total.
func newRateLimiter(o flow.RateLimit, reg prometheus.Registerer) (*flow.RateLimiter, error) {
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

// refused answers a request to a model endpoint that is not let in: 401
// without an API key in force (Options.APIKeysFile), 429 past its
// client's rate (Options.RateLimit). It reports whether it answered, and
// reads nothing of the body.
func (s *Server) refused(w http.ResponseWriter, r *http.Request, fail failFunc) bool {
	return s.unauthorized(w, r, fail) || s.overRate(w, r, fail)
}

// overRate answers 429 rate_limited, with Retry-After in whole seconds
// (at least 1), to a request whose client is over Options.RateLimit, and
// reports whether it did. It reads nothing of the body.
func (s *Server) overRate(w http.ResponseWriter, r *http.Request, fail failFunc) bool {
	if s.rate == nil {
		return false
	}
	ok, wait := s.rate.Allow(s.rate.Client(r.Header, r.RemoteAddr), s.opts.Clock())
	if ok {
		return false
	}
	lim := s.rate.Limit()
	w.Header().Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(wait.Seconds())))))
	fail(http.StatusTooManyRequests, front.TypeRateLimit, CodeRateLimited, "",
		fmt.Sprintf("gateway: client over its rate limit of %g requests/s (burst %d); retry in %.3g s", lim.PerSecond, lim.Burst, wait.Seconds()))
	return true
}

package httpgw

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/examlops/gateway/flow"
	"github.com/examlops/gateway/internal/apikeys"
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

// loadAPIKeys loads Options.APIKeysFile, nil when it is not set, and
// registers exa_gateway_api_keys and exa_gateway_unauthorized_total.
func loadAPIKeys(path string, now func() time.Time, reg prometheus.Registerer) (*apikeys.File, error) {
	if path == "" {
		return nil, nil
	}
	f, err := apikeys.Load(path, now)
	if err != nil || reg == nil {
		return f, err
	}
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "exa_gateway_api_keys", Help: "API keys in force (--api-keys-file)."},
			func() float64 { return float64(f.Len()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "exa_gateway_unauthorized_total",
			Help: "Requests refused with 401 invalid_api_key: no key, or one not in --api-keys-file."},
			func() float64 { return float64(f.Rejected()) }),
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// refused answers a request to a model endpoint that is not let in: 401
// without an API key in force (Options.APIKeysFile), 429 past its
// client's rate (Options.RateLimit). It reports whether it answered, and
// reads nothing of the body.
func (s *Server) refused(w http.ResponseWriter, r *http.Request, fail failFunc) bool {
	return s.unauthorized(w, r, fail) || s.overRate(w, r, fail)
}

// unauthorized answers 401 invalid_api_key to a request without a key of
// Options.APIKeysFile, and reports whether it did. A changed file is
// re-read first, at most once a second; a file that no longer reads is
// logged and the keys read last stay in force.
func (s *Server) unauthorized(w http.ResponseWriter, r *http.Request, fail failFunc) bool {
	if s.keys == nil {
		return false
	}
	if err := s.keys.Refresh(); err != nil {
		s.log.Warn("API keys file not reloaded; the keys read last stay in force", "err", err)
	}
	if s.keys.Allowed(r.Header.Get("Authorization")) {
		return false
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="exa-gateway"`)
	fail(http.StatusUnauthorized, front.TypeInvalidRequest, "invalid_api_key", "",
		"gateway: this endpoint needs a valid API key: Authorization: Bearer KEY")
	return true
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

package httpgw

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/examlops/gateway/internal/apikeys"
	"github.com/examlops/gateway/internal/front"
)

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

package front

import (
	"crypto/subtle"
	"net/http"
	"strconv"

	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/apikeys"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// This file answers the endpoints both processes serve from the fleet:
// /v1/models, /stats and /metrics.

// ServeModels serves GET /v1/models: the configured models, then the
// LoRA adapters the fleet serves, each with its model as parent.
func ServeModels(w http.ResponseWriter, r *http.Request, fl *fleet.Fleet, m *Metrics) {
	code := "200"
	defer func() { m.Requests.WithLabelValues("", "models", code).Inc() }()
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		code = "405"
		w.Header().Set("Allow", "GET, HEAD")
		WriteError(w, http.StatusMethodNotAllowed, TypeInvalidRequest, "method_not_allowed", "", "gateway: /v1/models accepts GET only")
		return
	}
	WriteJSON(w, fl.ModelList())
}

// StatsHandler serves GET /stats (docs/stats.md); ?model=NAME narrows it
// to one model (404 when the fleet does not serve it).
func StatsHandler(fl *fleet.Fleet) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			WriteError(w, http.StatusMethodNotAllowed, TypeInvalidRequest, "method_not_allowed", "", "gateway: /stats accepts GET only")
			return
		}
		st := fl.Stats()
		if model := r.URL.Query().Get("model"); model != "" {
			rs, ok := st.Models[model]
			if !ok {
				WriteError(w, http.StatusNotFound, TypeNotFound, "model_not_found", "model", "gateway: model not found: "+strconv.Quote(model))
				return
			}
			st.Models = map[string]config.RoutingStats{model: rs}
		}
		WriteJSON(w, st)
	}
}

// MetricsHandler serves /metrics from g, after refreshing the fleet's
// gauges. When the fleet has a peer token (fleet.Options.PeerTokenFile) a
// request must carry "Authorization: Bearer <token>": without it the
// answer is 401 (503 if the token file cannot be read).
func MetricsHandler(fl *fleet.Fleet, g prometheus.Gatherer) http.Handler {
	h := promhttp.HandlerFor(g, promhttp.HandlerOpts{})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !authorizeMetrics(w, r, fl) {
			return
		}
		fl.RefreshGauges()
		h.ServeHTTP(w, r)
	})
}

// authorizeMetrics checks a /metrics request's bearer token; when it is
// wanted and wrong, it answers and returns false.
func authorizeMetrics(w http.ResponseWriter, r *http.Request, fl *fleet.Fleet) bool {
	tok, required, err := fl.PeerToken()
	if !required {
		return true
	}
	if err != nil { // logged by PeerToken when the file becomes unreadable
		WriteError(w, http.StatusServiceUnavailable, TypeUnavailable, "peer_token_unavailable", "", "gateway: /metrics needs a bearer token, and this gateway's token file cannot be read")
		return false
	}
	got, ok := apikeys.Bearer(r.Header.Get("Authorization"))
	if !ok || subtle.ConstantTimeCompare([]byte(got), tok) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="exa-gateway"`)
		WriteError(w, http.StatusUnauthorized, TypeInvalidRequest, "invalid_api_key", "", "gateway: /metrics needs Authorization: Bearer with the peer token")
		return false
	}
	return true
}

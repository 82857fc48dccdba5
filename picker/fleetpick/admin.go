package fleetpick

import (
	"net/http"

	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/front"
	"github.com/prometheus/client_golang/prometheus"
)

// Admin returns the picker process's admin handler: /metrics (g, with the
// fleet's gauges refreshed and its peer token required when it has one),
// /stats (the fleet's, as `exa serve gateway` serves it) and /healthz
// (always 200), and a 404 for anything else: inference requests come
// through Envoy.
func Admin(fl *fleet.Fleet, g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", front.MetricsHandler(fl, g))
	mux.Handle("/stats", front.StatsHandler(fl))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "picker admin: no endpoint "+r.URL.Path+" (serving /metrics, /stats, /healthz; requests go through Envoy)", http.StatusNotFound)
	})
	return mux
}

package httpgw

import "github.com/prometheus/client_golang/prometheus"

// pdMetrics are the metrics of disaggregated models.
type pdMetrics struct {
	pdRequests  *prometheus.CounterVec   // model, path
	pdFallbacks *prometheus.CounterVec   // model, reason
	pdPhase     *prometheus.HistogramVec // model, phase
}

func newPDMetrics(ns string) pdMetrics {
	return pdMetrics{
		pdRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "disagg_requests_total",
			Help: "Requests of disaggregated models by the P/D decider's choice (path: split, colocated). Split share: sum by (model) (rate(exa_gateway_disagg_requests_total{path=\"split\"}[5m])) / sum by (model) (rate(exa_gateway_disagg_requests_total[5m]))."},
			[]string{"model", "path"}),
		pdFallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "disagg_fallbacks_total",
			Help: "Departures from the P/D plan, by model and reason: prefill_unavailable, prefill_failed, prefill_no_kv_params (decoded co-located), decode_retry (retried on another decode replica)."},
			[]string{"model", "reason"}),
		pdPhase: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "disagg_phase_seconds",
			Help:    "Phases of split requests in gateway mode: prefill (the prefill request's round trip), decode_first_byte (from sending the decode request to its first byte: KV transfer and first token), decode (from sending the decode request to the end of its answer).",
			Buckets: latencyBuckets}, []string{"model", "phase"}),
	}
}

package front

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics holds the fronts' Prometheus collectors (exa_gateway_*; see
// docs/metrics.md). Counters are the front's own and survive
// configuration reloads; the routing library's counters (which restart
// when a model's gateway is rebuilt) back /stats. The HTTP gateway counts
// every field; the picker the ones its requests reach.
type Metrics struct {
	Requests    RequestCounter           // model, endpoint, code, reason
	Decisions   *prometheus.CounterVec   // model, kind
	Routed      *prometheus.CounterVec   // model
	Hits        *prometheus.CounterVec   // model
	Blocks      *prometheus.CounterVec   // model
	Matched     *prometheus.CounterVec   // model
	ReplicaReqs *prometheus.CounterVec   // model, replica
	Duration    *prometheus.HistogramVec // model, endpoint
	TTFB        *prometheus.HistogramVec // model, endpoint
	Retries     *prometheus.CounterVec   // model
	InFlight    prometheus.Gauge
	// TokenizeSeconds times the tokenization of requests on the exact
	// index, by model.
	TokenizeSeconds *prometheus.HistogramVec
	// UpstreamStreamed counts non-streamed requests streamed from the
	// engine, UpstreamStreamFailed those of them whose stream could not
	// be assembled (a 502), by model and endpoint (httpgw's upstream.go).
	UpstreamStreamed, UpstreamStreamFailed *prometheus.CounterVec
	// PDRequests, PDFallbacks and PDPhase are the metrics of
	// disaggregated models: by model and path, reason and phase.
	PDRequests  *prometheus.CounterVec
	PDFallbacks *prometheus.CounterVec
	PDPhase     *prometheus.HistogramVec
	// SLORequests counts requests with a latency objective by how they
	// did against it (model, objective: ttft or tpot, outcome: met or
	// missed; Attained); SLOUnattainable those no replica was predicted
	// to meet (model, action: best_effort or rejected; objective.go).
	SLORequests, SLOUnattainable *prometheus.CounterVec
}

// LatencyBuckets span 1 ms to an hour: past httpgw's default response
// timeout (10 minutes), so that a slow non-streamed answer lands in a
// bucket of its own rather than in +Inf, with the usual 1-2.5-5 steps
// below a minute.
var LatencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60,
	120, 300, 600, 1200, 1800, 3600}

// Outcome codes of exa_gateway_requests_total besides HTTP statuses (see
// OutcomeLabels).
const (
	CodeClientCanceled = "client_canceled"
	CodeStreamError    = "stream_error"
	CodeAborted        = "aborted"
	// CodeStreamEnded is the outcome of a picked request whose ext_proc
	// stream ended before its response did: the client went away, or the
	// data plane reset the request (the picker cannot tell which).
	CodeStreamEnded = "stream_ended"
	// CodeShed is the reason of a request shed by admission control.
	CodeShed = "shed"
	// CodeShed429 records a shed request as status 429 with reason shed.
	CodeShed429 = "429:" + CodeShed
)

// StatusClientClosed is the code label of a request whose client went
// away before its answer ended: 499, nginx's "client closed request".
const StatusClientClosed = 499

// RequestCounter is exa_gateway_requests_total: its code label is the
// HTTP status only, and a request that ended otherwise than with the
// answer it began carries a reason (see OutcomeLabels).
type RequestCounter struct{ vec *prometheus.CounterVec }

// WithLabelValues returns the series of a request's model, endpoint and
// outcome code (an HTTP status, or one of the outcome words of
// OutcomeLabels).
func (r RequestCounter) WithLabelValues(model, endpoint, code string) prometheus.Counter {
	status, reason := OutcomeLabels(code)
	return r.vec.WithLabelValues(model, endpoint, status, reason)
}

// OutcomeLabels splits an outcome code into exa_gateway_requests_total's
// code (an HTTP status) and reason labels: an HTTP status is the code with
// no reason; client_canceled is code 499 (StatusClientClosed); the
// outcomes of an answer cut after its head was relayed (stream_error,
// aborted, and the picker's stream_ended) are code 200, the status engines
// send for streamed answers (the relayed status is not kept with the
// outcome), with the word as reason. Any other word is code "" (none
// sent) with the word as reason.
func OutcomeLabels(code string) (status, reason string) {
	if isStatus(code) {
		return code, ""
	}
	switch code {
	case CodeShed429:
		return "429", CodeShed
	case CodeSLO429:
		return "429", CodeSLOUnattainable
	case CodeClientCanceled:
		return "499", code
	case CodeStreamError, CodeAborted, CodeStreamEnded:
		return "200", code
	}
	return "", code
}

// isStatus reports whether code is a three-digit HTTP status.
func isStatus(code string) bool {
	return len(code) == 3 && code[0] >= '1' && code[0] <= '5' && code[1] >= '0' && code[1] <= '9' && code[2] >= '0' && code[2] <= '9'
}

// NewMetrics returns the fronts' collectors, registered on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	const ns = "exa_gateway"
	m := &Metrics{
		Requests: RequestCounter{prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "requests_total",
			Help: "Requests received, by model, endpoint (chat, completions, responses, embeddings, tokenize, detokenize, models, other), code (the HTTP status; 499 when the client went away) and reason (empty, or how an answer ended early: client_canceled, stream_error, aborted, stream_ended; or why it was refused: shed, slo_unattainable)."},
			[]string{"model", "endpoint", "code", "reason"})},
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "decisions_total",
			Help: "Routing decisions by model and kind (affinity, load_aware, round_robin)."}, []string{"model", "kind"}),
		Routed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "routed_total",
			Help: "Routing decisions made, by model (first attempts and retries)."}, []string{"model"}),
		Hits: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "prefix_hits_total",
			Help: "Decisions whose chosen replica held the whole prefix, by model."}, []string{"model"}),
		Blocks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "prefix_blocks_total",
			Help: "Prefix blocks routed, by model."}, []string{"model"}),
		Matched: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "prefix_matched_blocks_total",
			Help: "Prefix blocks the chosen replica held, by model."}, []string{"model"}),
		ReplicaReqs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "replica_requests_total",
			Help: "Requests forwarded to each replica, by model and replica."}, []string{"model", "replica"}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "request_duration_seconds",
			Help: "Time from receiving a request to the end of its response, by model and endpoint.", Buckets: LatencyBuckets},
			[]string{"model", "endpoint"}),
		TTFB: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "time_to_first_byte_seconds",
			Help: "Time from receiving a request to the first upstream response byte (time to first token when streaming).", Buckets: LatencyBuckets},
			[]string{"model", "endpoint"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "retries_total",
			Help: "Requests retried on another replica after an upstream failure before any response byte."}, []string{"model"}),
		InFlight: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "in_flight_requests",
			Help: "Inference requests being served."}),
		TokenizeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "tokenize_seconds",
			Help:    "Time to tokenize a request of a model on the exact index (the engine's /tokenize, or the gateway's cache of tokenized requests), by model.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 18)}, []string{"model"}),
		UpstreamStreamed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "upstream_streamed_total",
			Help: "Non-streamed chat and completions requests the gateway asked the engine to stream (to learn their first token), answered with the JSON assembled from the stream, by model and endpoint."},
			[]string{"model", "endpoint"}),
		UpstreamStreamFailed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "upstream_stream_failures_total",
			Help: "Streamed-upstream requests whose stream was cut, carried an error event or could not be assembled (answered 502), by model and endpoint."},
			[]string{"model", "endpoint"}),
		PDRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "disagg_requests_total",
			Help: "Requests of disaggregated models by the P/D decider's choice (path: split, colocated). Split share: sum by (model) (rate(exa_gateway_disagg_requests_total{path=\"split\"}[5m])) / sum by (model) (rate(exa_gateway_disagg_requests_total[5m]))."},
			[]string{"model", "path"}),
		PDFallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "disagg_fallbacks_total",
			Help: "Departures from the P/D plan, by model and reason: prefill_unavailable, prefill_failed, prefill_no_kv_params (decoded co-located), decode_retry (retried on another decode replica), prefill_retry (a failed prefill retried on another prefill replica)."},
			[]string{"model", "reason"}),
		PDPhase: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "disagg_phase_seconds",
			Help:    "Phases of split requests in gateway mode: prefill (the prefill request's round trip), decode_first_byte (from sending the decode request to its first byte: KV transfer and first token), decode (from sending the decode request to the end of its answer).",
			Buckets: LatencyBuckets}, []string{"model", "phase"}),
		SLORequests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "slo_requests_total",
			Help: "Requests with a latency objective (x-slo-ttft-ms, x-slo-tpot-ms or the model's default) whose answer showed how they did, by model, objective (ttft, tpot) and outcome (met, missed). Attainment: sum by (model) (rate(exa_gateway_slo_requests_total{objective=\"ttft\",outcome=\"met\"}[5m])) / sum by (model) (rate(exa_gateway_slo_requests_total{objective=\"ttft\"}[5m]))."},
			[]string{"model", "objective", "outcome"}),
		SLOUnattainable: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "slo_unattainable_total",
			Help: "Routing decisions for which no replica was predicted to meet the request's latency objective, by model and action (best_effort: routed anyway; rejected: answered 429 slo_unattainable)."},
			[]string{"model", "action"}),
	}
	for _, c := range []prometheus.Collector{m.Requests.vec, m.Decisions, m.Routed, m.Hits, m.Blocks, m.Matched,
		m.ReplicaReqs, m.Duration, m.TTFB, m.Retries, m.InFlight, m.TokenizeSeconds, m.UpstreamStreamed, m.UpstreamStreamFailed,
		m.PDRequests, m.PDFallbacks, m.PDPhase, m.SLORequests, m.SLOUnattainable} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

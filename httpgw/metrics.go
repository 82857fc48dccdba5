package httpgw

import (
	"sync/atomic"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics holds the gateway's Prometheus collectors. Counters are the
// gateway's own and survive configuration reloads; the routing library's
// counters (which restart when a model's gateway is rebuilt) back /stats.
type metrics struct {
	requests    requestCounter           // model, endpoint, code, reason
	decisions   *prometheus.CounterVec   // model, kind
	routed      *prometheus.CounterVec   // model
	hits        *prometheus.CounterVec   // model
	blocks      *prometheus.CounterVec   // model
	matched     *prometheus.CounterVec   // model
	replicaReqs *prometheus.CounterVec   // model, replica
	duration    *prometheus.HistogramVec // model, endpoint
	ttfb        *prometheus.HistogramVec // model, endpoint
	retries     *prometheus.CounterVec   // model
	inFlight    prometheus.Gauge
	// tokenizeSeconds times the tokenization of requests on the exact
	// index, by model.
	tokenizeSeconds *prometheus.HistogramVec
	// upstreamStreamed counts non-streamed requests streamed from the
	// engine, upstreamStreamFailed those of them whose stream could not
	// be assembled (a 502), by model and endpoint (upstream.go).
	upstreamStreamed, upstreamStreamFailed *prometheus.CounterVec
	pdMetrics
}

// latencyBuckets span 1 ms to an hour: past DefaultResponseTimeout (10
// minutes), so that a slow non-streamed answer lands in a bucket of its
// own rather than in +Inf, with the usual 1-2.5-5 steps below a minute.
var latencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60,
	120, 300, 600, 1200, 1800, 3600}

// requestCounter is exa_gateway_requests_total: its code label is the
// HTTP status only, and a request that ended otherwise than with the
// answer it began carries a reason (see outcomeLabels).
type requestCounter struct{ vec *prometheus.CounterVec }

// WithLabelValues returns the series of a request's model, endpoint and
// outcome code (an HTTP status, or one of the outcome words of
// outcomeLabels).
func (r requestCounter) WithLabelValues(model, endpoint, code string) prometheus.Counter {
	status, reason := outcomeLabels(code)
	return r.vec.WithLabelValues(model, endpoint, status, reason)
}

// StatusClientClosed is the code label of a request whose client went
// away before its answer ended: 499, nginx's "client closed request".
const StatusClientClosed = 499

// outcomeLabels splits an outcome code into exa_gateway_requests_total's
// code (an HTTP status) and reason labels: an HTTP status is the code with
// no reason; client_canceled is code 499 (StatusClientClosed); the
// outcomes of an answer cut after its head was relayed (stream_error,
// aborted, and the picker's stream_ended) are code 200, the status engines
// send for streamed answers (the relayed status is not kept with the
// outcome), with the word as reason. Any other word is code "" (none
// sent) with the word as reason.
func outcomeLabels(code string) (status, reason string) {
	if isStatus(code) {
		return code, ""
	}
	switch code {
	case codeShed429:
		return "429", codeShed
	case codeClientCanceled:
		return "499", code
	case codeStreamError, codeAborted, codeStreamEnded:
		return "200", code
	}
	return "", code
}

// isStatus reports whether code is a three-digit HTTP status.
func isStatus(code string) bool {
	return len(code) == 3 && code[0] >= '1' && code[0] <= '5' && code[1] >= '0' && code[1] <= '9' && code[2] >= '0' && code[2] <= '9'
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns = "exa_gateway"
	m := &metrics{
		requests: requestCounter{prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "requests_total",
			Help: "Requests received, by model, endpoint (chat, completions, embeddings, tokenize, detokenize, models, other), code (the HTTP status; 499 when the client went away) and reason (empty, or how an answer ended early: client_canceled, stream_error, aborted, stream_ended)."},
			[]string{"model", "endpoint", "code", "reason"})},
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "decisions_total",
			Help: "Routing decisions by model and kind (affinity, load_aware, round_robin)."}, []string{"model", "kind"}),
		routed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "routed_total",
			Help: "Routing decisions made, by model (first attempts and retries)."}, []string{"model"}),
		hits: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "prefix_hits_total",
			Help: "Decisions whose chosen replica held the whole prefix, by model."}, []string{"model"}),
		blocks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "prefix_blocks_total",
			Help: "Prefix blocks routed, by model."}, []string{"model"}),
		matched: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "prefix_matched_blocks_total",
			Help: "Prefix blocks the chosen replica held, by model."}, []string{"model"}),
		replicaReqs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "replica_requests_total",
			Help: "Requests forwarded to each replica, by model and replica."}, []string{"model", "replica"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "request_duration_seconds",
			Help: "Time from receiving a request to the end of its response, by model and endpoint.", Buckets: latencyBuckets},
			[]string{"model", "endpoint"}),
		ttfb: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "time_to_first_byte_seconds",
			Help: "Time from receiving a request to the first upstream response byte (time to first token when streaming).", Buckets: latencyBuckets},
			[]string{"model", "endpoint"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "retries_total",
			Help: "Requests retried on another replica after an upstream failure before any response byte."}, []string{"model"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "in_flight_requests",
			Help: "Inference requests being served."}),
		tokenizeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "tokenize_seconds",
			Help:    "Time to tokenize a request of a model on the exact index (the engine's /tokenize, or the gateway's cache of tokenized requests), by model.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 18)}, []string{"model"}),
		upstreamStreamed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "upstream_streamed_total",
			Help: "Non-streamed chat and completions requests the gateway asked the engine to stream (to learn their first token), answered with the JSON assembled from the stream, by model and endpoint."},
			[]string{"model", "endpoint"}),
		upstreamStreamFailed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "upstream_stream_failures_total",
			Help: "Streamed-upstream requests whose stream was cut, carried an error event or could not be assembled (answered 502), by model and endpoint."},
			[]string{"model", "endpoint"}),
		pdMetrics: newPDMetrics(ns),
	}
	for _, c := range []prometheus.Collector{m.requests.vec, m.decisions, m.routed, m.hits, m.blocks, m.matched,
		m.replicaReqs, m.duration, m.ttfb, m.retries, m.inFlight, m.tokenizeSeconds, m.upstreamStreamed, m.upstreamStreamFailed,
		m.pdRequests, m.pdFallbacks, m.pdPhase} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// lazy caches one series of a metric vector (a prometheus.Counter or
// Observer), looked up on first use (so that a series appears in /metrics
// only once it has counted something, as with WithLabelValues at each
// use). Safe for concurrent use; the zero value is empty.
type lazy[T any] struct {
	p atomic.Pointer[T]
}

// get returns the cached series, calling look to find it the first time.
// look does not escape, so a closure passed to get is not allocated.
func (l *lazy[T]) get(look func() T) T {
	if s := l.p.Load(); s != nil {
		return *s
	}
	s := look()
	l.p.Store(&s)
	return s
}

// numEndpointKinds is how many endpointKind values there are.
const numEndpointKinds = 3 // chat, completions, responses

// modelMetrics caches one model's series of the per-request metrics, so
// that a request does not hash its labels and search each vector. The
// series are the ones WithLabelValues returns (none of them is ever
// deleted), so counts are the same either way.
type modelMetrics struct {
	routed, hits, blocks, matched lazy[prometheus.Counter]
	decisions                     [3]lazy[prometheus.Counter] // by gateway.Kind (others are looked up)
	requestsOK                    [numEndpointKinds]lazy[prometheus.Counter]
	duration, ttfb                [numEndpointKinds]lazy[prometheus.Observer]
	replicaReqs                   map[string]*lazy[prometheus.Counter] // by replica name; read-only
}

func newModelMetrics(replicas []string) *modelMetrics {
	mm := &modelMetrics{replicaReqs: make(map[string]*lazy[prometheus.Counter], len(replicas))}
	for _, r := range replicas {
		mm.replicaReqs[r] = new(lazy[prometheus.Counter])
	}
	return mm
}

// The accessors below return a model's series; a nil *modelMetrics (a
// modelState built without one) looks each series up instead.

func (mm *modelMetrics) routedC(m *metrics, model string) prometheus.Counter {
	look := func() prometheus.Counter { return m.routed.WithLabelValues(model) }
	if mm == nil {
		return look()
	}
	return mm.routed.get(look)
}

func (mm *modelMetrics) hitsC(m *metrics, model string) prometheus.Counter {
	look := func() prometheus.Counter { return m.hits.WithLabelValues(model) }
	if mm == nil {
		return look()
	}
	return mm.hits.get(look)
}

func (mm *modelMetrics) blocksC(m *metrics, model string) prometheus.Counter {
	look := func() prometheus.Counter { return m.blocks.WithLabelValues(model) }
	if mm == nil {
		return look()
	}
	return mm.blocks.get(look)
}

func (mm *modelMetrics) matchedC(m *metrics, model string) prometheus.Counter {
	look := func() prometheus.Counter { return m.matched.WithLabelValues(model) }
	if mm == nil {
		return look()
	}
	return mm.matched.get(look)
}

func (mm *modelMetrics) decisionsC(m *metrics, model string, k gateway.Kind) prometheus.Counter {
	look := func() prometheus.Counter { return m.decisions.WithLabelValues(model, k.String()) }
	if mm == nil || k < 0 || int(k) >= len(mm.decisions) {
		return look()
	}
	return mm.decisions[k].get(look)
}

func (mm *modelMetrics) replicaReqsC(m *metrics, model, replica string) prometheus.Counter {
	look := func() prometheus.Counter { return m.replicaReqs.WithLabelValues(model, replica) }
	if mm != nil {
		if l := mm.replicaReqs[replica]; l != nil {
			return l.get(look)
		}
	}
	return look()
}

func (mm *modelMetrics) requestsC(m *metrics, model string, kind endpointKind, code string) prometheus.Counter {
	look := func() prometheus.Counter { return m.requests.WithLabelValues(model, kind.String(), code) }
	if mm == nil || code != "200" || kind < 0 || int(kind) >= numEndpointKinds {
		return look()
	}
	return mm.requestsOK[kind].get(look)
}

func (mm *modelMetrics) durationO(m *metrics, model string, kind endpointKind) prometheus.Observer {
	look := func() prometheus.Observer { return m.duration.WithLabelValues(model, kind.String()) }
	if mm == nil || kind < 0 || int(kind) >= numEndpointKinds {
		return look()
	}
	return mm.duration[kind].get(look)
}

func (mm *modelMetrics) ttfbO(m *metrics, model string, kind endpointKind) prometheus.Observer {
	look := func() prometheus.Observer { return m.ttfb.WithLabelValues(model, kind.String()) }
	if mm == nil || kind < 0 || int(kind) >= numEndpointKinds {
		return look()
	}
	return mm.ttfb[kind].get(look)
}

// mmOf returns a model's cached series (fleet.Model.Front, set by the
// Attach hook of New), nil (look each series up) when it has none.
func mmOf(ms *fleet.Model) *modelMetrics {
	mm, _ := ms.Front.(*modelMetrics)
	return mm
}

package front

import (
	"sync/atomic"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/keys"
	"github.com/prometheus/client_golang/prometheus"
)

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

// numEndpointKinds is how many keys.Endpoint values there are.
const numEndpointKinds = 3 // chat, completions, responses

// ModelMetrics caches one model's series of the per-request metrics, so
// that a request does not hash its labels and search each vector. The
// series are the ones WithLabelValues returns (none of them is ever
// deleted), so counts are the same either way. A nil *ModelMetrics (a
// model attached without one) looks each series up instead.
type ModelMetrics struct {
	routed, hits, blocks, matched lazy[prometheus.Counter]
	decisions                     [3]lazy[prometheus.Counter] // by gateway.Kind (others are looked up)
	requestsOK                    [numEndpointKinds]lazy[prometheus.Counter]
	duration, ttfb                [numEndpointKinds]lazy[prometheus.Observer]
	replicaReqs                   map[string]*lazy[prometheus.Counter] // by replica name; read-only
}

// Attach is the fleet.Options.Attach hook of the fronts: a model's
// *ModelMetrics, which Of returns.
func Attach(m *fleet.Model) any {
	mm := &ModelMetrics{replicaReqs: make(map[string]*lazy[prometheus.Counter], len(m.Order))}
	for _, r := range m.Order {
		mm.replicaReqs[r] = new(lazy[prometheus.Counter])
	}
	return mm
}

// Of returns a model's cached series (fleet.Model.Front, set by Attach),
// nil (look each series up) when it has none.
func Of(ms *fleet.Model) *ModelMetrics {
	mm, _ := ms.Front.(*ModelMetrics)
	return mm
}

// CountDecision counts decision d of a request of ms: routed, by kind,
// hits, blocks and matched blocks.
func (m *Metrics) CountDecision(ms *fleet.Model, d *gateway.Decision) {
	mm := Of(ms)
	mm.routedC(m, ms.Name).Inc()
	mm.decisionsC(m, ms.Name, d.Kind).Inc()
	if d.Hit {
		mm.hitsC(m, ms.Name).Inc()
	}
	mm.blocksC(m, ms.Name).Add(float64(d.Blocks))
	mm.matchedC(m, ms.Name).Add(float64(d.Matched))
}

func (mm *ModelMetrics) routedC(m *Metrics, model string) prometheus.Counter {
	look := func() prometheus.Counter { return m.Routed.WithLabelValues(model) }
	if mm == nil {
		return look()
	}
	return mm.routed.get(look)
}

func (mm *ModelMetrics) hitsC(m *Metrics, model string) prometheus.Counter {
	look := func() prometheus.Counter { return m.Hits.WithLabelValues(model) }
	if mm == nil {
		return look()
	}
	return mm.hits.get(look)
}

func (mm *ModelMetrics) blocksC(m *Metrics, model string) prometheus.Counter {
	look := func() prometheus.Counter { return m.Blocks.WithLabelValues(model) }
	if mm == nil {
		return look()
	}
	return mm.blocks.get(look)
}

func (mm *ModelMetrics) matchedC(m *Metrics, model string) prometheus.Counter {
	look := func() prometheus.Counter { return m.Matched.WithLabelValues(model) }
	if mm == nil {
		return look()
	}
	return mm.matched.get(look)
}

func (mm *ModelMetrics) decisionsC(m *Metrics, model string, k gateway.Kind) prometheus.Counter {
	look := func() prometheus.Counter { return m.Decisions.WithLabelValues(model, k.String()) }
	if mm == nil || k < 0 || int(k) >= len(mm.decisions) {
		return look()
	}
	return mm.decisions[k].get(look)
}

// DropReplicas deletes the per-replica series (replica_requests_total)
// of the replicas old's models had and next's do not, so that replicas
// that come and go (pods) do not grow /metrics without bound. It is the
// fronts' fleet.Fleet.OnApply hook.
func (m *Metrics) DropReplicas(old, next *fleet.State) {
	for name, om := range old.Models {
		nm := next.Models[name]
		for _, r := range om.Order {
			if nm == nil || nm.ByName[r] == nil {
				m.ReplicaReqs.DeleteLabelValues(name, r)
			}
		}
	}
}

// ReplicaRequests is exa_gateway_replica_requests_total's series of a
// replica of ms.
func (m *Metrics) ReplicaRequests(ms *fleet.Model, replica string) prometheus.Counter {
	look := func() prometheus.Counter { return m.ReplicaReqs.WithLabelValues(ms.Name, replica) }
	if mm := Of(ms); mm != nil {
		if l := mm.replicaReqs[replica]; l != nil {
			return l.get(look)
		}
	}
	return look()
}

// RequestsC is exa_gateway_requests_total's series of a request of model
// (mm its cached series, or nil) to endpoint kind with outcome code.
func (mm *ModelMetrics) RequestsC(m *Metrics, model string, kind keys.Endpoint, code string) prometheus.Counter {
	look := func() prometheus.Counter { return m.Requests.WithLabelValues(model, kind.String(), code) }
	if mm == nil || code != "200" || kind < 0 || int(kind) >= numEndpointKinds {
		return look()
	}
	return mm.requestsOK[kind].get(look)
}

// DurationO is exa_gateway_request_duration_seconds's series of model and
// endpoint kind.
func (mm *ModelMetrics) DurationO(m *Metrics, model string, kind keys.Endpoint) prometheus.Observer {
	look := func() prometheus.Observer { return m.Duration.WithLabelValues(model, kind.String()) }
	if mm == nil || kind < 0 || int(kind) >= numEndpointKinds {
		return look()
	}
	return mm.duration[kind].get(look)
}

// TTFBO is exa_gateway_time_to_first_byte_seconds's series of model and
// endpoint kind.
func (mm *ModelMetrics) TTFBO(m *Metrics, model string, kind keys.Endpoint) prometheus.Observer {
	look := func() prometheus.Observer { return m.TTFB.WithLabelValues(model, kind.String()) }
	if mm == nil || kind < 0 || int(kind) >= numEndpointKinds {
		return look()
	}
	return mm.ttfb[kind].get(look)
}

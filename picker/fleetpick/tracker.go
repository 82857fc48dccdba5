package fleetpick

import (
	"strconv"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/keys"
	"github.com/examlops/gateway/picker"
)

// tracker follows a picked request: it feeds its first token and end to
// the routing decisions, the passive health checks and the metrics, as
// the HTTP gateway's proxy does. Pooled: Done returns it.
type tracker struct {
	r        *Router
	ms       *fleet.Model
	kind     keys.Endpoint
	start    time.Time
	d        gateway.Decision
	pre      *gateway.Decision // a split request's prefill decision
	preD     gateway.Decision  // its storage
	ep       *fleet.Endpoint
	endpoint string
	tab      *table
}

var _ picker.Tracker = (*tracker)(nil)

// FirstToken implements picker.Tracker.
func (t *tracker) FirstToken() {
	r := t.r
	t.d.FirstToken()
	front.Of(t.ms).TTFBO(r.metrics, t.ms.Name, t.kind).Observe(r.opts.Clock().Sub(t.start).Seconds())
}

// Done implements picker.Tracker.
func (t *tracker) Done(o picker.Outcome) {
	r := t.r
	// Passive health: a 5xx counts against the engine that answered, as
	// in the HTTP gateway; a fallback that served means the endpoint
	// picked failed first.
	served := t.ep
	if o.Served != "" && o.Served != t.endpoint {
		if t.ep != nil {
			r.fl.Observe(t.ep, t.ep.Health.Failure(false))
		}
		served = t.tab.byEP[o.Served]
	}
	if served != nil && o.Status > 0 {
		if o.Status >= 500 {
			r.fl.Observe(served, served.Health.Failure(false))
		} else {
			r.fl.Observe(served, served.Health.Success(false))
		}
	}
	code := strconv.Itoa(o.Status)
	switch {
	case o.Err != nil && o.Status < 500:
		code = front.CodeStreamEnded
		t.d.Done(gateway.DoneInfo{Err: o.Err})
	case o.Err != nil:
		t.d.Done(gateway.DoneInfo{Err: o.Err})
	default:
		t.d.Done(gateway.DoneInfo{Latency: o.Latency})
	}
	if t.pre != nil {
		// The sidecar ran the prefill; the picker cannot tell when it
		// ended, so its decision is released with the request, as the
		// HTTP gateway's sidecar mode releases it.
		t.pre.Done(gateway.DoneInfo{})
	}
	mm := front.Of(t.ms)
	mm.RequestsC(r.metrics, t.ms.Name, t.kind, code).Inc()
	mm.DurationO(r.metrics, t.ms.Name, t.kind).Observe(r.opts.Clock().Sub(t.start).Seconds())
	r.metrics.InFlight.Dec()
	*t = tracker{}
	r.pool.Put(t)
}

package fleetpick

import (
	"net/http"
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
	// head reads a Responses API answer's head for its id (respID),
	// learned as soon as the head holds it; its buffer is kept in the pool.
	head   front.ResponseHead
	respID string
	client string // the request's client's address (clientOf)
	// pass, for a request without a prompt (a pass-through request, one
	// about a stored response), is its endpoint label in the request
	// counter: its answer teaches no id, and is not timed (its latency
	// says nothing of a prompt's). forget is the id a DELETE of a stored
	// response deletes, forgotten once the engine answers 200.
	pass   string
	forget string
	// stop stops the timer that releases a non-streamed request's
	// pending prefill at its predicted first token; nil if none.
	stop func() bool
	slo  front.SLO // the request's latency objective
}

var _ picker.HeadTracker = (*tracker)(nil)

// ResponseHead implements picker.HeadTracker: the head of a Responses API
// answer gives its id, remembered at once (Router.respIDs) as the picked
// replica's, before the client has the answer, so that the client's next
// request (a continuation, a retrieve) finds it; Done corrects it when a
// fallback served. Any other answer is not read.
func (t *tracker) ResponseHead(status int, chunk []byte) bool {
	if t.kind != keys.Responses || status != http.StatusOK || t.pass != "" {
		return true
	}
	id, done := t.head.Feed(chunk)
	if id != "" {
		t.respID = id
		t.client = front.ClientOf(t.client)
		t.r.respIDs.Add(id, t.ms.Name, t.d.Replica, t.client)
	}
	return done
}

// relearn corrects the replica of the response id learned from the head
// (ResponseHead) when the endpoint that served is not the one picked (a
// fallback): that fallback's replica, or, if it is not one of the
// model's, the id is forgotten.
func (t *tracker) relearn(served string) {
	if served == "" || served == t.endpoint {
		return
	}
	ep := t.tab.byEP[served]
	for _, name := range t.ms.Order {
		if ep != nil && t.ms.ByName[name] == ep {
			t.r.respIDs.Add(t.respID, t.ms.Name, name, t.client)
			return
		}
	}
	t.r.respIDs.Forget(t.respID)
}

// FirstToken implements picker.Tracker.
func (t *tracker) FirstToken() {
	r := t.r
	t.d.FirstToken()
	if t.pre != nil {
		// The sidecar's prefill is over before the decode's first token:
		// the prefill replica's pending prefill shrinks now, not when the
		// decode ends (Done releases the rest of its decision).
		t.pre.FirstToken()
	}
	r.flow.FirstToken(t.ms.Name, r.opts.Admission) // a held request may have room
	if t.pass != "" {
		return
	}
	front.Of(t.ms).TTFBO(r.metrics, t.ms.Name, t.kind).Observe(r.opts.Clock().Sub(t.start).Seconds())
}

// Done implements picker.Tracker.
func (t *tracker) Done(o picker.Outcome) {
	r := t.r
	if t.stop != nil {
		t.stop()
	}
	// Passive health: a 5xx counts against the engine that answered, as
	// in the HTTP gateway; a fallback that served means the endpoint
	// picked failed first. An answer that did not end well (its stream
	// ended early: the client gone or a reset, which the picker cannot
	// tell apart) is no success.
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
		} else if o.Err == nil {
			r.fl.Observe(served, served.Health.Success(false))
		}
	}
	if t.respID != "" {
		t.relearn(o.Served)
	}
	if t.forget != "" && o.Status == http.StatusOK && o.Err == nil {
		r.respIDs.Forget(t.forget)
	}
	code := strconv.Itoa(o.Status)
	switch {
	case o.Err != nil && o.Status < 500:
		code = front.CodeStreamEnded
		t.d.Done(gateway.DoneInfo{Err: o.Err})
	case o.Err != nil:
		t.d.Done(gateway.DoneInfo{Err: o.Err})
	case t.pass != "":
		t.d.Done(gateway.DoneInfo{})
	default:
		ttft := o.TTFT
		if t.kind == keys.Responses {
			// A Responses API stream opens with events sent before its
			// first token (response.created): its first chunk is not
			// the first token, which stays unseen, as in the HTTP gateway.
			ttft = 0
		}
		t.d.Done(gateway.DoneInfo{Latency: o.Latency, TTFT: ttft, Elapsed: o.Elapsed, OutputTokens: o.OutputTokens})
		if t.slo.Set() && o.Status/100 == 2 {
			// Counted as the client saw it: from the request's arrival
			// at the picker (flow control's queue included).
			r.metrics.CountSeen(t.ms.Name, t.slo, o.Latency, ttft > 0, r.opts.Clock().Sub(t.start), o.OutputTokens)
		}
	}
	if t.pre != nil {
		// The sidecar ran the prefill; the picker cannot tell when it
		// ended, so its decision (its pending prefill released at the
		// first token) is released with the request, as the HTTP
		// gateway's sidecar mode releases it.
		t.pre.Done(gateway.DoneInfo{})
	}
	if t.pass != "" {
		r.metrics.Requests.WithLabelValues(t.ms.Name, t.pass, code).Inc()
	} else {
		mm := front.Of(t.ms)
		mm.RequestsC(r.metrics, t.ms.Name, t.kind, code).Inc()
		mm.DurationO(r.metrics, t.ms.Name, t.kind).Observe(r.opts.Clock().Sub(t.start).Seconds())
	}
	r.metrics.InFlight.Dec()
	r.flow.Kick(t.ms.Name) // its replica may have room for one held
	head := t.head
	head.Reset()
	*t = tracker{head: head}
	r.pool.Put(t)
}

package fleetpick

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/flow"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/keys"
	"github.com/examlops/gateway/picker"
)

// pickRequest is one request being picked for.
type pickRequest struct {
	r        *Router
	kind     keys.Endpoint
	start    time.Time
	ms       *fleet.Model
	lora     *fleet.AdapterRoute // the LoRA adapter the request names; nil for the base model
	stream   bool                // the client asked for an event stream ("stream": true)
	slo      front.SLO           // the request's latency objective (Options.Objectives)
	key      gateway.Key
	fallback int
	tab      *table
	sub      picker.Subset
	// pin is the replica that stored the response a Responses API
	// request continues (prev, its previous_response_id), "" if none is
	// known.
	pin, prev string
	// client is a Responses API request's client's address (clientOf),
	// whose share of the response-id table its answer's id counts against.
	client string
	// ctx, hdr and size are the request's context, headers and body size,
	// for flow control (Options.Flow); first, when set, is the decision
	// bound at dispatch.
	ctx   context.Context
	hdr   picker.Headers
	size  int64
	first *gateway.Decision
	// assemble is whether the answer may be streamed from the engine and
	// assembled (Pick.Assemble; assembly); assembled, that it will be
	// (picker.PickRequest.CanAssemble too): its first token is then seen.
	assemble  picker.Assembly
	assembled bool
}

// assembly is the Pick.Assemble of a request of kind, read as rq from
// body: the HTTP gateway's choice of the answers it streams from the
// engine (keys.StreamUpstream).
func assembly(kind keys.Endpoint, rq *keys.Request, body []byte) picker.Assembly {
	switch {
	case !keys.StreamUpstream(kind, rq, body):
		return picker.AssembleNone
	case kind == keys.Chat:
		return picker.AssembleChat
	default:
		return picker.AssembleCompletions
	}
}

// adapter is the request's LoRA adapter, "" for the base model.
func (pr *pickRequest) adapter() string {
	if pr.lora == nil {
		return ""
	}
	return pr.lora.Name
}

// fail counts a request the picker answers with an error and returns the
// error, which answers as the HTTP gateway would: a 429 with Retry-After
// of one scrape interval (Router.retryAfter), a 405 with Allow: POST.
func (pr *pickRequest) fail(status int, typ, code, param string, err error) (picker.Pick, error) {
	r, model := pr.r, ""
	var mm *front.ModelMetrics
	if pr.ms != nil {
		model, mm = pr.ms.Name, front.Of(pr.ms)
	}
	mcode := strconv.Itoa(status)
	switch code {
	case front.CodeShed:
		mcode = front.CodeShed429 // reason="shed", as the HTTP gateway counts it
	case front.CodeSLOUnattainable:
		mcode = front.CodeSLO429
	case front.CodeClientCanceled: // gone while held (flow control), as the HTTP gateway counts it
		mcode = front.CodeClientCanceled
	}
	mm.RequestsC(r.metrics, model, pr.kind, mcode).Inc()
	if model != "" {
		mm.DurationO(r.metrics, model, pr.kind).Observe(r.opts.Clock().Sub(pr.start).Seconds())
	}
	se := &picker.StatusError{Status: status, Type: typ, Code: code, Param: param, Err: err, RetryAfter: r.retryAfter(status)}
	if status == http.StatusMethodNotAllowed { // the prompt endpoints accept POST only
		se.Allow = http.MethodPost
	}
	return picker.Pick{}, se
}

// retryAfter is the Retry-After of an answer with status: one scrape
// interval for a 429 (the picker rounds it up to a second,
// front.RetryAfter, as the HTTP gateway does), else none.
func (r *Router) retryAfter(status int) time.Duration {
	if status != http.StatusTooManyRequests {
		return 0
	}
	return r.fl.Options().ScrapeInterval
}

// allow returns the replicas of the model the pick may choose, for
// gateway.Target.Allow: for an adapter, those whose engines serve it;
// those with an endpoint (unless the prefill pool's, which the sidecar
// reaches); within the subset hint. nil (all) when that is every replica.
func (pr *pickRequest) allow(prefill bool) func(string) bool {
	var eligible map[string]bool
	if pr.lora != nil {
		eligible = pr.lora.Eligible
	}
	tab, ms, sub := pr.tab, pr.ms, pr.sub
	needEP := sub != nil || (!prefill && !tab.allIP[ms.Name])
	if eligible == nil && !needEP {
		return nil
	}
	return func(name string) bool {
		if eligible != nil && !eligible[name] {
			return false
		}
		return !needEP || tab.allows(ms, sub, name)
	}
}

// noEndpoint is the error of a pick that found no eligible replica.
func (pr *pickRequest) noEndpoint(pool string, err error) (picker.Pick, error) {
	ms := pr.ms
	what := "replica"
	if pool != "" {
		what = pool + " replica"
	}
	msg := fmt.Sprintf("gateway: no healthy %s for model %q", what, ms.Name)
	if pr.lora != nil {
		msg = fmt.Sprintf("gateway: no healthy %s serving LoRA adapter %q of model %q", what, pr.lora.Name, ms.Name)
	}
	if pr.sub != nil {
		msg += fmt.Sprintf(" within the subset hint %v", []string(pr.sub))
	}
	var bad []string
	for _, r := range ms.Order {
		if ms.PD != nil && ms.PD.PrefillNames[r] {
			continue
		}
		if ep := ms.ByName[r]; ep != nil {
			if _, ok := pr.tab.bad[ep.Base]; ok {
				bad = append(bad, r+"="+ep.Base)
			}
		}
	}
	if len(bad) > 0 {
		msg += fmt.Sprintf(" (replicas whose address is not ip:port are never picked: %s)", strings.Join(bad, ", "))
	}
	return pr.fail(http.StatusServiceUnavailable, front.TypeUnavailable, "no_healthy_replica", "",
		fmt.Errorf("%w: %s: %v", picker.ErrNoEndpoint, msg, err))
}

// target is the gateway.Target of a pick within allow (pr.allow).
func (pr *pickRequest) target(allow func(string) bool) gateway.Target {
	t := gateway.Target{Adapter: pr.adapter(), Allow: allow}
	pr.slo.Apply(&t)
	return t
}

// route routes the request over its model's gateway and returns the pick.
func (pr *pickRequest) route() (picker.Pick, error) {
	r, ms := pr.r, pr.ms
	allow := pr.allow(false)
	if r.flow != nil {
		held := ms
		if err := pr.hold(allow); err != nil {
			if errors.Is(err, picker.ErrRequestTimeout) {
				// The picker answers 408 (its RequestTimeout ran out while
				// the request was held): counted as such.
				return pr.fail(http.StatusRequestTimeout, front.TypeInvalidRequest, "request_timeout", "", err)
			}
			status, typ, code, msg := front.FlowAnswer(ms.Name, err)
			if status == http.StatusTooManyRequests {
				err = fmt.Errorf("%w: %s", picker.ErrShed, msg)
			} else {
				err = errors.New(msg)
			}
			return pr.fail(status, typ, code, "", err)
		}
		if pr.ms != held { // bound to a table that has replicas (scale from zero)
			ms, allow = pr.ms, pr.allow(false)
			if pdGatewayMode(ms, pr.kind) { // only admitted: nothing to release
				return pr.pdGatewayMode()
			}
		}
	} else if a := r.opts.Admission; ms.Gateway.Saturated(pr.target(allow), a) {
		return pr.fail(http.StatusTooManyRequests, front.TypeRateLimit, front.CodeShed, "",
			fmt.Errorf("%w: gateway: model %q is saturated: no eligible replica has room (%s)", picker.ErrShed, ms.Name, front.AdmissionText(a)))
	}
	if ms.PD != nil && pr.kind != keys.Responses {
		// A responses request is decoded co-located. A split request goes
		// as it is: the sidecar's own requests are not assembled.
		pr.assembled = false
		return pr.routePD(allow)
	}
	if pr.pin != "" {
		return pr.routePinned(allow)
	}
	var failed string
	for try := 0; try < 2; try++ {
		t := pr.target(allow)
		t.Exclude = failed
		var d gateway.Decision
		var err error
		if try == 0 && pr.first != nil {
			d = *pr.first
		} else {
			d, err = ms.Gateway.RouteWith(pr.key, t)
		}
		if err != nil {
			if errors.Is(err, gateway.ErrNoHealthyReplica) {
				return pr.noEndpoint("", err)
			}
			return pr.fail(http.StatusInternalServerError, front.TypeServer, "routing_error", "", err)
		}
		ep, endpoint, err := pr.endpoint(&d)
		if err != nil {
			// A reload moved the replica (or gave it a host name): release
			// the decision and try another.
			d.Done(gateway.DoneInfo{Err: err})
			failed = d.Replica
			continue
		}
		// The objective's rule applies to the first decision; a retry
		// on another replica goes best effort.
		if try == 0 {
			if refused, err := pr.refuse(&d); refused {
				return picker.Pick{}, err
			}
		}
		tr := pr.track(d, ep, endpoint)
		return picker.Pick{Endpoint: endpoint, Fallbacks: pr.fallbacks(allow, d.Replica), Headers: pr.pdHeaders(), ResponseHeaders: pr.decisionHeaders(&d), Tracker: tr, Assemble: pr.assemble}, nil
	}
	return pr.noEndpoint("", fmt.Errorf("replica %q is no longer configured", failed))
}

// routePinned routes a Responses API request continuing a stored response
// to the replica that stored it (pr.pin), as the HTTP gateway pins it: by
// the library's decision (RouteWith, allowing that replica alone), with
// no fallbacks, since no other replica holds the response. When that
// replica is not eligible (unhealthy, outside the subset hint, not
// serving the adapter, no longer configured) the client gets 503, as from
// the HTTP gateway: no other engine holds the response.
func (pr *pickRequest) routePinned(allow func(string) bool) (picker.Pick, error) {
	ms, pin := pr.ms, pr.pin
	t := pr.pinned(allow)
	if a := pr.r.opts.Admission; pr.r.flow == nil && ms.Gateway.Saturated(t, a) {
		return pr.fail(http.StatusTooManyRequests, front.TypeRateLimit, front.CodeShed, "",
			fmt.Errorf("%w: gateway: model %q is saturated: replica %q, which stored response %q, has no room (%s)", picker.ErrShed, ms.Name, pin, pr.prev, front.AdmissionText(a)))
	}
	var d gateway.Decision
	var err error
	if pr.first != nil {
		d = *pr.first
	} else {
		d, err = ms.Gateway.RouteWith(pr.key, t)
	}
	if err != nil {
		if errors.Is(err, gateway.ErrNoHealthyReplica) {
			return pr.noEndpoint("", fmt.Errorf("replica %q, which stored response %q, is not eligible: %w", pin, pr.prev, err))
		}
		return pr.fail(http.StatusInternalServerError, front.TypeServer, "routing_error", "", err)
	}
	ep, endpoint, err := pr.endpoint(&d)
	if err != nil {
		d.Done(gateway.DoneInfo{Err: err})
		return pr.noEndpoint("", err)
	}
	if refused, err := pr.refuse(&d); refused {
		return picker.Pick{}, err
	}
	tr := pr.track(d, ep, endpoint)
	return picker.Pick{Endpoint: endpoint, Headers: pr.pdHeaders(), ResponseHeaders: pr.decisionHeaders(&d), Tracker: tr}, nil
}

// SetObjectives replaces flow control's objectives (name to priority;
// Options.Flow.Objectives), as a watch of Kubernetes' InferenceObjectives
// does; without flow control it does nothing. m is not modified after.
func (r *Router) SetObjectives(m map[string]int) { r.flow.SetObjectives(m) }

// pinned is the target of a request pinned to pr.pin, within allow.
func (pr *pickRequest) pinned(allow func(string) bool) gateway.Target {
	pin := pr.pin
	return pr.target(func(name string) bool { return name == pin && (allow == nil || allow(name)) })
}

// holdTarget is the target a held request is bound within: pinned to
// pr.pin if the request has one (routePinned), else its model's (route).
func (pr *pickRequest) holdTarget(allow func(string) bool) gateway.Target {
	if pr.pin != "" {
		return pr.pinned(allow)
	}
	return pr.target(allow)
}

// hold passes the request through its model's flow-control queue
// (Options.Flow on), as the HTTP gateway's hold: it returns nil once the
// request may go, its decision made at that moment (pr.first), holding
// the ext_proc stream meanwhile. Bound means no replica lacks room under
// Options.Admission and the library routes it; with no healthy replica
// the request waits for one or its deadline, but one pinned to a replica
// that is not eligible goes at once, to be answered 503
// (flow.BindPinned). A disaggregated model's
// request is only admitted: its plan is made after.
func (pr *pickRequest) hold(allow func(string) bool) error {
	ms := pr.ms
	t := pr.holdTarget(allow)
	pd := ms.PD != nil && pr.kind != keys.Responses
	var first gateway.Decision
	bound := false
	a := pr.r.flow.Admission(pr.r.opts.Admission, pr.hdr) // its band's usage limit
	err := pr.r.flow.Hold(pr.ctx, ms.Name, pr.hdr, pr.size, func() bool {
		if ms.Gateway == nil {
			// No replica when it came (scale from zero): it binds to
			// the model's table once that has one (route takes pr.ms).
			st := pr.r.fl.Snapshot()
			cur := st.Models[ms.Name]
			if cur == nil || cur.Gateway == nil {
				return false
			}
			ms, pr.ms, pr.tab = cur, cur, pr.r.tableOf(st)
			pd = ms.PD != nil && pr.kind != keys.Responses
			t = pr.holdTarget(pr.allow(false))
		}
		var ok, routed bool
		var d gateway.Decision
		if pr.pin != "" {
			// Its replica not eligible: answered at once, as without
			// flow control (routePinned).
			ok, d, routed = flow.BindPinned(ms.Gateway, pr.key, t, a)
		} else {
			ok, d, routed = flow.Bind(ms.Gateway, pr.key, t, a, pd)
		}
		first, bound = d, routed
		return ok
	})
	if err == nil && bound {
		pr.first = &first
	}
	return err
}

// pdHeaders are the upstream headers of a request routed co-located: the
// client's Accept-Encoding removed (the picker reads the answer: its
// first token, its usage, an assembly; it must come as it is), and for
// a disaggregated model (a Responses API request) a client's own
// x-prefiller-host-port.
func (pr *pickRequest) pdHeaders() []picker.Header {
	if pr.ms.PD == nil {
		return identity
	}
	return identityNoPrefill
}

// identity and identityNoPrefill are pdHeaders' lists, shared: a Pick's
// Headers are only read.
var (
	identity          = []picker.Header{{Name: "accept-encoding"}}
	identityNoPrefill = []picker.Header{{Name: prefillHeader}, {Name: "accept-encoding"}}
)

// endpoint returns the engine decision d is to be sent to and its
// endpoint, or why there is none.
func (pr *pickRequest) endpoint(d *gateway.Decision) (*fleet.Endpoint, string, error) {
	ep := front.EndpointOf(pr.r.fl.Snapshot(), pr.ms, d)
	if ep == nil {
		return nil, "", fmt.Errorf("replica %q (%s) is no longer configured", d.Replica, d.Address)
	}
	endpoint, err := pr.tab.endpointOf(ep.Base)
	return ep, endpoint, err
}

// fallbacks returns the endpoints of up to Fallbacks other eligible
// replicas than picked, as the library ranks them (gateway.Spares).
func (pr *pickRequest) fallbacks(allow func(string) bool, picked string) []string {
	n := pr.r.opts.Fallbacks
	if n == 0 {
		return nil
	}
	t := pr.target(allow)
	t.Exclude = picked
	var buf [8]string
	names := pr.ms.Gateway.Spares(buf[:0], n, t)
	out := make([]string, 0, len(names))
	for _, name := range names {
		if ep := pr.ms.ByName[name]; ep != nil {
			if pe, ok := pr.tab.eps[ep.Base]; ok {
				out = append(out, pe.ep)
			}
		}
	}
	return out
}

// decisionHeaders are the response headers that report a pick's decision
// to the client as the HTTP gateway reports its own (HeaderReplica,
// HeaderDecision).
func (pr *pickRequest) decisionHeaders(d *gateway.Decision) []picker.Header {
	return []picker.Header{{Name: front.HeaderReplica, Value: d.Replica}, {Name: front.HeaderDecision, Value: front.DescribeDecision(pr.ms, pr.fallback, d)}}
}

// track counts a decision and returns the Tracker of its request.
func (pr *pickRequest) track(d gateway.Decision, ep *fleet.Endpoint, endpoint string) *tracker {
	r, ms := pr.r, pr.ms
	r.metrics.CountDecision(ms, &d)
	r.metrics.ReplicaRequests(ms, d.Replica).Inc()
	r.metrics.InFlight.Inc()
	t := r.pool.Get().(*tracker)
	*t = tracker{r: r, ms: ms, kind: pr.kind, start: pr.start, d: d, ep: ep, endpoint: endpoint, tab: pr.tab, client: pr.client, slo: pr.slo}
	// A plain answer reaches the picker whole, at its end: its first
	// token is not seen, so the replica's pending prefill is released when
	// predicted over.
	t.stop = front.ReleaseAtPrediction(d, pr.stream || pr.assembled, r.afterFunc)
	return t
}

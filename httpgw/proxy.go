package httpgw

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/budget"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/keys"
)

// Response headers the gateway adds to proxied responses (the picker
// adds the same ones, defined in internal/front).
const (
	// HeaderReplica names the replica that served the request.
	HeaderReplica = front.HeaderReplica
	// HeaderDecision gives the routing decision's kind and prefix match,
	// e.g. "affinity; matched=12/14".
	HeaderDecision = front.HeaderDecision
)

// outcome is what one request came to, for the request counter.
type outcome struct {
	model string
	kind  keys.Endpoint
	mm    *front.ModelMetrics // the model's cached series, once known
	code  string
}

// errFirstByteTimeout marks an engine that sent no response byte within
// the first-byte timeout (Options.FirstByteTimeout or ResponseTimeout).
// Like the other causes of an upstream failure it is wrapped in a message
// that starts with ErrUpstream's "gateway:".
var errFirstByteTimeout = errors.New("no response byte within the first-byte timeout")

// errResponseTimeout marks a non-streamed answer not complete within
// Options.ResponseTimeout; the client gets 504 if nothing was sent to it.
var errResponseTimeout = errors.New("the answer was not complete within the response timeout")

// errUpstreamStatus marks a 5xx answer from an engine; like
// errFirstByteTimeout it is a cause inside an ErrUpstream message.
var errUpstreamStatus = errors.New("engine answered with a server error")

// errUpstreamInterim marks an engine whose final answer was a 1xx status
// (a 101 Switching Protocols, which the gateway never asks for).
var errUpstreamInterim = errors.New("engine answered with a 1xx status as its final answer")

// fail answers the client with an error response and records its status
// as the request's outcome.
func (oc *outcome) fail(w http.ResponseWriter, status int, typ, code, param, msg string) {
	oc.code = strconv.Itoa(status)
	front.WriteError(w, status, typ, code, param, msg)
}

// call is one inference request on its way through the gateway: what the
// handler has read of it, and what it came to.
type call struct {
	w     http.ResponseWriter
	r     *http.Request
	start time.Time // when it arrived
	// retried is the time its earlier tries took: the latency reported
	// for a retry's replica leaves it out (finish).
	retried time.Duration
	body    []byte
	req     *keys.Request
	ms      *fleet.Model // the model's routing table
	key     gateway.Key
	// fallback, for a model on the exact index, is why the request was
	// keyed without tokens (a fallback* value), -1 if it was not.
	fallback int
	// lora is the LoRA adapter the request names (lora.go); nil for the
	// base model.
	lora *fleet.AdapterRoute
	oc   outcome
	// first, when set, is the decision of the first try, made before
	// proxy (a disaggregated model's decode decision, see proxyPD).
	first *gateway.Decision
	// upHeader, when set, edits the headers of each upstream request
	// after the client's are copied (P/D: x-request-id,
	// x-prefiller-host-port).
	upHeader func(http.Header)
	// sidecarPrefill, when set, is the prefill decision of a request split
	// behind a sidecar (disagg.go), whose prefill is over once the
	// sidecar answers.
	sidecarPrefill *gateway.Decision
	// handed says the request is split and its KV cache comes from a
	// prefill replica: a retried decode is routed by the P/D plan too
	// (gateway.PD.RouteDecode), which does not count its prefill there.
	handed bool
	// pin, when set, is the one replica the call may go to: the one
	// holding the response a Responses API request continues
	// (responses.go).
	pin string
	// head reads the start of a Responses API answer until its id is
	// learned; learned says it was (or cannot be).
	head    front.ResponseHead
	learned bool
	// aggregate is set when the engine is asked to stream the answer of
	// a non-streamed request (upstream.go); hold is then the answer's
	// share of Options.MaxAssembledBytes.
	aggregate bool
	hold      budget.Hold
	// in is the request body's share of Options.MaxRequestBytes, with
	// the bodies made from it (bodies.go).
	in budget.Hold
	// slo is the request's latency objective (Options.Objectives, the
	// headers over the model's default); sloChecked says the rule was
	// applied to its decision already (a split P/D plan's, disagg.go).
	slo        front.SLO
	sloChecked bool
	// meter counts the output tokens of the answer being relayed.
	meter front.Meter
	// attempt is the current try on a replica (forward).
	attempt
}

// fail answers the call's client with an error (outcome.fail).
func (c *call) fail(status int, typ, code, param, msg string) {
	c.oc.fail(c.w, status, typ, code, param, msg)
}

// serveInference handles /v1/chat/completions, /v1/completions and
// /v1/responses.
func (s *Server) serveInference(w http.ResponseWriter, r *http.Request, kind keys.Endpoint) {
	c := &call{w: w, r: r, start: s.opts.Clock(), oc: outcome{kind: kind}}
	s.metrics.InFlight.Inc()
	defer s.record(c)
	defer s.releaseBody(&c.in)
	if !s.admit(c) {
		return
	}
	slo, err := s.opts.Objectives.For(c.ms.Name, r.Header)
	if err != nil {
		c.oc.fail(w, http.StatusBadRequest, front.TypeInvalidRequest, "invalid_header", front.Param(err), err.Error())
		return
	}
	c.slo = slo
	if kind == keys.Responses && c.req.PreviousResponseID != "" {
		c.pin, _ = front.StoredOwner(s.Snapshot(), &s.respIDs, c.req.PreviousResponseID, c.ms.Name)
	}
	kp := s.keyer.Buffer()
	c.key, c.fallback = s.keyer.Key(r.Context(), (*kp)[:0], c.ms, front.Input{Kind: kind, Body: c.body, Req: c.req,
		Session: r.Header.Get(HeaderSessionID), RAG: r.Header.Get(HeaderRAGContext), Adapter: c.adapterName()})
	defer func() { s.keyer.Release(kp, c.key) }()
	if s.flow != nil {
		if !s.hold(c) {
			return
		}
	} else if s.shed(c) {
		return
	}
	if !s.upstreamStream(c) {
		if c.first != nil { // bound by flow control, not sent
			c.first.Done(gateway.DoneInfo{Err: errors.New("gateway: over the assembled-answer budget")})
		}
		return
	}
	defer s.releaseAssembled(c)
	if c.ms.PD != nil && kind != keys.Responses {
		s.proxyPD(c) // a responses request is decoded co-located
		return
	}
	if c.ms.PD != nil {
		// A client's own prefill header never reaches a sidecar (proxyPD).
		c.upHeader = func(h http.Header) { h.Del(headerPrefillerHostPort) }
	}
	s.proxy(c)
}

// record counts a finished call in the request metrics.
func (s *Server) record(c *call) {
	s.metrics.InFlight.Dec()
	if c.ms != nil {
		s.flow.Kick(c.ms.Name) // its replica may have room for one held
	}
	oc := &c.oc
	// Before the model is known oc.mm is nil and requestsC looks the
	// series up; only requests for a known model are timed.
	oc.mm.RequestsC(s.metrics, oc.model, oc.kind, oc.code).Inc()
	if oc.model != "" {
		oc.mm.DurationO(s.metrics, oc.model, oc.kind).Observe(s.opts.Clock().Sub(c.start).Seconds())
	}
}

// admit reads and checks a call's request: method, body, JSON, model. It
// answers the client and returns false if the request cannot be routed.
func (s *Server) admit(c *call) bool {
	w, r, oc := c.w, c.r, &c.oc
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		oc.fail(w, http.StatusMethodNotAllowed, front.TypeInvalidRequest, "method_not_allowed", "", "gateway: "+r.URL.Path+" accepts POST only, not "+r.Method)
		return false
	}
	if s.refused(w, r, c.fail) {
		return false
	}
	body, ok := s.readRequest(w, r, &c.in, c.fail)
	if !ok {
		return false
	}
	st := s.Snapshot()
	req, err := front.Parse(oc.kind, body)
	if err != nil {
		// "model" may be left out when the gateway serves one model.
		req, body, err = defaultModel(st, oc.kind, body, err, &c.in)
		if errors.Is(err, budget.ErrSpent) {
			s.bodiesOverBudget(w, c.fail, err)
			return false
		}
	}
	if err != nil {
		oc.fail(w, http.StatusBadRequest, front.TypeInvalidRequest, "invalid_request", front.Param(err), err.Error())
		return false
	}
	ms, ok := st.Models[req.Model]
	if !ok {
		if c.lora = s.resolveAdapter(c, st, req.Model); c.lora == nil {
			return false
		}
		ms = c.lora.Model
	}
	oc.model, oc.mm = ms.Name, front.Of(ms)
	if ms.NoReplicas && len(ms.MissingPools) > 0 {
		oc.fail(w, http.StatusServiceUnavailable, front.TypeUnavailable, "no_replicas", "model",
			fmt.Sprintf("%v: model %q is disaggregated but its pools %q are not defined", ErrNoReplicas, ms.Name, ms.MissingPools))
		return false
	}
	if ms.NoReplicas && (s.flow == nil || c.lora != nil) {
		// With flow control the request waits for a replica (hold).
		oc.fail(w, http.StatusServiceUnavailable, front.TypeUnavailable, "no_replicas", "model",
			fmt.Sprintf("%v: model %q has no replicas configured", ErrNoReplicas, ms.Name))
		return false
	}
	c.body, c.req, c.ms = body, req, ms
	return true
}

// proxy routes and forwards an admitted call, retrying once on another
// replica when the first fails before sending any response byte.
func (s *Server) proxy(c *call) {
	ms, oc := c.ms, &c.oc
	var lastErr error
	var failed string
	for try := 0; try < 2; try++ {
		// A retry leaves out the replica that just failed, which the
		// health checks may not have ejected yet.
		var dec gateway.Decision
		var err error
		switch {
		case try == 0 && c.first != nil:
			dec = *c.first
		case c.handed:
			dec, err = ms.PD.Plan.RouteDecode(c.key, c.target(failed))
		default:
			dec, err = ms.Gateway.RouteWith(c.key, c.target(failed))
		}
		if err != nil {
			switch {
			case !errors.Is(err, gateway.ErrNoHealthyReplica):
				oc.fail(c.w, http.StatusInternalServerError, front.TypeServer, "routing_error", "", err.Error())
			case try > 0:
				status, code := failStatus(lastErr)
				oc.fail(c.w, status, front.TypeServer, code, "",
					fmt.Sprintf("%v: model %q: %v; no other healthy replica to retry on", ErrUpstream, ms.Name, lastErr))
			case c.pin != "":
				oc.fail(c.w, http.StatusServiceUnavailable, front.TypeUnavailable, "no_healthy_replica", "",
					fmt.Sprintf("gateway: model %q: replica %q, which stored response %q, is not eligible (no other engine holds it)", ms.Name, c.pin, c.req.PreviousResponseID))
			case c.lora != nil:
				oc.fail(c.w, http.StatusServiceUnavailable, front.TypeUnavailable, "no_healthy_replica", "",
					fmt.Sprintf("gateway: no healthy replica serving LoRA adapter %q of model %q", c.lora.Name, ms.Name))
			default:
				oc.fail(c.w, http.StatusServiceUnavailable, front.TypeUnavailable, "no_healthy_replica", "",
					fmt.Sprintf("gateway: no healthy replica for model %q", ms.Name))
			}
			return
		}
		now := s.opts.Clock()
		if try > 0 {
			c.retried += now.Sub(c.attempt.routed)
		}
		c.attempt = attempt{d: dec, routed: now}
		d := &c.d
		// The objective's rule applies to the first decision; a retry
		// goes best effort.
		if try == 0 && !c.sloChecked && s.refuse(c, d) {
			return
		}
		if try > 0 {
			s.metrics.Retries.WithLabelValues(ms.Name).Inc()
			if ms.PD != nil {
				s.metrics.PDCount(ms, fleet.PDDecodeRetry)
			}
		}
		s.metrics.CountDecision(ms, d)
		s.metrics.ReplicaRequests(ms, d.Replica).Inc()
		ep := front.EndpointOf(s.Snapshot(), ms, d)
		if ep == nil {
			// The shared gateway chose a replica that a reload added or
			// moved after this request took its snapshot, and no snapshot
			// knows the engine: release the decision and try another.
			err := fmt.Errorf("replica %q (%s) is no longer configured", d.Replica, d.Address)
			d.Done(gateway.DoneInfo{Err: err})
			if try == 0 {
				lastErr, failed = err, d.Replica
				continue
			}
			oc.fail(c.w, http.StatusBadGateway, front.TypeServer, "upstream_error", "", fmt.Sprintf("%v: %v", ErrUpstream, err))
			return
		}
		c.ep, c.canRetry = ep, try == 0
		retry, err := s.forward(c)
		if !retry {
			return
		}
		lastErr, failed = err, d.Replica
	}
	// Not reached: the second try is made with canRetry false, so it
	// always answers. Kept so that a change there cannot leave the client
	// with an empty 200.
	oc.fail(c.w, http.StatusBadGateway, front.TypeServer, "upstream_error", "",
		fmt.Sprintf("%v: model %q: %v (after one retry)", ErrUpstream, ms.Name, lastErr))
}

// refuse applies the objective rule to decision d of call c
// (front.Metrics.CheckSLO): it counts a decision no replica was
// predicted to meet and, when Options.Objectives rejects those, answers
// 429 slo_unattainable with Retry-After, d released, and returns true.
func (s *Server) refuse(c *call, d *gateway.Decision) bool {
	c.sloChecked = true
	refused := s.metrics.CheckSLO(&s.opts.Objectives, c.ms.Name, c.slo, d)
	if refused {
		c.w.Header().Set("Retry-After", s.retryAfter())
		front.WriteSLOUnattainable(c.w, c.ms.Name, c.slo, d)
		c.oc.code = front.CodeSLO429
	}
	return refused
}

// upstreamRequest returns the request that forwards an inference request
// (path and query u, the body already read) to the engine ep, with no
// headers yet. Its body is an in-memory reader that GetBody can recreate
// for a resend, so that net/http writes the head and the body together
// (one TCP segment for a small request) rather than flushing the head
// first. For the usual engine address (scheme and host only) and a path
// without a query it is built without parsing a URL.
func upstreamRequest(ctx context.Context, ep *fleet.Endpoint, u *url.URL, body []byte) (*http.Request, error) {
	newBody := func() io.ReadCloser { return io.NopCloser(bytes.NewReader(body)) }
	if ep.HostOnly != nil && u.RawQuery == "" && u.Path != "" {
		out := &http.Request{
			Method:        http.MethodPost,
			URL:           &url.URL{Scheme: ep.HostOnly.Scheme, Host: ep.HostOnly.Host, Path: u.Path, RawPath: u.RawPath},
			Proto:         "HTTP/1.1",
			ProtoMajor:    1,
			ProtoMinor:    1,
			Header:        make(http.Header, 8),
			Body:          newBody(),
			GetBody:       func() (io.ReadCloser, error) { return newBody(), nil },
			ContentLength: int64(len(body)),
			Host:          ep.HostOnly.Host,
		}
		return out.WithContext(ctx), nil
	}
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.Base+u.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	out.ContentLength = int64(len(body))
	out.GetBody = func() (io.ReadCloser, error) { return newBody(), nil }
	return out, nil
}

// isHopHeader reports whether the header key k, in any case, is a
// connection-level header a proxy must not forward.
func isHopHeader(k string) bool {
	// CanonicalHeaderKey returns an already canonical key (as parsed
	// headers have) as it is, without allocating.
	switch http.CanonicalHeaderKey(k) {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
		"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// copyHeaders copies end-to-end headers from src to dst: not the
// hop-by-hop ones, nor those that any of src's Connection lines names.
// The copied values share one new backing array.
func copyHeaders(dst, src http.Header) {
	conn := src["Connection"]
	n := 0
	for _, vv := range src {
		n += len(vv)
	}
	vals := make([]string, 0, n)
	for k, vv := range src {
		if isHopHeader(k) || (len(conn) > 0 && connectionNames(conn, k)) {
			continue
		}
		i := len(vals)
		vals = append(vals, vv...)
		dst[k] = vals[i:len(vals):len(vals)]
	}
}

// connectionNames reports whether the Connection field lines conn name
// the header k (RFC 9110 7.6.1: each line a comma-separated list).
func connectionNames(conn []string, k string) bool {
	for _, line := range conn {
		for name := range strings.SplitSeq(line, ",") {
			if strings.EqualFold(k, strings.TrimSpace(name)) {
				return true
			}
		}
	}
	return false
}

// isDialError reports whether err is a failure to connect (the engine is
// not listening), which ejects the engine at once.
func isDialError(err error) bool { return fleet.IsDialError(err) }

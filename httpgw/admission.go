package httpgw

import (
	"fmt"
	"net/http"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/flow"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/keys"
)

// Admission at the fronts: a request of a model whose eligible replicas
// have no room under Options.Admission (the library's rule,
// gateway.Gateway.Saturated, after GIE's saturation detector) is shed with
// 429, an OpenAI rate_limit_error and Retry-After, before any replica is
// chosen; the picker's Router answers the same (fleetpick.Options). Shed requests are
// counted in exa_gateway_requests_total{code="429",reason="shed"}. The
// pass-through endpoints (/v1/embeddings, /tokenize, /detokenize) are
// shed by the same rule, for a request without a prompt
// (gateway.Target.NoPrompt), as they are routed.

// retryAfter is the Retry-After of every 429 (front.RetryAfter): one
// scrape interval rounded up to a second, as the picker answers.
func (s *Server) retryAfter() string {
	return front.RetryAfter(s.Fleet.Options().ScrapeInterval)
}

// hold passes call c through its model's flow-control queue (Options.Flow
// on): it returns true once c may go, with its first decision made at
// that moment (late binding, c.first), and false once it has answered the
// client (queue full, displaced, held past its deadline, client gone).
// Bound means no replica lacks room under Options.Admission and the
// library routes it; a model without a healthy replica, or configured
// with none (a pool with no ready pod), holds its requests until one
// comes (scale from zero) or their deadline; a continuation pinned to a
// replica that is not eligible goes at once, to be answered 503
// (flow.BindPinned). A disaggregated
// model's request is only admitted there: its plan is made after.
func (s *Server) hold(c *call) bool {
	ms := c.ms
	pd := ms.PD != nil && c.oc.kind != keys.Responses
	var first gateway.Decision
	bound := false
	a := s.flow.Admission(s.opts.Admission, c.r.Header) // its band's usage limit
	err := s.flow.Hold(c.r.Context(), ms.Name, c.r.Header, int64(len(c.body)), func() bool {
		if ms.Gateway == nil {
			// No replica when it came (scale from zero): it binds to
			// the model's table once that has one.
			cur := s.Snapshot().Models[ms.Name]
			if cur == nil || cur.Gateway == nil {
				return false
			}
			ms, c.ms = cur, cur
			pd = ms.PD != nil && c.oc.kind != keys.Responses
		}
		var ok, routed bool
		var d gateway.Decision
		if c.pin != "" {
			// Its replica not eligible: answered at once, as without
			// flow control (proxy).
			ok, d, routed = flow.BindPinned(ms.Gateway, c.key, c.target(""), a)
		} else {
			ok, d, routed = flow.Bind(ms.Gateway, c.key, c.target(""), a, pd)
		}
		first, bound = d, routed
		return ok
	})
	if err != nil {
		s.mem.unheld(int64(len(c.body)))
		status, typ, code, msg := front.FlowAnswer(ms.Name, err)
		if status == http.StatusTooManyRequests {
			c.w.Header().Set("Retry-After", s.retryAfter())
		}
		c.oc.fail(c.w, status, typ, code, "", msg)
		switch code {
		case front.CodeShed:
			c.oc.code = front.CodeShed429
		case front.CodeClientCanceled:
			c.oc.code = front.CodeClientCanceled
		}
		return false
	}
	if bound {
		c.first = &first
	}
	return true
}

// SetObjectives replaces flow control's objectives (name to priority;
// Options.Flow.Objectives), as a watch of Kubernetes' InferenceObjectives
// does; without flow control it does nothing. m is not modified after.
func (s *Server) SetObjectives(m map[string]int) { s.flow.SetObjectives(m) }

// shed sheds call c, answering 429, if its model is saturated under
// Options.Admission, and reports whether it did.
func (s *Server) shed(c *call) bool {
	if !s.saturated(c.w, c.ms, c.target("")) {
		return false
	}
	c.oc.code = front.CodeShed429
	return true
}

// saturated asks the library whether model ms has no eligible replica
// with room for a request of target t under Options.Admission
// (gateway.Gateway.Saturated) and, if so, answers w with 429 and
// Retry-After. Inference (shed) and pass-through requests (passShed) are
// shed by this one rule.
func (s *Server) saturated(w http.ResponseWriter, ms *fleet.Model, t gateway.Target) bool {
	a := s.opts.Admission
	if ms.Gateway == nil || !ms.Gateway.Saturated(t, a) {
		return false
	}
	w.Header().Set("Retry-After", s.retryAfter())
	front.WriteError(w, http.StatusTooManyRequests, front.TypeRateLimit, front.CodeShed, "",
		fmt.Sprintf("gateway: model %q is saturated: no eligible replica has room (%s); retry later", ms.Name, front.AdmissionText(a)))
	return true
}

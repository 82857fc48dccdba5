package httpgw

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/front"
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

// retryAfter is the Retry-After a shed request gets: one scrape interval
// rounded up to a second, when the load it was shed for is next read.
func (s *Server) retryAfter() string {
	return strconv.Itoa(max(1, int((s.Fleet.Options().ScrapeInterval+time.Second-1)/time.Second)))
}

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

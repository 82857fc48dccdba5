package httpgw

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/examlops/gateway/internal/front"
)

// Admission at the fronts: a request of a model whose eligible replicas
// have no room under Options.Admission (the library's rule,
// gateway.Gateway.Saturated, after GIE's saturation detector) is shed with
// 429, an OpenAI rate_limit_error and Retry-After, before any replica is
// chosen; the picker's Router answers the same (fleetpick.Options). Shed requests are
// counted in exa_gateway_requests_total{code="429",reason="shed"}.

// retryAfter is the Retry-After a shed request gets: one scrape interval
// rounded up to a second, when the load it was shed for is next read.
func (s *Server) retryAfter() string {
	return strconv.Itoa(max(1, int((s.Fleet.Options().ScrapeInterval+time.Second-1)/time.Second)))
}

// shed sheds call c, answering 429, if its model is saturated under
// Options.Admission, and reports whether it did.
func (s *Server) shed(c *call) bool {
	a := s.opts.Admission
	if !c.ms.Gateway.Saturated(c.target(""), a) {
		return false
	}
	c.w.Header().Set("Retry-After", s.retryAfter())
	c.oc.fail(c.w, http.StatusTooManyRequests, front.TypeRateLimit, front.CodeShed, "",
		fmt.Sprintf("gateway: model %q is saturated: no eligible replica has room (%s); retry later", c.ms.Name, front.AdmissionText(a)))
	c.oc.code = front.CodeShed429
	return true
}

package fleetpick

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/picker"
)

// A request's latency objective is the HTTP gateway's (front.Objectives):
// llm-d's headers x-slo-ttft-ms and x-slo-tpot-ms over the model's
// default (Options.Objectives), given to the library as the target's
// TTFT and TPOT, and the same rule when no replica is predicted to meet
// it: best effort, or 429 slo_unattainable with the decision released.

// sloHeaders returns the objective headers of h as an http.Header for
// front.Objectives.For; nil, allocating nothing, when there are none.
func sloHeaders(h picker.Headers) http.Header {
	var out http.Header
	for _, hd := range h {
		if strings.EqualFold(hd.Name, front.HeaderSLOTTFT) || strings.EqualFold(hd.Name, front.HeaderSLOTPOT) {
			if out == nil {
				out = http.Header{}
			}
			out.Add(hd.Name, hd.Value)
		}
	}
	return out
}

// refuse applies the objective rule to decision d (front.Metrics.CheckSLO):
// it counts a decision no replica was predicted to meet and, when the
// Router rejects those, returns the 429 that answers the request, d
// released.
func (pr *pickRequest) refuse(d *gateway.Decision) (bool, error) {
	r, ms := pr.r, pr.ms
	if !r.metrics.CheckSLO(&r.opts.Objectives, ms.Name, pr.slo, d) {
		return false, nil
	}
	_, err := pr.fail(http.StatusTooManyRequests, front.TypeRateLimit, front.CodeSLOUnattainable, "",
		fmt.Errorf("%w: %s", picker.ErrShed, front.SLOUnattainableMessage(ms.Name, pr.slo, d)))
	return true, err
}

package fleetpick

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/picker"
)

// prefillHeader is x-prefiller-host-port, the header llm-d's pd-sidecar
// reads for the prefill replica, as Envoy spells header names (lower
// case).
const prefillHeader = "x-prefiller-host-port"

// routePD picks for a disaggregated model in sidecar mode, as the HTTP
// gateway's sidecar mode routes: the library's P/D plan (gateway.PD.Route,
// through front's DecidePD) names the decode replica, load-aware over the
// decode pool, which is the endpoint; when the plan splits the request, a
// prefill replica, cache-aware over the prefill pool, goes to the sidecar
// in x-prefiller-host-port, which is otherwise removed so that a client's
// own never reaches the sidecar. Both stay within the subset hint. A
// prefill replica's address may have a host name: the sidecar resolves it.
func (pr *pickRequest) routePD(allow func(string) bool) (picker.Pick, error) {
	r, ms, pd := pr.r, pr.ms, pr.ms.PD
	pt := front.PrefillTarget(pr.target(pr.allow(true))) // the objective's TTFT only
	plan, err := r.metrics.DecidePD(ms, pr.key, pr.fallback, pr.target(allow), pt)
	if err != nil {
		if errors.Is(err, gateway.ErrNoHealthyReplica) {
			return pr.noEndpoint("decode", err)
		}
		return pr.fail(http.StatusInternalServerError, front.TypeServer, "routing_error", "", err)
	}
	dd := plan.Decode
	ep, endpoint, err := pr.endpoint(&dd)
	if err != nil {
		dd.Done(gateway.DoneInfo{Err: err})
		if plan.Split {
			plan.Prefill.Done(gateway.DoneInfo{Err: err})
		}
		return pr.noEndpoint("decode", err)
	}
	// The objective's rule applies to the decision that yields the first
	// token: a split plan's prefill, else the decode.
	first := &dd
	if plan.Split {
		first = &plan.Prefill
	}
	if refused, err := pr.refuse(first); refused {
		if plan.Split {
			dd.Done(gateway.DoneInfo{Err: front.ErrSLOUnattainable})
		}
		return picker.Pick{}, err
	}
	prefill := picker.Header{Name: prefillHeader} // removed unless split
	resp := pr.decisionHeaders(&dd)
	what := "colocated"
	switch {
	case plan.Split:
		prefill.Value = pd.PrefillHostPort(&plan.Prefill)
		what = "split"
		resp = append(resp, picker.Header{Name: front.HeaderPrefillReplica, Value: plan.Prefill.Replica},
			picker.Header{Name: front.HeaderPrefillDecision, Value: front.DescribeDecision(ms, pr.fallback, &plan.Prefill)})
	case plan.Reason != "cached":
		what = plan.Reason
	}
	resp = append(resp, picker.Header{Name: front.HeaderDisagg, Value: what + "; uncached=" + strconv.Itoa(plan.Uncached)})
	t := pr.track(dd, ep, endpoint)
	if plan.Split {
		t.preD = plan.Prefill
		t.pre = &t.preD
	}
	return picker.Pick{Endpoint: endpoint, Fallbacks: pr.fallbacks(allow, dd.Replica),
		Headers: []picker.Header{prefill, identity[0]}, ResponseHeaders: resp, Tracker: t}, nil
}

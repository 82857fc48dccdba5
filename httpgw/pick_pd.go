package httpgw

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/picker"
)

// pickerPrefillHeader is x-prefiller-host-port as Envoy spells header
// names (lower case).
const pickerPrefillHeader = "x-prefiller-host-port"

// routePD picks for a disaggregated model in sidecar mode, as the HTTP
// gateway's sidecar mode routes (proxyPD): the decode replica, load-aware
// over the decode pool, is the endpoint; when the decider splits the
// request, a prefill replica, cache-aware over the prefill pool, goes to
// the sidecar in x-prefiller-host-port, which is otherwise removed so that
// a client's own never reaches the sidecar. Both stay within the subset
// hint. A prefill replica's address may have a host name: the sidecar
// resolves it.
func (pr *pickRequest) routePD(allow func(string) bool) (picker.Pick, error) {
	s, ms, pd := pr.p.s, pr.ms, pr.ms.PD
	plan, err := s.decidePD(ms, pr.key, pr.fallback, pr.target(allow), pr.target(pr.allow(true)))
	if err != nil {
		if errors.Is(err, gateway.ErrNoHealthyReplica) {
			return pr.noEndpoint("decode", err)
		}
		return pr.fail(http.StatusInternalServerError, typeServer, "routing_error", "", err)
	}
	dd := plan.Decode
	ep := s.endpointOf(ms, &dd)
	var endpoint string
	if ep == nil {
		err = fmt.Errorf("replica %q (%s) is no longer configured", dd.Replica, dd.Address)
	} else {
		endpoint, err = pr.tab.endpointOf(ep.Base)
	}
	if err != nil {
		dd.Done(gateway.DoneInfo{Err: err})
		if plan.Split {
			plan.Prefill.Done(gateway.DoneInfo{Err: err})
		}
		return pr.noEndpoint("decode", err)
	}
	prefill := picker.Header{Name: pickerPrefillHeader} // removed unless split
	resp := pr.decisionHeaders(&dd)
	what := "colocated"
	switch {
	case plan.Split:
		prefill.Value = pd.HostPort[plan.Prefill.Replica]
		what = "split"
		resp = append(resp, picker.Header{Name: HeaderPrefillReplica, Value: plan.Prefill.Replica},
			picker.Header{Name: HeaderPrefillDecision, Value: describeDecision(ms, pr.fallback, &plan.Prefill)})
	case plan.Reason != "cached":
		what = plan.Reason
	}
	resp = append(resp, picker.Header{Name: HeaderDisagg, Value: what + "; uncached=" + strconv.Itoa(plan.Uncached)})
	t := pr.track(dd, ep, endpoint)
	if plan.Split {
		t.preD = plan.Prefill
		t.pre = &t.preD
	}
	return picker.Pick{Endpoint: endpoint, Fallbacks: pr.fallbacks(allow, dd.Replica),
		Headers: []picker.Header{prefill}, ResponseHeaders: resp, Tracker: t}, nil
}

// errNoPrefillPool: the model's prefill pool has no replicas.
var errNoPrefillPool = errors.New("the prefill pool has no replicas")

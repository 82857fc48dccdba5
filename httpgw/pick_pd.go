package httpgw

import (
	"errors"
	"fmt"
	"net/http"

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
func (pr *pickRequest) routePD(allow func(string) bool, fallbacks []string) (picker.Pick, error) {
	s, ms, pd := pr.p.s, pr.ms, pr.ms.pd
	dd, err := ms.gw.RouteAdapter(pr.key, pr.adapter(), allow)
	if err != nil {
		if errors.Is(err, gateway.ErrNoHealthyReplica) {
			return pr.noEndpoint("decode", err)
		}
		return pr.fail(http.StatusInternalServerError, typeServer, "routing_error", "", err)
	}
	ep := s.endpointOf(ms, &dd)
	var endpoint string
	if ep == nil {
		err = fmt.Errorf("replica %q (%s) is no longer configured", dd.Replica, dd.Address)
	} else {
		endpoint, err = pr.tab.endpointOf(ep.base)
	}
	if err != nil {
		dd.Done(gateway.DoneInfo{Err: err})
		return pr.noEndpoint("decode", err)
	}
	uncached := pd.uncachedTokens(&dd, pr.fallback)
	pd.counters.decided.Add(1)
	prefill := picker.Header{Name: pickerPrefillHeader} // removed unless split
	var pre gateway.Decision
	split := false
	if uncached < pd.minUncached {
		s.metrics.pdRequests.WithLabelValues(ms.name, "colocated").Inc()
	} else {
		pd.counters.split.Add(1)
		s.metrics.pdRequests.WithLabelValues(ms.name, "split").Inc()
		var perr error = errNoPrefillPool
		if pd.dis.Prefill != nil {
			pre, perr = pd.dis.Prefill.RouteAdapter(pr.key, pr.adapter(), pr.allow(true))
		}
		if perr != nil {
			// No healthy prefill replica (their ejection was logged):
			// decoded co-located, as the HTTP gateway falls back.
			s.pdCount(ms, pdPrefillUnavailable)
		} else {
			split = true
			ms.mm.replicaReqsC(s.metrics, ms.name, pre.Replica).Inc()
			prefill.Value = pd.hostPort[pre.Replica]
		}
	}
	t := pr.track(dd, ep, endpoint)
	if split {
		t.preD = pre
		t.pre = &t.preD
	}
	return picker.Pick{Endpoint: endpoint, Fallbacks: pr.fallbacksFor(fallbacks, endpoint),
		Headers: []picker.Header{prefill}, Tracker: t}, nil
}

// errNoPrefillPool: the model's prefill pool has no replicas.
var errNoPrefillPool = errors.New("the prefill pool has no replicas")

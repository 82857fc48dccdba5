package front

import (
	"fmt"
	"strconv"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
)

// Response headers both fronts add to report their decisions.
const (
	// HeaderReplica names the replica that served the request.
	HeaderReplica = "X-Exa-Replica"
	// HeaderDecision gives the routing decision's kind and prefix match,
	// e.g. "affinity; matched=12/14" (DescribeDecision).
	HeaderDecision = "X-Exa-Decision"
	// HeaderDisagg says what the P/D path did, then the decider's estimate
	// of the prompt tokens not cached on the decode replica: "split;
	// uncached=N", "colocated; uncached=N", or a fallback reason
	// (prefill_unavailable, prefill_failed, prefill_no_kv_params) in place
	// of split.
	HeaderDisagg = "X-Exa-Disagg"
	// HeaderPrefillReplica names the prefill replica of a split request
	// (in sidecar mode: the one named to the sidecar).
	HeaderPrefillReplica = "X-Exa-Prefill-Replica"
	// HeaderPrefillDecision gives the prefill replica's routing decision
	// as HeaderDecision gives the decode replica's: its kind and prefix
	// match, e.g. "affinity; matched=40/64; index=exact". On the exact
	// index the match is the blocks the prefill engine's own events say it
	// holds.
	HeaderPrefillDecision = "X-Exa-Prefill-Decision"
)

// DescribeDecision is HeaderDecision's value for decision d of a request
// of ms keyed with fallback (see Keyer.Key): its kind and prefix match
// ("affinity; matched=12/14"), then, for a model on the exact index,
// "; index=exact" (matched blocks of the engines' tokens, as the index
// predicts them) or "; index=exact; fallback=REASON" for a request keyed
// without tokens.
func DescribeDecision(ms *fleet.Model, fallback int, d *gateway.Decision) string {
	s := d.Kind.String() + "; matched=" + strconv.Itoa(d.Matched) + "/" + strconv.Itoa(d.Blocks)
	if ms.ExactBlockSize == 0 {
		return s
	}
	if fallback >= 0 {
		return s + "; index=exact; fallback=" + fleet.FallbackNames[fallback]
	}
	return s + "; index=exact"
}

// EndpointOf returns the engine a decision is to be sent to. A model's
// gateway is shared by every snapshot that keeps it, so the decision may
// name a replica that the request's own snapshot (ms) does not have, or
// that a reload moved to another address. The decision's Address is the
// engine's base URL as the gateway holds it now: it is looked up in the
// current snapshot (cur) first, then in the request's. nil means neither
// has it.
func EndpointOf(cur *fleet.State, ms *fleet.Model, d *gateway.Decision) *fleet.Endpoint {
	if ep := cur.Endpoints[d.Address]; ep != nil {
		return ep
	}
	if ep := ms.ByName[d.Replica]; ep != nil && ep.Base == d.Address {
		return ep
	}
	return nil
}

// PrefillTarget is the target a disaggregated model's prefill pool is
// asked for, from t, the decode pool's: both fronts ask the decode pool
// for the whole objective (a co-located request prefills there too) and
// the prefill pool for its TTFT only, as a prefill yields one token.
func PrefillTarget(t gateway.Target) gateway.Target {
	t.TPOT = 0
	return t
}

// DecidePD plans a request of a disaggregated model (gateway.PD.Route,
// the library's decision) and counts the plan; decode and prefill are the
// targets of the two pools.
func (m *Metrics) DecidePD(ms *fleet.Model, key gateway.Key, fallback int, decode, prefill gateway.Target) (gateway.PDDecision, error) {
	pd := ms.PD
	plan, err := pd.Plan.Route(key, pd.BlockTokens(fallback), decode, prefill)
	if err != nil {
		return plan, err
	}
	pd.Counters.Decided.Add(1)
	switch {
	case plan.Split:
		pd.Counters.Split.Add(1)
		m.PDRequests.WithLabelValues(ms.Name, "split").Inc()
		m.ReplicaRequests(ms, plan.Prefill.Replica).Inc()
	case plan.Reason == "cached":
		m.PDRequests.WithLabelValues(ms.Name, "colocated").Inc()
	default:
		// The plan wanted a split but found no prefill replica fit for
		// it: counted as a split that fell back, as before the plan.
		pd.Counters.Split.Add(1)
		m.PDRequests.WithLabelValues(ms.Name, "split").Inc()
		m.PDCount(ms, pdReasonOf(plan.Reason))
	}
	return plan, nil
}

// pdReasonOf maps a plan's reason for not splitting to its fallback.
func pdReasonOf(reason string) fleet.PDReason {
	if reason == "prefill_busy" {
		return fleet.PDPrefillBusy
	}
	return fleet.PDPrefillUnavailable
}

// PDCount counts a fallback of a disaggregated model.
func (m *Metrics) PDCount(ms *fleet.Model, r fleet.PDReason) {
	ms.PD.Counters.Fallbacks[r].Add(1)
	m.PDFallbacks.WithLabelValues(ms.Name, r.String()).Inc()
}

// AdmissionText describes the thresholds of a, for the message of a shed
// request.
func AdmissionText(a gateway.Admission) string {
	s := ""
	add := func(t string) {
		if s != "" {
			s += ", "
		}
		s += t
	}
	if a.QueueDepth > 0 {
		add(fmt.Sprintf("queue >= %d", a.QueueDepth))
	}
	if a.KVUtilization > 0 {
		add(fmt.Sprintf("KV cache >= %g", a.KVUtilization))
	}
	if a.Outstanding > 0 {
		add(fmt.Sprintf("outstanding >= %d", a.Outstanding))
	}
	if a.PendingPrefill > 0 {
		add(fmt.Sprintf("pending prefill >= %d blocks", a.PendingPrefill))
	}
	if a.Staleness > 0 {
		add(fmt.Sprintf("load older than %v", a.Staleness))
	}
	return s
}

// FillAdmission checks a's thresholds (none negative, KVUtilization in
// 0..1) and, when a load threshold is set and Staleness is 0, sets
// Staleness to three scrape intervals: load older than that counts as no
// room (unless every replica's is: admission then fails open). Its errors
// name the field and value.
func FillAdmission(a *gateway.Admission, scrapeInterval time.Duration) error {
	for _, f := range [...]struct {
		name string
		v    int64
	}{{"QueueDepth", int64(a.QueueDepth)}, {"Outstanding", int64(a.Outstanding)}, {"PendingPrefill", int64(a.PendingPrefill)}} {
		if f.v < 0 {
			return fmt.Errorf("%s %d is negative", "Admission."+f.name, f.v)
		}
	}
	switch {
	case a.Staleness < 0:
		return fmt.Errorf("Admission.Staleness %v is negative", a.Staleness)
	case !(a.KVUtilization >= 0 && a.KVUtilization <= 1):
		return fmt.Errorf("Admission.KVUtilization %v is outside 0..1", a.KVUtilization)
	case (a.QueueDepth > 0 || a.KVUtilization > 0 || a.Outstanding > 0) && a.Staleness == 0:
		a.Staleness = 3 * scrapeInterval
	}
	return nil
}

// ReleaseAtPrediction is both fronts' rule for a request whose first
// token they will not see (seen false: a non-streamed answer relayed
// whole): its replica's pending prefill is released when the library
// predicts the prefill over, d.PredictedTTFT after routing
// (gateway.Decision.FirstToken), by a timer started with afterFunc. The
// simulator calls it too, its event queue as afterFunc
// (sim.Config.PredictedRelease). It returns the timer's stop function,
// nil when seen or when d has no prediction. The timer holds its own copy
// of d, whose FirstToken does nothing once Done has been called.
func ReleaseAtPrediction(d gateway.Decision, seen bool, afterFunc func(time.Duration, func()) func() bool) (stop func() bool) {
	if seen || d.PredictedTTFT <= 0 {
		return nil
	}
	return afterFunc(d.PredictedTTFT, d.FirstToken)
}

package sim

import "fmt"

// Admission is a saturation rule for the gateway's own policies, the
// library's (gateway.Admission and Gateway.Saturated, after the Gateway
// API Inference Extension's saturation detector): a replica has room while
// its engine's queue is below QueueDepth, its KV cache below
// KVUtilization and its outstanding requests (Candidate.Outstanding: the
// larger of the gateway's in-flight count and the engine's waiting plus
// running) below Outstanding, each as the gateway last heard; a request
// arriving when no healthy replica has room is shed, as a front answers
// 429 with Retry-After, and counted in Result.Shed (and Dropped). Each
// threshold applies only when positive; the zero value sheds nothing.
//
// The simulated scrapes never fail, so the library's staleness rule (fail
// open when every replica's load is stale) never applies here. Shed
// requests are not retried. Peers run without it, as deployed: their own
// admission (GIE's flow control, Dynamo's busy thresholds) is not
// modelled.
type Admission struct {
	// QueueDepth is the waiting requests at which a replica has no room;
	// 0 does not check.
	QueueDepth int
	// KVUtilization is the KV-cache fill (0..1) at which a replica has no
	// room; 0 does not check.
	KVUtilization float64
	// Outstanding is the requests outstanding at which a replica has no
	// room; 0 does not check.
	Outstanding int
}

func (a Admission) enabled() bool {
	return a.QueueDepth > 0 || a.KVUtilization > 0 || a.Outstanding > 0
}

func (a Admission) validate() error {
	switch {
	case a.QueueDepth < 0:
		return fmt.Errorf("%w: Admission.QueueDepth %d is negative", ErrInvalidConfig, a.QueueDepth)
	case !(a.KVUtilization >= 0 && a.KVUtilization <= 1):
		return fmt.Errorf("%w: Admission.KVUtilization %v, want 0..1", ErrInvalidConfig, a.KVUtilization)
	case a.Outstanding < 0:
		return fmt.Errorf("%w: Admission.Outstanding %d is negative", ErrInvalidConfig, a.Outstanding)
	}
	return nil
}

// saturated reports whether gw sheds a request arriving now: some replica
// is healthy and none has room.
//
// Merge note: this is Gateway.Saturated(Target{}, gateway.Admission{...})
// of the library, restated over Gateway.Replicas because this branch
// predates it; once merged, call the library's.
func (e *engine) saturated(gw *router) bool {
	a := e.cfg.Admission
	eligible := 0
	for _, st := range gw.g.Replicas() {
		if !st.Healthy {
			continue
		}
		eligible++
		l := st.Load
		if (a.QueueDepth <= 0 || l.QueueDepth < a.QueueDepth) &&
			(a.KVUtilization <= 0 || l.KVUtilization < a.KVUtilization) &&
			(a.Outstanding <= 0 || max(st.InFlight, l.QueueDepth+l.Running) < a.Outstanding) {
			return false
		}
	}
	return eligible > 0
}

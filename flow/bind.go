package flow

import (
	"errors"

	"github.com/examlops/gateway"
)

// Bind is the rule by which a held request of gw within t is bound when
// its queue offers it (the room function Next is given; the bind a
// Controller is made with): the one the HTTP gateway and the picker use
// and the simulator calls. It may
// go when no eligible replica lacks room under a (gw.Saturated is false)
// and, unless admitOnly (a disaggregated model's request, whose plan is
// made after), the library routes it then (late binding): d, with routed
// true, whose Done the caller owes. No healthy replica within t means not
// yet (scale from zero), admitOnly or not; another routing error lets it
// go unrouted (routed false), for the caller to answer when it routes it
// again. It does not allocate.
func Bind(gw *gateway.Gateway, key gateway.Key, t gateway.Target, a gateway.Admission, admitOnly bool) (ok bool, d gateway.Decision, routed bool) {
	if gw.Saturated(t, a) {
		return false, d, false
	}
	if admitOnly {
		// No eligible replica (Saturated is then false): not yet, as for
		// a request routed here; its plan would fail at once.
		var one [1]string
		return len(gw.Spares(one[:0], 1, t)) > 0, d, false
	}
	d, err := gw.RouteWith(key, t)
	if errors.Is(err, gateway.ErrNoHealthyReplica) {
		return false, d, false
	}
	return true, d, err == nil
}

// BindPinned is Bind for a request pinned to one replica (t allows it
// alone; a Responses API request continuing the response that replica
// stored, which no other engine holds). It waits while that replica is
// eligible and has no room under a. When the replica is not eligible
// (unhealthy, outside the subset, no longer configured), it lets the
// request go unrouted at once (ok true, routed false): the caller routes
// it again, gets gateway.ErrNoHealthyReplica and answers 503, as it
// would without flow control. Holding it instead would keep a request
// whose replica may never return until its deadline. It does not
// allocate.
func BindPinned(gw *gateway.Gateway, key gateway.Key, t gateway.Target, a gateway.Admission) (ok bool, d gateway.Decision, routed bool) {
	if gw.Saturated(t, a) {
		return false, d, false
	}
	d, err := gw.RouteWith(key, t)
	return true, d, err == nil
}

// ValidUsageLimit reports whether c is a usage limit Limit applies: in
// (0, 1] (Options.UsageLimits; 1 is the limit of an unlisted priority).
// Every configuration of usage limits is checked by it.
func ValidUsageLimit(c float64) bool { return c > 0 && c <= 1 }

// Limit returns a with its thresholds scaled by a band's usage limit
// ceiling (Options.UsageLimits; GIE v1.5.0's UsageLimitPolicy gives each
// priority such a ceiling on the pool's saturation): QueueDepth,
// Outstanding and PendingPrefill become ⌊v·ceiling⌋ but at least 1 when
// set, KVUtilization v·ceiling. A replica with room under the result has
// room under a, so a band under a lower ceiling dispatches only while
// the replicas keep headroom for the bands above it. A ceiling of 1 or
// more, 0 or less, or NaN returns a unchanged. It does not allocate.
func Limit(a gateway.Admission, ceiling float64) gateway.Admission {
	if !(ceiling > 0 && ceiling < 1) {
		return a
	}
	scale := func(v int) int {
		if v <= 0 {
			return v
		}
		return max(1, int(float64(v)*ceiling))
	}
	a.QueueDepth = scale(a.QueueDepth)
	a.Outstanding = scale(a.Outstanding)
	a.PendingPrefill = scale(a.PendingPrefill)
	if a.KVUtilization > 0 {
		a.KVUtilization *= ceiling
	}
	return a
}

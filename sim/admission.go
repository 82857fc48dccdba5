package sim

import (
	"fmt"

	"github.com/examlops/gateway"
)

// Admission control in the simulator is the library's rule
// (gateway.Admission, Gateway.Saturated: after the Gateway API Inference
// Extension's saturation detector), applied to the gateway's own policies
// only: a request arriving when no healthy replica has room is shed, as a
// front answers 429 with Retry-After, and counted in Result.Shed (and
// Dropped). Shed requests are not retried. The simulated scrapes never
// fail, so the staleness rule never applies here. Peers run without it, as
// deployed: their own admission (GIE's flow control, Dynamo's busy
// thresholds) is not modelled.

// validAdmission checks Config.Admission.
func validAdmission(a gateway.Admission) error {
	switch {
	case a.QueueDepth < 0:
		return fmt.Errorf("%w: Admission.QueueDepth %d is negative", ErrInvalidConfig, a.QueueDepth)
	case !(a.KVUtilization >= 0 && a.KVUtilization <= 1):
		return fmt.Errorf("%w: Admission.KVUtilization %v, want 0..1", ErrInvalidConfig, a.KVUtilization)
	case a.Outstanding < 0:
		return fmt.Errorf("%w: Admission.Outstanding %d is negative", ErrInvalidConfig, a.Outstanding)
	case a.PendingPrefill < 0:
		return fmt.Errorf("%w: Admission.PendingPrefill %d is negative", ErrInvalidConfig, a.PendingPrefill)
	case a.Staleness < 0:
		return fmt.Errorf("%w: Admission.Staleness %v is negative", ErrInvalidConfig, a.Staleness)
	}
	return nil
}

// admits reports whether a sheds anything.
func admits(a gateway.Admission) bool {
	return a.QueueDepth > 0 || a.KVUtilization > 0 || a.Outstanding > 0 || a.PendingPrefill > 0
}

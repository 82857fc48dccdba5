package reference

import "time"

// Clocked is implemented by the policies that read the time of what they
// hear (a request's first token, its end), as LLMDPredicted times the
// latencies it learns from: the simulator gives them its simulated clock.
type Clocked interface {
	// SetClock sets the clock the policy reads; nil means time.Now.
	SetClock(now func() time.Time)
}

var _ Clocked = (*LLMDPredicted)(nil)

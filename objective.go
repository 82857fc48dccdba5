package gateway

import (
	"fmt"
	"time"
)

// A request's latency objective is llm-d's x-slo-ttft-ms and x-slo-tpot-ms,
// or its model's default: Target.TTFT and Target.TPOT, which the policy
// sees as Request.TTFT and Request.TPOT. CacheAware chooses the cheapest
// candidate predicted to meet the TTFT objective (Candidate.BlockTime
// times the prefill ahead of the request there; a candidate whose time per
// block is unknown is taken at the pool's mean, and with none known every
// candidate counts as meeting it). When the chosen replica is not
// predicted to meet the objective (its TTFT, or its TokenTime against the
// TPOT objective), the request goes there best effort and the decision's
// Fallback says FallbackSLO: a front configured to refuse such requests
// answers 429 (internal/front.Objectives.Refuse).

// objective is a request's latency objective; the zero value sets none.
type objective struct{ ttft, tpot time.Duration }

func (o objective) set() bool { return o.ttft > 0 || o.tpot > 0 }

func (o objective) validate() error {
	switch {
	case o.ttft < 0:
		return fmt.Errorf("%w: Target.TTFT %v is negative", ErrInvalid, o.ttft)
	case o.tpot < 0:
		return fmt.Errorf("%w: Target.TPOT %v is negative", ErrInvalid, o.tpot)
	}
	return nil
}

// meets reports whether c is predicted to meet o for a request of n
// blocks, c's unknown time per block taken as ref (nanoseconds, 0
// unknown). A prediction that cannot be made counts as met.
func (o *objective) meets(c *Candidate, n int, ref float64) bool {
	if o.tpot > 0 && c.TokenTime > o.tpot {
		return false
	}
	if o.ttft > 0 {
		a := float64(c.BlockTime)
		if a == 0 {
			a = ref
		}
		if a > 0 && a*float64(c.work(n)) > float64(o.ttft) {
			return false
		}
	}
	return true
}

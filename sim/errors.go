package sim

import "errors"

// Sentinel errors of package sim. Every error Run and the workloads return
// wraps one of these (errors.Is works) with context naming the field and
// value.
var (
	// ErrInvalidConfig reports a Config, Preset or workload setting out of
	// range.
	ErrInvalidConfig = errors.New("gateway: sim: invalid config")
	// ErrMalformedTrace reports a trace line that cannot be replayed; the
	// message names the line number.
	ErrMalformedTrace = errors.New("gateway: sim: malformed trace")
	// ErrStalled reports a run that stopped making progress: requests
	// left that no replica would ever run, a simulator bug (leaked engine
	// state), never a property of the workload. The message names the
	// policy, the replica and what is stuck (stall.go).
	ErrStalled = errors.New("gateway: sim: stalled")
)

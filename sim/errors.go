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
)

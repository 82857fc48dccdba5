package flow

import "time"

// Headers of GIE's flow control (v1.5.0, pkg/epp/metadata and
// requestcontrol): the fairness id, and the InferenceObjective whose
// priority the request takes.
const (
	HeaderFairnessID = "x-gateway-inference-fairness-id"
	HeaderObjective  = "x-gateway-inference-objective"
)

// Options configure a front's flow control (httpgw.Options.Flow,
// fleetpick.Options.Flow). The zero value is off: requests past capacity
// are shed, as without flow control.
type Options struct {
	// Enabled switches flow control on: every request of a model goes
	// through its queue, which holds it while no replica has room.
	Enabled bool
	// Queue configures each model's queue (bounds, TTL, fairness, order);
	// its zero value is this package's defaults.
	Queue Config
	// FairnessHeader names the header carrying the fairness id; "" means
	// HeaderFairnessID. A request without it is in the flow "".
	FairnessHeader string
	// Objectives maps an objective name (HeaderObjective's value) to its
	// priority. A request naming none, or one not listed, has priority 0.
	// Nil means none.
	Objectives map[string]int
	// Retry is how often held requests are tried again unkicked; 0 means
	// DefaultRetry.
	Retry time.Duration
	// UsageLimits maps a priority to its band's usage limit, in (0, 1]
	// (GIE's UsageLimitPolicy: a ceiling per priority): the band's
	// requests have room only under the admission thresholds scaled by it
	// (Limit), so that a lower band leaves headroom for a higher one. A
	// priority not listed has 1 (GIE's default). Nil means none.
	UsageLimits map[int]float64
}

package sim

import (
	"math"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/flow"
)

// A model of the flow controller of the Gateway API Inference Extension
// v1.5.0 (pkg/epp/flowcontrol), for Policy.GIEFlowControl, written from
// these files at tag v1.5.0:
//
//   - flowcontrol/controller/internal/processor.go: every request is
//     enqueued (ShardProcessor.enqueue: refused only past a capacity), then
//     one dispatchCycle runs, and another at every tick of a 1 ms ticker.
//     A cycle reads the pool's saturation once and walks the bands from
//     the highest priority: if saturation is at or over the band's usage
//     limit it stops (head-of-line blocking); otherwise the band's
//     fairness policy picks a flow, whose head is dispatched: one request
//     per cycle at most.
//   - framework/plugins/flowcontrol/usagelimits/usagelimitpolicy.go: the
//     default static-usage-limit-policy gives every band the limit 1.0.
//   - framework/plugins/flowcontrol/saturationdetector/utilization
//     (detector.go, config.go), the default detector (config/loader/
//     defaults.go): the pool's saturation is the mean over its endpoints
//     of max(waiting queue / 5, KV utilisation / 0.8) from the last
//     scrape (an endpoint whose metrics are older than 200 ms counts 1:
//     with Config.RefreshInterval above 200 ms, every endpoint's are
//     from 200 ms after a scrape to the next, and the controller holds
//     everything then). It is the mean: one idle replica
//     beside saturated ones does not open the gate, unlike
//     gateway.Admission, where one replica with room does.
//   - flowcontrol/registry/config.go: fairness global-strict-fairness-policy
//     (fairness/besthead.go: the flow whose head comes first by the
//     ordering policy), ordering fcfs-ordering-policy (ordering/fcfs.go:
//     by enqueue time), band capacity 1 GB (defaultPriorityBandMaxBytes).
//     Its comment names a default of 5,000 requests per band, but no code
//     applies one: the request count is not bounded, nor is the total.
//   - flowcontrol/controller/config.go and controller.go: DefaultRequestTTL
//     is 0, so a request without a deadline of its own waits until it is
//     dispatched (or its client goes away, which the simulation does not
//     model).
//
// The endpoint is then picked by the scheduler at dispatch (late binding):
// the policy's own Pick, with Arrive told at dispatch. Fairness id and
// priority come from the request's Tenant and Priority, as from GIE's
// x-gateway-inference-fairness-id header and InferenceObjective. The
// controller's queue is a flow.Queue configured as GIE's: global strict,
// FCFS, 1 GB per band, no request bound, no displacement, no deadline.

// GIE v1.5.0's defaults, as above.
const (
	gieQueueDepth   = 5
	gieKVThreshold  = 0.8
	gieBandMaxBytes = 1_000_000_000
	gieTick         = time.Millisecond
	gieStaleness    = 200 * time.Millisecond // DefaultMetricsStalenessThreshold
)

// gieQueueConfig is GIE's registry defaults in a flow.Config.
func gieQueueConfig() flow.Config {
	return flow.Config{
		Total:    flow.Limits{MaxBytes: math.MaxInt64, MaxRequests: math.MaxInt},
		Band:     flow.Limits{MaxBytes: gieBandMaxBytes, MaxRequests: math.MaxInt},
		Fairness: flow.GlobalStrict,
		Order:    flow.FCFS,
		MaxFlows: math.MaxInt,
	}
}

// heldBase is the unsalted key kept for a held request (nil for the base
// model), as arrive passes it.
func (s *seq) heldBase() gateway.Key {
	if s.target.Adapter == "" {
		return nil
	}
	return s.base
}

// gieSaturation is the utilization detector's saturation of the pool
// from the loads just scraped.
func (e *engine) gieSaturation() float64 {
	sum := 0.0
	for _, r := range e.reps {
		q := float64(r.waiting.len()) / gieQueueDepth
		kv := min(1, float64(r.cache.used())/float64(e.cap)) / gieKVThreshold
		sum += max(q, kv)
	}
	return sum / float64(len(e.reps))
}

// gieCycle is one dispatchCycle of router gi's controller: at most one
// request, the global strict pick of the highest band, if the pool is
// below saturation.
func (e *engine) gieCycle(gi int) {
	if !e.gieOpen() {
		return
	}
	s, ok := e.gws[gi].fq.Next(func(*seq) bool { return true })
	if !ok {
		return
	}
	e.queued--
	e.dispatch(s, s.heldBase())
}

// gieOpen reports whether a dispatch cycle can dispatch: requests held,
// and the pool below saturation as of the last scrape, unless that scrape
// is older than GIE's staleness threshold, when every endpoint counts 1.
func (e *engine) gieOpen() bool {
	return e.queued > 0 && e.gieSat < 1 && e.now-e.scraped <= int64(gieStaleness)
}

// gieTick schedules the next tick of the dispatch ticker while it can
// dispatch (gieOpen); the saturation changes only at a scrape, which
// calls it again.
func (e *engine) gieTick() {
	if e.gieTicking || !e.gieOpen() {
		return
	}
	e.gieTicking = true
	e.push(e.now+int64(gieTick), event{rep: evGIETick})
}

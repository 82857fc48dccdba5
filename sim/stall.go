package sim

import "fmt"

// A run that can no longer make progress ends with ErrStalled instead of
// ticking load refreshes or steps forever (a leaked pin, reservation,
// adapter slot or in-flight count, or a request that never finishes,
// would otherwise hang it). The checks read the simulated state alone,
// never a wall clock, and hold on every correct run:
//
//  1. A replica stalls when plan leaves it with requests waiting and no
//     step in progress. Only its step's end or a request dispatched to it
//     plans it again, and with nothing running a correct engine admits
//     the first waiting request: running requests hold every pinned and
//     reserved block and every adapter slot, so none is held; the budget
//     and the running bound have room (MaxBatchTokens > MaxRunning >= 1,
//     MaxLoras >= 1); and a request that could not fit an empty cache
//     failed at its arrival. An idle replica with no request waiting, or
//     a request waiting behind running ones (for blocks or an adapter
//     slot), is not stalled.
//  2. The run stalls when two load refreshes in a row find requests in
//     flight or held, no replica with a step in progress, no release
//     timer (front.ReleaseAtPrediction), no held request's expiry and no
//     tick of GIE's dispatch ticker ahead, and no request answered
//     (completed, shed, failed or expired) between them. A request in
//     flight is on a replica, waiting or running, so by rule 1 some
//     replica would be stepping; and a front holding requests dispatches
//     at the refresh (flow control) or at its ticker's next tick (GIE)
//     once the idle replicas' loads are scraped: with refreshes a
//     millisecond apart, the tick a refresh schedules comes at the same
//     instant as the next refresh, and after it. Flow control holding a
//     request until its TTL has an expiry ahead, and an idle cluster has
//     nothing in flight.
//  3. A replica stalls when it has run more steps than the tokens
//     admitted to it, prompts and answers: every step computes a chunk of
//     at least one prompt token, or one answer token of every decoding
//     request, so a correct engine never does, and one that steps on
//     without end on a request that never finishes gets there.

// Each rule keeps the first stall found in e.stall; run returns it before
// its next event.

// stallReplica applies rule 1 to replica ri, at the end of plan.
func (e *engine) stallReplica(ri int) {
	r := e.reps[ri]
	if r.busy || r.waiting.len() == 0 || e.stall != nil {
		return
	}
	c := r.cache
	h := r.waiting.front()
	need := len(h.key) + h.private // less its blocks cached and pinned already
	for _, s := range h.slots[:c.match(h.key, h.slots)] {
		if c.ref[s] > 0 {
			need--
		}
	}
	e.stall = fmt.Errorf("%w: policy %q, replica %s at t=%.6fs: %d waiting, %d running, %d of %d blocks pinned and %d reserved, %d of %d adapter slots held; the first waiting request needs %d blocks, %d are free",
		ErrStalled, e.res.Policy, r.name, float64(e.now)/1e9, r.waiting.len(), r.running(), c.pinned, c.cap, c.reserved,
		r.lora.active, e.lora.max, need, c.cap-c.pinned-c.reserved)
}

// stallSteps reports rule 3 for replica ri, at the end of a step.
func (e *engine) stallSteps(ri int) {
	r := e.reps[ri]
	if e.stall == nil {
		e.stall = fmt.Errorf("%w: policy %q, replica %s at t=%.6fs: %d steps for %d tokens admitted, %d waiting, %d prefilling, %d decoding",
			ErrStalled, e.res.Policy, r.name, float64(e.now)/1e9, r.step, r.work, r.waiting.len(), len(r.prefill), len(r.decode))
	}
}

// stallRun applies rule 2 at a load refresh, after the front's dispatch.
func (e *engine) stallRun() {
	if e.inflight == 0 && e.queued == 0 || len(e.releases) > 0 || e.expAt != 0 || e.gieTicking {
		e.quiet = 0
		return
	}
	waiting := 0
	for _, r := range e.reps {
		if r.busy {
			e.quiet = 0
			return
		}
		waiting += r.waiting.len()
	}
	answered := int64(e.res.Completed+e.res.Dropped+e.res.Failed+e.res.Expired) + 1 // 0: the last refresh was not quiet
	if e.quiet != answered || e.stall != nil {
		e.quiet = answered
		return
	}
	e.stall = fmt.Errorf("%w: policy %q at t=%.6fs: %d requests in flight (%d waiting on the replicas, none running), %d held, no replica stepping, and none answered since the last load refresh",
		ErrStalled, e.res.Policy, float64(e.now)/1e9, e.inflight, waiting, e.queued)
}

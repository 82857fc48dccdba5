package gateway

import (
	"math"
	"time"
)

// Admission is a saturation rule, after the Gateway API Inference
// Extension's saturation detector as GIE v1.2.0 has it
// (pkg/epp/saturationdetector/saturationdetector.go, IsSaturated; v1.5.0
// replaced it by a pool-wide utilization, the mean over the pool of
// max(waiting/5, KV/0.8), which the simulator's gie_flow peer models): a
// replica has room when its signals are fresh, its queue is
// below QueueDepth, its KV cache below KVUtilization, its outstanding
// requests below Outstanding and its pending prefill below PendingPrefill;
// a request is shed only when no eligible
// replica has room. Each threshold applies only when set; the zero value
// never sheds.
//
// It fails open: a replica whose load is older than Staleness has no room,
// but when every eligible replica's load is that old (the scrapes are
// failing, not the engines) nothing is shed, and the health checks decide.
// A front answers a shed request with 429 (or 503) and Retry-After.
type Admission struct {
	// QueueDepth: a replica whose engine reports this many waiting
	// requests or more has no room. GIE's threshold counts the other way
	// (room while waiting ≤ QueueDepthThreshold): its default of 5 is a
	// QueueDepth of 6 here. 0: not checked.
	QueueDepth int
	// KVUtilization: a replica whose KV cache is this full (0..1) or more
	// has no room (GIE: room while KV ≤ its threshold, default 0.8; only
	// a cache exactly at it differs). 0: not checked.
	KVUtilization float64
	// Outstanding: a replica with this many requests outstanding or more
	// (Candidate.Outstanding) has no room. 0: not checked.
	Outstanding int
	// PendingPrefill: a replica with this many blocks of prefill pending
	// or more (Candidate.PendingPrefill: uncached blocks this gateway
	// routed there whose first token it has not yet seen) has no room. It
	// counts work rather than requests: a request whose prompt is cached
	// adds a block or two, one whose prompt is not adds all of them, so a
	// cold cache (a new replica, a new system prompt) fills a replica
	// after a few requests and a warm one after many, and what a request
	// routed there waits before its own prefill stays bounded. Not in
	// GIE's rule. 0: not checked.
	PendingPrefill int
	// Staleness: load older than this (by the gateway's clock) leaves a
	// replica without room; a replica never reported counts as fresh
	// until its first report. GIE's default is 200ms. 0: not checked.
	Staleness time.Duration
}

// Negative thresholds are read as 0 (not checked); a KVUtilization above 1
// never binds. The fronts' configuration validates the values it accepts.

// enabled reports whether a checks anything.
func (a *Admission) enabled() bool {
	return a.QueueDepth > 0 || a.KVUtilization > 0 || a.Outstanding > 0 || a.PendingPrefill > 0
}

// room reports whether replica rs has room under a.
func (a *Admission) room(rs *replicaState) bool {
	return (a.QueueDepth <= 0 || int(rs.queue.Load()) < a.QueueDepth) &&
		(a.KVUtilization <= 0 || math.Float64frombits(rs.kv.Load()) < a.KVUtilization) &&
		(a.Outstanding <= 0 || rs.outstanding() < a.Outstanding) &&
		(a.PendingPrefill <= 0 || rs.pending.Load() < int64(a.PendingPrefill))
}

// Saturated reports whether a request within t should be shed under a:
// some replica is eligible (healthy and within t) and none has room. With
// no eligible replica it reports false (routing then fails with
// ErrNoHealthyReplica, which the front reports as such). It takes no lock
// and does not allocate; t.Allow is called once per replica.
func (g *Gateway) Saturated(t Target, a Admission) bool {
	if !a.enabled() {
		return false
	}
	var now int64
	if a.Staleness > 0 {
		now = g.clock().UnixNano()
	}
	eligible, stale := 0, 0
	for _, rs := range g.snap.Load().list {
		if !t.eligible(rs) {
			continue
		}
		eligible++
		if a.Staleness > 0 {
			if at := rs.loadAt.Load(); at != 0 && now-at > int64(a.Staleness) {
				stale++
				continue
			}
		}
		if a.room(rs) {
			return false
		}
	}
	return eligible > 0 && stale < eligible
}

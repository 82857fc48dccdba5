package gateway

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Decision is the outcome of Gateway.Route.
type Decision struct {
	// Replica is the chosen replica's name; Address its address, if any.
	Replica, Address string
	// Kind says how it was chosen: affinity, load_aware or round_robin.
	Kind Kind
	// Hit is true when the chosen replica held the whole prefix.
	Hit bool
	// Matched is how many leading blocks of the key the chosen replica
	// held, of Blocks in all.
	Matched, Blocks int
	// Fallback says why the decision fell back, if it did.
	Fallback Fallback
	// PredictedTTFT and PredictedTPOT are the time to first token and per
	// output token predicted at the chosen replica from its learned speed
	// (Candidate.BlockTime times the prefill ahead of it there, and
	// Candidate.TokenTime); 0 while unknown. A
	// front that will not see the first token (a client that does not
	// stream, through a data plane that tells the front only of the
	// answer's end) calls FirstToken this long after routing, so that the
	// replica's pending prefill is released when it is predicted over
	// rather than at the answer's end.
	PredictedTTFT, PredictedTPOT time.Duration

	rs      *replicaState
	t       *ticket
	gen     uint64
	adapter string   // counted against rs until Done
	handed  bool     // prefill runs elsewhere: nothing pending here (handOff)
	obs     Observer // the policy, if it observes its decisions
	id      uint64   // the request's id for obs
}

// DoneInfo reports how a routed request ended.
type DoneInfo struct {
	// Latency is the request's latency as the caller measures it (time to
	// first token or end to end, the same measure as the SLO). Zero means
	// no sample.
	Latency time.Duration
	// Err is the request's error, if it failed. Failed requests feed no
	// latency sample.
	Err error
	// TTFT is the time from routing to the first token, as the caller
	// saw it; 0 when it did not (a client that does not stream). Elapsed
	// is the time from routing to the end of the answer, 0 if unknown;
	// OutputTokens the tokens the answer held (its usage), 0 if unknown.
	// Together they teach the gateway the replica's speed (speed.go) and
	// count the request against its objective (Target.TTFT, TPOT) in
	// Stats. Zero values teach nothing.
	TTFT, Elapsed time.Duration
	OutputTokens  int
}

// ticket tracks one decision's reports, so that FirstToken and Done each
// take effect once however often they are called. Its state packs a
// generation (upper bits) and two flags; tickets are pooled, and a stale
// Decision whose generation has passed changes nothing.
type ticket struct {
	state atomic.Uint64
	// Set by RouteWith before the Decision is returned, read by Done:
	// the request's prefill work in blocks (Candidate.work; -1 for a
	// request without a prompt, which teaches no speed; 0 for one whose
	// prefill ran on another replica, handOff), the
	// requests outstanding at the replica with it (speedload.go) and its
	// objective. handedWork is the work handOff took out (colocate puts
	// it back).
	work, load int
	handedWork int
	obj        objective
	stats      *counters
	// ttl is the latency TTL, when the gateway has an SLO: a smoothed
	// latency whose last sample is older restarts from Done's sample.
	ttl time.Duration
}

const (
	flagFirst = 1
	// flagBusy: FirstToken is telling the Observer; Done waits for it, so
	// that the Observer hears of the first token before the end.
	flagBusy = 2
)

var tickets = sync.Pool{New: func() any { return new(ticket) }}

func newTicket() (*ticket, uint64) {
	t := tickets.Get().(*ticket)
	return t, t.state.Load() >> 2
}

// FirstToken reports that the request's first token has arrived: its
// prefill is over, so the replica's pending prefill shrinks. Optional;
// Done does it if FirstToken was not called. Safe to call more than once.
// A front that cannot see the first token may call it PredictedTTFT
// after routing: it teaches the gateway nothing (the speeds are learned
// from DoneInfo), it only releases the pending prefill.
func (d Decision) FirstToken() {
	if d.t == nil {
		return
	}
	for {
		s := d.t.state.Load()
		if s>>2 != d.gen || s&3 != 0 {
			return
		}
		next := s | flagFirst
		if d.obs != nil {
			next |= flagBusy
		}
		if d.t.state.CompareAndSwap(s, next) {
			d.release()
			if d.obs != nil {
				d.obs.FirstToken(d.id)
				d.t.state.And(^uint64(flagBusy))
			}
			return
		}
	}
}

// Done reports that the request has finished, freeing its load on the
// replica and feeding its latency into the replica's smoothed latency.
// Only the first call has an effect.
func (d Decision) Done(info DoneInfo) {
	if d.t == nil {
		return
	}
	for {
		s := d.t.state.Load()
		if s>>2 != d.gen {
			return
		}
		if s&flagBusy != 0 { // FirstToken is telling the Observer (which must not block)
			runtime.Gosched()
			continue
		}
		if d.t.state.CompareAndSwap(s, (d.gen+1)<<2) {
			if s&flagFirst == 0 {
				d.release()
			}
			addClamped(&d.rs.inflight, -1)
			if d.adapter != "" {
				d.rs.lora.done(d.adapter)
			}
			if info.Err == nil && info.Latency > 0 {
				d.rs.observeLatency(info.Latency, d.rs.clock(), d.t.ttl)
			}
			if d.t.work >= 0 { // -1: a request without a prompt (Target.NoPrompt); 0: its prefill ran elsewhere (handOff)
				d.rs.learn(d.t.work, d.t.load, &info)
			}
			if d.t.obj.set() {
				d.t.stats.attain(&d.t.obj, &info)
			}
			tickets.Put(d.t)
			if d.obs != nil {
				d.obs.Done(d.id, info)
			}
			return
		}
	}
}

// release takes d's uncached blocks out of its replica's pending prefill,
// unless handOff already did.
func (d *Decision) release() {
	if !d.handed {
		addClamped(&d.rs.pending, -int64(d.Blocks-d.Matched))
	}
}

// handOff records that d's prefill runs on another replica, as for the
// decode side of a split request (PD.Route): its uncached blocks leave
// the replica's pending prefill at once rather than at its first token,
// and its Done teaches the replica's speed nothing of prefill (that first
// token follows a KV cache handed over, not prefill work here). Called
// before d is returned, so no report can race it.
func (d *Decision) handOff() {
	d.release()
	d.handed = true
	d.t.handedWork, d.t.work = d.t.work, 0
}

// colocate undoes handOff, for a split request decoded co-located after
// all (PDDecision.Colocate): its uncached blocks are pending on the
// replica again, until its first token, and its Done teaches the
// replica's prefill. It does nothing once d was reported on, or when d
// was not handed off.
func (d *Decision) colocate() {
	if !d.handed || d.t == nil || d.t.state.Load() != d.gen<<2 {
		return
	}
	d.handed = false
	d.t.work = d.t.handedWork
	d.rs.pending.Add(int64(d.Blocks - d.Matched))
}

// Kind is the kind of a routing decision. The zero value is
// KindRoundRobin.
type Kind int

// The kinds of decision. RoundRobin's decisions are round_robin and
// LoadAware's load_aware; any other policy's are affinity when the chosen
// replica holds the longest prefix any candidate holds, and load_aware
// when it holds less (FallbackLoadGuard) or no candidate holds any
// (FallbackNoMatch).
const (
	// KindRoundRobin: chosen by rotation.
	KindRoundRobin Kind = iota
	// KindAffinity: chosen holding the longest cached prefix.
	KindAffinity
	// KindLoadAware: chosen for its load.
	KindLoadAware
	numKinds
)

var kindNames = [...]string{"round_robin", "affinity", "load_aware"}

// String returns round_robin, affinity or load_aware.
func (k Kind) String() string {
	if k >= 0 && k < numKinds {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Fallback is a set of reasons a decision fell back from its first
// preference. The zero value means no fallback.
type Fallback uint8

// The fallback reasons.
const (
	// FallbackNoMatch: no eligible replica holds any of the prefix, so
	// the request went by load.
	FallbackNoMatch Fallback = 1 << iota
	// FallbackLoadGuard: a replica holds more of the prefix, but load made
	// another replica the better choice: its queue outweighed the prefill
	// the prefix saves, or the prefix is hot and being replicated to a less
	// loaded replica (CacheAware).
	FallbackLoadGuard
	// FallbackSLO: every healthy replica breaches the latency SLO, so the
	// gateway routed within the healthy set rather than to nothing; or
	// no candidate was predicted to meet the request's own objective
	// (Target.TTFT, Target.TPOT), so it went best effort.
	FallbackSLO
)

// String lists the reasons, comma-separated: no_match, load_guard, slo;
// none for the zero value.
func (f Fallback) String() string {
	if f == 0 {
		return "none"
	}
	s := ""
	for i, n := range [...]string{"no_match", "load_guard", "slo"} {
		if f&(1<<i) != 0 {
			if s != "" {
				s += ","
			}
			s += n
		}
	}
	return s
}

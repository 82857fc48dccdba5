package gateway

import "time"

// Policy chooses a replica for a request among eligible candidates. It is
// the strategy behind a Gateway; the package provides RoundRobin,
// CacheAware and LoadAware, and other packages may implement their own.
//
// Pick returns the index in cands of the chosen candidate. It is called
// with only eligible candidates (healthy, allowed, and within the latency
// SLO unless none is), never with an empty slice, and in a fixed order (the
// order replicas were added). Pick must not block, must not modify req or
// cands nor keep them after it returns, and must be safe for concurrent
// use. An index outside cands fails the Route call with an error wrapping
// ErrInvalid. Pick runs under its gateway's lock: it must not call that
// Gateway's methods (Replicas, Stats, Route...), which would wait for it.
//
// The gateway labels each decision itself (Decision.Kind and Fallback),
// from the chosen candidate's Matched against Request.MaxMatched.
type Policy interface {
	Pick(req *Request, cands []Candidate) int
}

// Observer is an optional interface of a Policy that keeps state of its
// own per request, as the routers it may reproduce do (SGLang's counts of
// requests per worker, Dynamo's active sequences): the Gateway tells it
// that the request its last Pick placed was routed, then of the request's
// first token and of its end, as gRPC's balancer hears of a pick's end
// through its Done. A request's calls come in that order, each at most
// once (FirstToken may be skipped; Done comes even for a request that
// fails). Routed is called under the gateway's routing lock right after
// the Pick that placed the request; FirstToken and Done from whichever
// goroutine reports them to the Decision, so they must be safe for
// concurrent use and must not block.
type Observer interface {
	// Routed reports that the request the last Pick placed went to
	// replica; id names it in the calls that follow, unique among the
	// gateway's requests.
	Routed(id uint64, replica string)
	// FirstToken reports that request id's first token arrived
	// (Decision.FirstToken).
	FirstToken(id uint64)
	// Done reports that request id ended (Decision.Done).
	Done(id uint64, info DoneInfo)
}

// Request is what a Policy knows of the request being routed.
type Request struct {
	// Key is the request's prefix; never empty.
	Key Key
	// MaxMatched is the longest Candidate.Matched among the candidates.
	MaxMatched int
	// Demand is the share, 0..1, of recent requests whose longest prefix
	// held by a candidate was the same as this request's, Key[:MaxMatched]:
	// how hot that prefix is (see demand.go). 0 when MaxMatched is 0.
	Demand float64
	// Adapter is the LoRA adapter the request targets (Target.Adapter); ""
	// is the base model.
	Adapter string
	// Tie is a value that changes from one Route to the next, for the
	// policy to break exact ties with (CacheAware hashes it), so that
	// equal candidates are chosen without regard to their order. The
	// Gateway sets it to the number of requests it routed before this
	// one: deterministic for a given sequence of calls.
	Tie uint64
	// TTFT and TPOT are the request's latency objective (Target.TTFT and
	// Target.TPOT, see objective.go): the time to first token and per
	// output token it asks for; 0 sets none.
	TTFT, TPOT time.Duration

	// exact says the gateway's index is exact (indexExact): what it says a
	// replica holds, the replica's engine reported, so CacheAware does not
	// price a replica never sent work as holding a shared prefix.
	exact bool
	// sum, when its ok is set, summarises the candidates as CacheAware's
	// first pass over them would: the gateway takes it while refreshing
	// them, in the usual case, sparing Pick a pass. Only when its policy
	// is a *CacheAware, which sees the candidates as refreshed (a policy
	// wrapping one may change them first).
	sum candSum
	// ref is the mean of the pool's known times per block in
	// nanoseconds (speed.go), 0 if none is known, set by the gateway;
	// CacheAware takes the candidates' own when the gateway did not sum
	// them (sum.ok false).
	ref float64
	// growths is the gateway's sum of its replicas' load growths
	// (speedload.go), from which CacheAware takes its placement horizon
	// (horizonFor) where speed classes price it; 0, no growth known, is
	// speedHorizon.
	growths uint64
}

// candSum summarises a request's candidates for CacheAware.
type candSum struct {
	ok bool
	// total and pending sum InFlight and PendingPrefill+Load.PeerPrefill,
	// outstanding and least sum and take the least of Outstanding(),
	// holders counts those whose Matched is the longest, and common is the
	// least Matched of those with AssignedPrefill > 0 (MaxInt if none).
	total, pending, outstanding, least, holders, common int
}

// add counts candidate c into s, whose holders are of maxMatched, the
// longest Matched among the candidates.
func (s *candSum) add(c *Candidate, maxMatched int) {
	if c.AssignedPrefill > 0 {
		s.common = min(s.common, c.Matched)
	}
	s.total += c.InFlight
	s.pending += c.PendingPrefill + c.Load.PeerPrefill
	o := c.Outstanding()
	s.outstanding += o
	s.least = min(s.least, o)
	if c.Matched == maxMatched {
		s.holders++
	}
}

// Candidate is one eligible replica as a Policy sees it.
type Candidate struct {
	// Name is the replica's name.
	Name string
	// Matched is how many leading blocks of the request's Key the
	// replica holds, according to the gateway's index.
	Matched int
	// Load is the replica's last reported load; Load.Latency is smoothed.
	Load Load
	// InFlight counts requests this gateway routed here that are not done.
	InFlight int
	// PendingPrefill counts uncached blocks routed here whose first token
	// has not been reported: prefill work queued or running.
	PendingPrefill int
	// AssignedPrefill counts the uncached blocks routed here since the
	// replica was added: the prefill work this gateway has sent it.
	AssignedPrefill int
	// CacheBlocks is the replica's prefix-cache capacity in blocks.
	CacheBlocks int
	// LastPicked orders the candidates by when this gateway last routed
	// to them: the gateway's count of routed requests at that time, 0 if
	// never. The least recently chosen has the smallest.
	LastPicked uint64
	// LoRA is the replica's state for the request's adapter (see
	// lora.go); the zero value for a request of the base model.
	LoRA LoRAState
	// BlockTime is the replica's learned time per block of prefill work
	// ahead of a first token there, queued prefill included (speed.go);
	// TokenTime its learned time per output token (TPOT). 0 while
	// unknown: until the gateway has heard how a few requests routed
	// there went (DoneInfo's TTFT, Elapsed and OutputTokens).
	BlockTime, TokenTime time.Duration
}

// Outstanding is the replica's best-known count of unfinished requests:
// the larger of the gateway's own in-flight count (fresh, but blind to
// other gateways' traffic) and the engine's waiting plus running count
// (complete, but as old as the last scrape).
//
// It is the one definition of outstanding requests: the admission rule
// (Saturated) and the spares (Spares) count a replica's through it too.
func (c *Candidate) Outstanding() int {
	return max(c.InFlight, c.Load.QueueDepth+c.Load.Running)
}

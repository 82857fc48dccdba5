package gateway

import (
	"fmt"
	"math"

	"github.com/examlops/gateway/internal/hashtab"
)

// CacheAware routes a request where its first token will come soonest
// without starving the requests behind it: usually the replica already
// holding the longest prefix of it (affinity), otherwise a lightly
// loaded one.
//
// Each candidate costs, in blocks of prefill work,
//
//	PendingPrefill + (1+λ)·(len(Key) − Matched) + DecodeWeight·excess(Outstanding)
//
// (plus, when every engine has requests waiting, the waiting term below)
// and the cheapest wins:
//
//   - PendingPrefill is the prefill already queued or running there (this
//     gateway's own, plus Load.PeerPrefill: what other gateways report
//     they queued there), and len(Key) − Matched the part of this prompt
//     it would compute: together, this request's own wait. A cached
//     prefix is worth exactly the prefill it saves, so a hot replica with
//     a deep queue loses to an idle one once its queue outweighs the
//     saving.
//   - λ charges the uncached blocks a second time for the wait they impose
//     on requests queued behind them: λ = Externality + (mean
//     PendingPrefill, peers' included)/len(Key), so the busier the
//     cluster, the more a cache hit is worth: under overload, recomputing
//     a prefix elsewhere costs throughput that every later request pays
//     for.
//   - DecodeWeight·excess(Outstanding) guards against a replica whose
//     batch (requests decoding there, and any queued there by others) has
//     grown beyond the rest: excess is how far its Outstanding count
//     exceeds the smallest among the candidates by more than √m, m their
//     mean (the random spread of such counts), and 0 otherwise. A decoding
//     request slows each step of a new prefill by far less than a block
//     of prefill, so counts within that spread, which say little about a
//     first token, do not steer requests: reacting to them sends
//     consecutive requests to the replica that happens to have finished
//     a few, queuing their prefills behind one another (with one shared
//     system prompt at 200 requests/s on 8 replicas, the old term,
//     DecodeWeight·Outstanding, made mean TTFT 8% worse than
//     round-robin's).
//
// This is the load guard: on traffic whose requests share only a system
// prompt, every replica holds that prompt, the prefix terms are equal, and
// the choice is made by load alone, so it does not collapse onto one
// replica.
//
// At a holder of the request's longest prefix, when some candidate is
// priced as lacking that prefix and the pool has no speed classes (see
// below), the guard is priced in time once the holder's times per block
// and per output token are known: each request beyond the spread costs
// its share of a step, TokenTime/(Outstanding·BlockTime) blocks (at most
// DecodeWeight), for the first timedExcess (8) of them, and DecodeWeight
// each beyond. There the guard weighs decode counts against
// recomputing the prefix elsewhere, and a decoding request lengthens the
// step or two that compute the rest of a hit by about 0.15 ms
// (shared-prefix on 8b-h100), against 4.2 ms for a block of prefill: in
// blocks, the guard sent shared-prefix requests away from the replica
// holding their group's prompt to recompute it (mean TTFT 20.4 against
// 20.1 ms, docs/results.md). Where every candidate holds the prefix, or
// is priced as holding it (a replicated prefix, replicas never sent
// work: below), the choice is by load, and the guard stays in blocks, as
// the load guard above (in time there, an 8,192-token system prompt's
// p99 rose from 41 to 60 ms on 8 replicas); and between speed classes,
// where it keeps the fast replicas from taking every hot prefix. A
// holder far beyond the rest is a queue the guard must still see: with
// every request beyond the spread priced in time, holders filled past a
// flow-control front's room rule, and at 2× capacity on 16 × 8b-h100 the
// interactive class within its 1 s objective fell from 100% to 95.2%
// over 120 s (docs/flow-control.md); with the first 8 in time it is
// 99.98%, and shared-prefix keeps its 20.1 ms.
//
// When every candidate's engine has requests waiting (Load.QueueDepth at
// least 1: saturated, no replica can start the request at once), each
// uncached block also costs WaitingWeight (1) per request waiting at the
// candidate: WaitingWeight·(len(Key) − Matched)·QueueDepth. A block of
// prefill delays every request that queues behind it there, and by
// Little's law about as many arrive during a wait as are waiting. λ
// prices that wait alike everywhere; this term prices it per replica, so
// a long prompt goes where few requests wait and a short one where the
// least work waits: a replica taking long prompts carries few requests,
// and the many short ones queue behind less work (size-interval
// assignment, the placement that lowers the mean wait of FIFO queues when
// sizes vary widely). On the Mooncake trace at twice its speed on 4
// replicas (2.5× over capacity) it lowered mean TTFT from 99.7 s to
// 66.0 s (67.8 s since the decode guard's pricing in time above; p99
// 274 → 433 s: the long prompts wait longer); below saturation nothing
// changes (docs/results.md, Issue 27). Saturation is
// judged over every candidate, as λ and the spread are, including those
// LoadFactor or a TTFT objective then leave out; one reporting no load
// (QueueDepth 0, as before its first report) turns the term off.
//
// The cost is myopic, though: a replica lacking a long hot prefix is
// charged its whole prefill by every request, never amortised over the
// requests that would hit there afterwards, so the prefix would stay on the
// replicas that got it first. Hence replication: when the longest held
// prefix is held by fewer candidates than Request.Demand (its share of
// recent traffic) times the number of candidates, the candidates lacking
// it are priced as if they held it, so the least loaded replica warms up:
// ties go to fewer requests outstanding, then to holders (Preble's
// observation: a prefix shared by a fraction f of the traffic wants about
// f of the replicas).
//
// The cost is also blind to the cache a request fills: its uncached
// blocks evict others' prefixes where the cache is full, and nothing where
// it has room. So each uncached block beyond a replica's free space
// (CacheBlocks − AssignedPrefill, the prefill sent there so far being what
// it has cached) costs freeCacheCredit (0.5) more: a replica with room
// wins over a full one holding a block or two more of the prompt. With 32
// replicas and every request of the Mooncake trace behind one shared
// block, 16 replicas were left without a request, and token hit fell to
// 78% of the pooled bound (docs/results.md).
//
// A replica the gateway has never sent work (AssignedPrefill 0) matches
// nothing in its index, though it would hold a shared system prompt after
// one request; it is priced as holding the prefix every replica already
// sent work holds, when that prefix is no longer than the rest of the
// request, and when replicating such a prefix it warms up before a holder
// (at equal load): new or added replicas take their share at once. On the
// exact index, which knows what every engine holds, it is priced as it is.
//
// Exact ties, common when idle replicas hold nothing of a new prompt, go
// to the replica with fewer requests outstanding if no replica holds any
// of the prompt, then to the one that has been sent the least prefill work
// (AssignedPrefill), then to the one the gateway chose least recently
// (Candidate.LastPicked), then to one drawn from Request.Tie: decisions
// are deterministic for a sequence of routes, misses spread evenly, and
// equal replicas take turns, never in the order they were listed.
//
// A request for a LoRA adapter (Request.Adapter) also pays for the
// adapter where it is not already in the running batch (Candidate.LoRA,
// see adapterPrice): a replica whose slots are all held by other
// adapters, or where the adapter already waits for one, makes it wait at
// least until every request of some adapter there has finished, AdapterWait
// blocks of prefill plus the decode of the requests outstanding there
// (DecodeWeight each, plus one) and a load; a free slot costs a load,
// AdapterLoad, plus the wait it may cause an adapter that needs the slot
// next: AdapterWait times the share of the slots the request's adapter
// does not hold that other adapters do (as λ prices a prompt's blocks
// for the requests behind them). An adapter in the batch costs nothing,
// so requests follow their adapter, until its replica's queue outweighs a
// load elsewhere: the load guard again, so a popular adapter spreads over
// replicas, the more readily the fewer adapters compete for their slots,
// rather than piling onto one.
//
// Three rules keep adapters from starving one another and from piling up
// (docs/lora.md has the measurements):
//
//   - A wait for a slot lasts until the adapters holding the slots stop
//     getting requests there, and an engine lets requests of a running
//     adapter pass one waiting for a slot (vLLM's scheduler does), so
//     every request sent to the running adapter there prolongs the wait.
//     Where another adapter waits for a slot (Active > MaxLoras), an
//     adapter in the batch costs AdapterWait if the adapter is also in
//     the batch at another replica where none waits: its requests go
//     there, and the slot drains.
//   - When the adapter is in the batch at such a replica, a wait for a
//     slot elsewhere costs AdapterWait × max(1, λ): the busier the
//     cluster, the longer the slot's holders keep it, and the more a
//     queue behind the adapter's own replica is worth.
//   - Replication, as for a hot prefix: a popular adapter held by fewer
//     replicas than its share of the requests in flight (counted of at
//     least 16) times the number of candidates spreads into a slot no
//     adapter has used there (LoRAState.Empty), priced a load and as if
//     the replica held the request's longest cached prefix. Only once the
//     gateway has routed 1,024 requests (the adapters in use have shown
//     up and taken slots by then) and while another empty slot remains
//     for an adapter yet to come.
//
// Replicas are priced at their speed (Candidate.BlockTime, learned by the
// gateway, speed.go): a candidate whose time per block is more than
// speedDeadband (1.3) times from the mean of the known times per block
// (the gateway's replicas', Request.ref; the candidates' own when Pick
// sums them itself) costs f·(cost+1) − 1, f its time over the mean: the
// cost plus the step that yields the token, at its speed. Within the
// deadband f is 1, so the exact ties of equal replicas stay ties; with no
// speed known nothing changes, nor where the known times per output
// token are all within the deadband of one another (a pool equal in
// decode: its differences per block are a fit's bias, see uniform in
// Pick). Where the pool has speed classes (a quarter
// of the known replicas priced faster than the deadband, or a quarter
// slower), a candidate off the deadband also costs
//
//	(f−1)·Demand·speedHorizon·((1+λ)·(len(Key) − MaxMatched) + 1)
//
// where a hot prefix lands, its later requests hit, and each pays that
// replica's speed, which the request's own cost does not see: Demand (the
// prefix's share of the traffic) times speedHorizon is how many of them
// the placement is priced over, each the blocks past the prefix and the
// step. A hot prefix that landed on a slow replica before speeds were
// known thus moves to a fast one once the slow one is somewhat busy,
// where the myopic cost kept it until the queue there outweighed a whole
// miss. One noisy fit among five or more equal replicas is not a class
// and is priced for its request alone (among four or fewer, one replica
// is a quarter: a class). The horizon grows, up to horizonMax (7,500),
// where the gateway has learned that its replicas' steps hardly grow
// with their load (speedload.go): there more traffic on a fast replica
// does not slow the requests already on it.
// A candidate whose speed is unknown while others' are known (added, or
// back in rotation) is priced as the fastest known when a quarter of the
// known are priced faster than the deadband, so that it gets the traffic
// to learn from. With a TTFT
// objective (Request.TTFT) the candidates predicted to miss it are left
// out while some (under LoadFactor's cap, if set) are predicted to meet
// it (see objective.go).
//
// Optionally, LoadFactor adds bounded loads (consistent hashing with
// bounded loads, Mirrokni et al. 2018): a replica is a candidate only while
// its in-flight count plus this request stays within ⌈LoadFactor × the
// mean⌉, a hard cap for deployments whose first-token reports are missing.
//
// A CacheAware keeps no state: the zero value uses the defaults given on
// its fields, and a CacheAware may be copied and shared by gateways.
type CacheAware struct {
	// Externality is the base of λ. Zero means the default, 1: the wait a
	// prompt's uncached blocks impose on later requests counts once more
	// than its own. A negative value means none.
	Externality float64
	// WaitingWeight prices the wait a request's uncached blocks impose on
	// the requests queued behind them at a replica: each uncached block
	// costs WaitingWeight more per request waiting in the replica's
	// engine (Load.QueueDepth). Zero means the default, 1; a negative
	// value means none.
	WaitingWeight float64
	// DecodeWeight is the cost, in blocks of prefill, of each outstanding
	// request at a replica beyond the spread (see excess above), and the
	// most it costs at a holder of the longest prefix priced in time.
	// Zero means the default, 4; a negative value means none.
	DecodeWeight float64
	// LoadFactor, when at least 1, caps each replica's in-flight requests
	// at ⌈LoadFactor × the mean⌉. Zero, the default, sets no cap; any
	// other value below 1 is refused by New.
	LoadFactor float64
	// AdapterLoad is the cost, in blocks of prefill, of loading a
	// request's LoRA adapter into a free slot. Zero means the default, 16
	// (see docs/lora.md); a negative value means none.
	AdapterLoad float64
	// AdapterWait is the cost, in blocks of prefill, of waiting for an
	// adapter slot: at least until every request of some adapter running
	// there has finished. Zero means the default, 1,024 (see
	// docs/lora.md); a negative value means none.
	AdapterWait float64
}

// validate refuses a weight that is not a finite number (NaN would make
// every cost NaN and the choice arbitrary), and a LoadFactor below 1 other
// than 0, which would set no cap.
func (p *CacheAware) validate() error {
	for _, f := range []struct {
		name string
		v    float64
	}{{"Externality", p.Externality}, {"WaitingWeight", p.WaitingWeight}, {"DecodeWeight", p.DecodeWeight},
		{"LoadFactor", p.LoadFactor}, {"AdapterLoad", p.AdapterLoad}, {"AdapterWait", p.AdapterWait}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) {
			return fmt.Errorf("%w: CacheAware.%s %v, want a finite number", ErrInvalid, f.name, f.v)
		}
	}
	if p.LoadFactor != 0 && p.LoadFactor < 1 { // Pick would set no cap at all
		return fmt.Errorf("%w: CacheAware.LoadFactor %v, want 0 (no cap) or at least 1", ErrInvalid, p.LoadFactor)
	}
	return nil
}

// Defaults of CacheAware, chosen with package sim on the Mooncake trace
// and the generated workloads (see docs/results.md).
const (
	defaultExternality  = 1
	defaultDecodeWeight = 4
	// defaultWaitingWeight is one block of delay per waiting request.
	defaultWaitingWeight = 1
	defaultAdapterLoad   = 16
	defaultAdapterWait   = 1024
	// speedHorizon is how many requests to come a hot prefix's placement
	// is priced over between speed classes (see CacheAware). On the mixed
	// pools of docs/results.md it takes the default workload from 4–7%
	// below speed-blind to 5–11% (1,000: 5–8%; 10,000 sent the fast
	// replicas so much that 8b-h100 at 1,0.7,0.4 came out 5% worse than
	// speed-blind), and leaves the trace as it was, on the mean of five
	// load refresh intervals. It is the horizon while no load growth is
	// known, and where steps grow with load (horizonFor).
	speedHorizon = 2500
	// timedExcess is how many requests beyond the spread a holder of the
	// longest prefix prices in time (see CacheAware): 8 kept
	// shared-prefix's 20.1 ms and every grid setting lowest, and
	// interactive attainment under flow control at 99.98–100% (16 and 8 ×
	// 8b-h100, 120 s); 4 did as well there but quiet tenants' p99 under
	// flow control rose 0.63 → 0.71 s; 16 and unbounded let holders fill
	// (quiet p99 0.84 and 2.90 s).
	timedExcess = 8
	// freeCacheCredit is what a block of prefill costs less where it
	// lands in free cache space, evicting nothing (see CacheAware).
	freeCacheCredit = 0.5
)

var _ Policy = (*CacheAware)(nil)

// Pick returns the candidate with the lowest cost.
func (p *CacheAware) Pick(req *Request, cands []Candidate) int {
	ext := p.Externality
	if ext == 0 {
		ext = defaultExternality
	} else if ext < 0 {
		ext = 0
	}
	dw := p.DecodeWeight
	if dw == 0 {
		dw = defaultDecodeWeight
	} else if dw < 0 {
		dw = 0
	}
	qw := pick(p.WaitingWeight, defaultWaitingWeight)
	var lp adapterPrice
	adapter, maxMatched := req.Adapter != "", req.MaxMatched
	// ref is the mean time per block, 0 while no speed is known: the
	// gateway's replicas' (Request.ref), or the candidates' when this
	// pass sums them.
	sum, ref := &req.sum, req.ref
	if !sum.ok || adapter {
		// The gateway did not sum the candidates (or the adapter's price
		// needs its own pass): sum them here.
		sum = &candSum{least: math.MaxInt, common: math.MaxInt}
		var speeds speedRef
		for i := range cands {
			c := &cands[i]
			if adapter {
				lp.count(c)
			}
			sum.add(c, maxMatched)
			speeds.add(c)
		}
		ref = speeds.mean()
	}
	// common is the prefix every candidate sent work holds.
	total, pending, holders, outstanding, least, common := sum.total, sum.pending, sum.holders, sum.outstanding, sum.least, sum.common
	// Outstanding counts up to this are within the random spread.
	spread := float64(least) + math.Sqrt(float64(outstanding)/float64(len(cands)))
	// Saturated: every candidate's engine has requests waiting. A
	// candidate with none outstanding has none waiting, so the pass that
	// checks runs only when none is idle (least > 0): an idle pool pays
	// nothing for it.
	saturated := qw > 0 && least > 0
	for i := 0; saturated && i < len(cands); i++ {
		saturated = cands[i].Load.QueueDepth > 0
	}
	n := len(req.Key)
	lambda := ext + float64(pending)/float64(len(cands))/float64(n)
	// A hot prefix held by fewer replicas than its share of the traffic
	// calls for: replicate it, pricing the replicas that lack it as if
	// they held it, so that a less loaded one warms up.
	shared := 0
	if maxMatched > 0 && float64(holders) < req.Demand*float64(len(cands)) {
		shared = maxMatched
	}
	if adapter {
		lp.set(p, dw, lambda)
	}
	bound, capped := math.Inf(1), p.LoadFactor >= 1
	if capped {
		// The least loaded candidate always fits under the ceiling, so the
		// bound never empties the set.
		bound = math.Ceil(p.LoadFactor * float64(total+1) / float64(len(cands)))
	}
	// A replicated prefix no longer than the rest of the request warms a
	// replica never sent work before one already holding it.
	warm := 2*maxMatched <= n
	// With an objective some but not all candidates are predicted to
	// meet, filter leaves out those predicted to miss it.
	filter := false
	// unknown is the price factor of a candidate whose speed is not known
	// while others' are (one added, or back in rotation): the fastest
	// known's, so that it gets the traffic to learn from rather than none
	// (at the pool's mean it would lose every request to a replica priced
	// faster), when at least a quarter of the known replicas are priced
	// faster than the deadband: a faster class, not one fit's noise (with
	// 32 equal replicas on the Mooncake trace, one noisy fit drew every
	// unknown replica's price down, and mean TTFT rose 0.8%).
	//
	// Only the TTFT objective filters: where the prefill lands decides
	// the first token, while a replica's time per token is mostly its
	// decode batch's; filtering by it too moved interactive requests off
	// the replicas holding their prompts (slo-classes at 300/s on
	// 8b-h100-blis at 1,0.5: interactive attainment 92.6% against 94.8%
	// without, docs/results.md). The TPOT objective is checked on the
	// chosen replica (FallbackSLO).
	//
	// classes: at least a quarter of the known replicas are priced faster
	// than the deadband, or a quarter slower: speed classes, between which
	// a prefix's placement is priced over speedHorizon requests to come.
	//
	// uniform: two or more times per token are known and all within the
	// deadband of one another. Such a pool's times per block are not
	// priced (no slowness, no classes): fitted without a fixed cost per
	// request, a time per block is larger where requests bring little
	// prefill (the holder of a hot prefix) and smaller where they bring
	// much, while a replica really slower is so in decode too. On real
	// engines (e2e's TestGIESideBySide, three equal llm-d-inference-sim
	// engines) pricing those times moved hot prefixes off their holders:
	// 76-79% of the prompt tokens hit against GIE's 85.5%, and 38-54 of
	// 192 requests failed for want of KV cache at 64 blocks (0-16 before
	// the picker learned speeds).
	unknown, obj, classes, uniform := 1.0, objective{ttft: req.TTFT}, false, false
	// oref is the time per block an unknown candidate is predicted at
	// against the objective: the pool's mean, as the gateway's check of
	// the chosen one takes it (RouteWith), also when ref is the
	// candidates' own; theirs when no gateway set it.
	oref := ref
	if req.ref > 0 {
		oref = req.ref
	}
	if ref > 0 || obj.set() {
		// One pass for both: the fastest known speed and how many are
		// known and priced faster or slower, and how many meet the
		// objective.
		fastest, hi := math.Inf(1), ref*speedDeadband
		known, fast, slow, meet := 0, 0, 0, 0
		// tmin, tmax: the spread of the known times per token (see
		// uniform).
		tmin, tmax, tn := math.Inf(1), 0.0, 0
		for i := range cands {
			c := &cands[i]
			if b := float64(c.BlockTime); b > 0 {
				fastest = min(fastest, b)
				known++
				if b*speedDeadband <= ref {
					fast++
				} else if b >= hi {
					slow++
				}
				if t := float64(c.TokenTime); t > 0 {
					tmin, tmax, tn = min(tmin, t), max(tmax, t), tn+1
				}
			}
			// Only a candidate under the cap counts: were every one that
			// meets the objective over it, filtering would leave none.
			if obj.set() && (!capped || float64(c.InFlight+1) <= bound) && obj.meets(c, n, oref) {
				meet++
			}
		}
		if f := fastest / ref; ref > 0 && f <= 1/speedDeadband && 4*fast >= known {
			unknown = f
		}
		filter = meet > 0 && meet < len(cands)
		uniform = tn >= 2 && tmax < tmin*speedDeadband
		classes = ref > 0 && !uniform && (fast > 0 && 4*fast >= known || slow > 0 && 4*slow >= known)
	}
	// horizon: how many requests to come a placement is priced over
	// between speed classes, read from the pool's growths only there.
	horizon := 0.0
	if classes {
		horizon = horizonFor(req.growths)
	}
	// hitWork is the work of a later request that hits the prefix this
	// request's placement decides: its blocks past the prefix, and the
	// step (see speedHorizon).
	hitWork := (1+lambda)*float64(n-maxMatched) + 1
	// fresh: a replica never sent work is priced as holding common.
	fresh := common != math.MaxInt && 2*common <= n && !req.exact
	// timed: the guard prices a holder of the longest prefix in time
	// (see CacheAware): some candidate is priced as lacking that prefix
	// (not while it is replicated, nor where every replica sent work
	// holds it and the others are fresh), a speed is known, and the pool
	// has no speed classes.
	timed := ref > 0 && maxMatched > 0 && holders < len(cands) && shared == 0 &&
		!(fresh && common >= maxMatched) && !classes
	replicating, noMatch := shared > 0, maxMatched == 0
	best, bestCost, bestOut, ties := -1, math.Inf(1), 0, 0
	for i := range cands {
		c := &cands[i]
		if capped && float64(c.InFlight+1) > bound {
			continue
		}
		if filter && !obj.meets(c, n, oref) {
			continue
		}
		m := max(c.Matched, shared)
		if fresh && c.AssignedPrefill == 0 {
			m = max(m, common)
		}
		if adapter && lp.replicates(c) {
			m = max(m, maxMatched)
		}
		out := c.Outstanding()
		cost := float64(c.PendingPrefill+c.Load.PeerPrefill) + (1+lambda)*float64(n-m)
		if saturated {
			// Each uncached block delays the requests that will queue
			// behind it there: about as many as wait there now.
			cost += qw * float64(n-m) * float64(c.Load.QueueDepth)
		}
		if excess := float64(out) - spread; excess > 0 {
			w := dw
			if timed && c.Matched >= maxMatched && c.BlockTime > 0 && c.TokenTime > 0 {
				// A holder of the longest prefix: its decoding requests
				// delay this one by their share of the step or two
				// that compute its rest, priced in blocks at its speed.
				w = min(dw, float64(c.TokenTime)/(float64(out)*float64(c.BlockTime)))
			}
			if t := float64(timedExcess); excess > t && w < dw {
				// In time for the first few only: beyond, a queue.
				cost += w*t + dw*(excess-t)
			} else {
				cost += w * excess
			}
		}
		if adapter {
			cost += lp.cost(c)
		}
		if evict := n - m - max(c.CacheBlocks-c.AssignedPrefill, 0); evict > 0 {
			cost += freeCacheCredit * float64(evict)
		}
		if ref > 0 {
			// Priced in predicted time: the cost plus the step that
			// yields the token, at the replica's speed.
			f := unknown
			if c.BlockTime > 0 && !uniform {
				f = slowness(c, ref)
			}
			if f != 1 {
				cost = f*(cost+1) - 1
				if classes {
					cost += req.Demand * horizon * (f - 1) * hitWork
				}
			}
		}
		switch {
		case best < 0 || cost < bestCost:
			best, bestCost, bestOut, ties = i, cost, out, 1
			continue
		case cost > bestCost:
			continue
		}
		// An equal cost: order c and the best so far by the tie order
		// (see tieLast), written out here, as the tie of many replicas
		// sharing one prompt is this loop's common case and a call costs
		// more than its comparisons.
		o := 0
		if replicating || noMatch {
			o = out - bestOut
		}
		if o == 0 && replicating {
			b := &cands[best]
			if fc, fb := c.AssignedPrefill == 0, b.AssignedPrefill == 0; warm && fc != fb {
				o = 1
				if fc {
					o = -1 // a replica never sent work evicts nothing for the copy
				}
			} else {
				o = b.Matched - c.Matched
			}
		}
		if o == 0 {
			o = tieLast(c, &cands[best])
		}
		switch {
		case o < 0:
			best, bestOut, ties = i, out, 1
		case o == 0:
			// A full tie: keep each of the k tied so far with
			// probability 1/k, drawn from req.Tie.
			ties++
			if drawTie(req.Tie, ties) {
				best, bestOut = i, out
			}
		}
	}
	return best
}

// drawTie reports whether the k-th of candidates tied in every respect
// replaces the one kept so far: with probability 1/k, drawn from tie (a
// Request.Tie), so that each of them is chosen alike.
func drawTie(tie uint64, k int) bool {
	return mix64(tie, uint64(k))%uint64(k) == 0
}

// mix64 hashes two words with SplitMix64's finaliser (hashtab.Mix64).
func mix64(a, b uint64) uint64 { return hashtab.Mix64(a, b) }

// The tie order (CacheAware's exact ties), written out in Pick: when
// replicating, or when no replica holds any of the key, the replica with
// fewer requests outstanding wins; when replicating, then (with spread) a
// replica never sent work, then one that holds more of the prefix
// (replication is for load, not for its own sake). Then less prefill work
// sent so far, then the replica chosen least recently (tieLast). One
// comparison decides both ways, as the tied candidates of a cluster that
// shares one prompt are many.

// tieLast orders a and b at equal cost once the rules before it tie:
// negative when a is better, positive when b is, 0 on a full tie (which
// the caller draws): less prefill work sent so far, then the replica
// chosen least recently.
func tieLast(a, b *Candidate) int {
	if d := a.AssignedPrefill - b.AssignedPrefill; d != 0 {
		return d
	}
	if a.LastPicked != b.LastPicked {
		if a.LastPicked < b.LastPicked {
			return -1
		}
		return 1
	}
	return 0
}

// adapterPrice prices a request's adapter at each candidate (see
// CacheAware): the load of an adapter, the wait for a slot, and the share
// of the slots other adapters hold.
type adapterPrice struct {
	load, wait, dw float64
	// waitBusy is the wait for a slot while the adapter is in the batch
	// at a replica where none waits: wait × max(1, λ).
	waitBusy float64
	// slots and used count the candidates' reported slots and those in
	// use; mine the candidates where the request's adapter is in the
	// batch, clear those of them where no other adapter waits for a slot;
	// reps the candidates that report slots, empty their slots no adapter
	// has used.
	slots, used, mine, clear, reps, empty int
	// routed and inflight count the adapter's requests in flight and all
	// requests in flight over the candidates.
	routed, inflight int
	// seen is the number of requests the gateway has routed, as far as
	// the candidates tell (Candidate.LastPicked).
	seen uint64
	// contention is (used − mine) / (slots − mine): how much of what the
	// adapter does not hold other adapters do.
	contention float64
}

// count adds a candidate.
func (a *adapterPrice) count(c *Candidate) {
	l := &c.LoRA
	a.routed += l.Routed
	a.inflight += c.InFlight
	a.seen = max(a.seen, c.LastPicked)
	if l.MaxLoras == 0 {
		return
	}
	a.reps++
	a.empty += l.Empty
	a.slots += l.MaxLoras
	a.used += min(l.Active, l.MaxLoras)
	if l.inBatch() {
		a.mine++
		if l.Active <= l.MaxLoras {
			a.clear++
		}
	}
}

// set fixes the costs from the policy's parameters and λ once every
// candidate is counted.
func (a *adapterPrice) set(p *CacheAware, dw, lambda float64) {
	a.load, a.wait, a.dw = pick(p.AdapterLoad, defaultAdapterLoad), pick(p.AdapterWait, defaultAdapterWait), dw
	a.waitBusy = a.wait
	if a.clear > 0 {
		a.waitBusy = a.wait * max(1, lambda)
	}
	if others := a.slots - a.mine; others > 0 {
		a.contention = min(1, float64(max(a.used-a.mine, 0))/float64(others))
	}
}

// pick is v, or def when v is 0, or 0 when v is negative.
func pick(v, def float64) float64 {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

// cost is what serving the request's adapter costs at c, in blocks of
// prefill: nothing when the adapter is in the batch there, unless another
// adapter waits for a slot there and the adapter is in the batch at a
// replica where none waits (then AdapterWait); nothing when it is idle in
// a slot while one is free; a load when c is a replica to spread it to
// (replicates); a load, plus the wait it may cause another adapter
// (AdapterWait × contention), when a slot is free; and when it must wait
// for a slot (all held by other adapters, or it already waits there), a
// load, AdapterWait (× max(1, λ) while it runs clear elsewhere), and the
// decode of the requests outstanding there (DecodeWeight each, plus one).
func (a *adapterPrice) cost(c *Candidate) float64 {
	l := &c.LoRA
	switch {
	case l.inBatch():
		if a.clear > 0 && l.MaxLoras > 0 && l.Active > l.MaxLoras {
			return a.wait
		}
		return 0
	case l.Waiting || !l.freeSlot():
		return a.load + a.waitBusy + a.dw*float64(c.Outstanding()+1)
	case l.Loaded:
		return 0
	case a.replicates(c):
		return a.load
	}
	return a.load + a.wait*a.contention
}

// replicates reports whether the adapter should spread to c: c has a slot
// no adapter has used and the adapter is not there, another such slot
// remains among the candidates, the gateway has routed demandWindow
// requests, and fewer candidates have the adapter in the batch than its
// share of the requests in flight (of at least demandPrior) calls for.
func (a *adapterPrice) replicates(c *Candidate) bool {
	l := &c.LoRA
	return l.Empty > 0 && !l.Loaded && !l.Waiting && a.empty >= 2 && a.seen >= demandWindow &&
		float64(a.mine+1) <= float64(a.routed)/float64(max(a.inflight, demandPrior))*float64(a.reps)
}

package gateway

import "fmt"

// PD plans the requests of a disaggregated model, whose prefill and decode
// run on two independently scaled pools: the decode replica is chosen
// first, over the decode pool; the request is split only when enough of
// its prompt is not cached there, and some prefill replica has no more
// prefill queued than the decode replica would have with this request's
// (so a backed-up prefill pool does not hold up what the decode replica
// could start at once); a split request's prefill replica is then chosen
// over the prefill pool. Each pool's gateway keeps its own
// policy (cache-aware for prefill, where a cached prefix saves compute,
// and load-aware for decode is usual). The HTTP gateway and the endpoint
// picker plan through it, as examples/disagg does; the simulator does not
// model disaggregation. A PD is a value: its
// gateways are safe for concurrent use, and so is Route.
type PD struct {
	// Decode is the decode pool's gateway. Required.
	Decode *Gateway
	// Prefill is the prefill pool's gateway; nil when that pool has no
	// replicas, and every request is then decoded co-located.
	Prefill *Gateway
	// MinUncached is the fewest prompt tokens not cached on the decode
	// replica for which a request is split, as llm-d's prefix-based
	// decider's threshold (nonCachedTokens). 0 lets every request split,
	// unlike there, where 0 disables the split (v0.7.1,
	// pkg/plugins/profile/prefix_based_pd_decider.go).
	MinUncached int
}

// PDDecision is the plan for one request of a disaggregated model. The
// caller reports each side's progress on its own Decision.
type PDDecision struct {
	// Decode is the decision over the decode pool. A split request's
	// uncached blocks are not pending prefill on its replica (the prefill
	// replica does that work), and its first token teaches that replica's
	// speed only the time per output token after it.
	Decode Decision
	// Split says the prefill runs on Prefill's replica and the KV cache is
	// handed to Decode's; else the decode replica prefills (co-located)
	// and Prefill is the zero Decision.
	Split   bool
	Prefill Decision
	// Uncached is the estimate of the prompt tokens not cached on the
	// decode replica: its unmatched blocks times the tokens per block.
	Uncached int
	// Reason says why a request is not split: "cached" (Uncached is below
	// MinUncached), "prefill_unavailable" (no eligible prefill replica) or
	// "prefill_busy" (every eligible prefill replica has more prefill
	// queued than the decode replica, this request's included). "" when
	// Split.
	Reason string
}

// Route plans a request whose prefix is key: the decode replica within
// decode, and for a split, the prefill replica within prefill (a picker
// may name prefill replicas it cannot reach itself, so the two targets
// differ). tokensPerBlock converts key blocks into prompt tokens for
// MinUncached (at least 1). Queued prefill is compared in blocks: a
// replica's PendingPrefill plus its peers' (Load.PeerPrefill). An error from the
// decode pool's routing is returned as is (wrapping ErrNoHealthyReplica
// when no decode replica is eligible); the prefill side never fails the
// plan, which then decodes co-located. It does not allocate.
func (p *PD) Route(key Key, tokensPerBlock int, decode, prefill Target) (PDDecision, error) {
	if p == nil || p.Decode == nil {
		return PDDecision{}, fmt.Errorf("%w: PD.Decode is nil", ErrInvalid)
	}
	if tokensPerBlock < 1 {
		return PDDecision{}, fmt.Errorf("%w: PD.Route: tokensPerBlock %d, want at least 1", ErrInvalid, tokensPerBlock)
	}
	d, err := p.Decode.RouteWith(key, decode)
	if err != nil {
		return PDDecision{}, err
	}
	out := PDDecision{Decode: d, Uncached: (d.Blocks - d.Matched) * tokensPerBlock}
	switch {
	case out.Uncached < p.MinUncached:
		out.Reason = "cached"
		return out, nil
	case p.Prefill == nil:
		out.Reason = "prefill_unavailable"
		return out, nil
	}
	// The decode replica's queued prefill, this request's uncached blocks
	// included: what a co-located prefill would wait for and do.
	colocated := int(d.rs.pending.Load()) + int(d.rs.peer.Load())
	split, ok := p.Prefill.leastQueued(&prefill)
	switch {
	case !ok:
		out.Reason = "prefill_unavailable"
		return out, nil
	case split > colocated:
		out.Reason = "prefill_busy"
		return out, nil
	}
	pre, err := p.Prefill.RouteWith(key, prefill)
	if err != nil {
		out.Reason = "prefill_unavailable"
		return out, nil
	}
	out.Split, out.Prefill = true, pre
	out.Decode.handOff()
	return out, nil
}

// Colocate makes a split plan co-located after all, for a front whose
// prefill failed and that sends the request to the decode replica with its
// own body, to prefill there: the request's uncached blocks are pending
// prefill on that replica again, until its first token, and Decode's Done
// teaches the replica's prefill speed, as for a plan Route did not split.
// Split is cleared; Prefill is left for the caller to report on. Call it
// before any report on Decode (after one it changes only Split); it does
// nothing to a plan that is not split.
func (pd *PDDecision) Colocate() {
	if !pd.Split {
		return
	}
	pd.Split = false
	pd.Decode.colocate()
}

// RouteDecode routes the decode side of a split request again, over the
// decode pool within t: a retry after its decode replica failed (t.Exclude
// naming it), with the KV cache still handed over from the prefill side.
// As for Route's Decode, the request's uncached blocks are not pending
// prefill on the replica chosen and its Done teaches only the time per
// output token. Its errors are the decode pool's RouteWith's.
func (p *PD) RouteDecode(key Key, t Target) (Decision, error) {
	if p == nil || p.Decode == nil {
		return Decision{}, fmt.Errorf("%w: PD.Decode is nil", ErrInvalid)
	}
	d, err := p.Decode.RouteWith(key, t)
	if err != nil {
		return d, err
	}
	d.handOff()
	return d, nil
}

// leastQueued returns the least prefill queued on an eligible replica
// (healthy and within t), PendingPrefill + Load.PeerPrefill in blocks;
// false when no replica is eligible. It takes no lock.
func (g *Gateway) leastQueued(t *Target) (int, bool) {
	best, ok := 0, false
	for _, rs := range g.snap.Load().list {
		if !t.eligible(rs) {
			continue
		}
		if q := int(rs.pending.Load()) + int(rs.peer.Load()); !ok || q < best {
			best, ok = q, true
		}
	}
	return best, ok
}

package picker

import (
	"slices"

	"github.com/examlops/gateway"
)

// ScopedPolicy wraps a gateway.Policy so that a GatewayRouter can, per
// request, restrict the choice to the replicas a subset hint allows, shed
// load, and learn the best other candidates to offer as fallbacks. Outside
// a GatewayRouter's call it behaves exactly as the policy it wraps.
//
// Give it to gateway.New with gateway.WithPolicy, one ScopedPolicy per
// Gateway, and route that Gateway only through its GatewayRouter: the
// per-request scope is set by the router, under its lock, just before it
// calls Gateway.Route, and read by Pick, which Route calls synchronously
// under the gateway's lock. (A Gateway method routing within a set of
// replicas, which the root package does not have yet, would replace this;
// see docs/picker.md, "Not done yet".)
type ScopedPolicy struct {
	inner gateway.Policy
	// ShedAbove, when positive, makes Pick decline a request (the router
	// answers 429) when every candidate in scope has at least this many
	// outstanding requests (gateway.Candidate.Outstanding). Zero never
	// sheds. Set it before routing starts.
	ShedAbove int

	// Per-call scope and results, owned by the GatewayRouter's call.
	allow     map[string]struct{} // nil: every candidate
	fallbacks int
	outNames  []string
	shed      bool
	empty     bool

	scratch []gateway.Candidate
	index   []int
	order   []int
}

var _ gateway.Policy = (*ScopedPolicy)(nil)

// NewScopedPolicy wraps inner (for example &gateway.CacheAware{}).
func NewScopedPolicy(inner gateway.Policy) *ScopedPolicy {
	return &ScopedPolicy{inner: inner}
}

// Inner returns the wrapped policy.
func (p *ScopedPolicy) Inner() gateway.Policy { return p.inner }

// Pick chooses with the wrapped policy among the candidates in scope. It
// returns Index -1 (which Gateway.Route reports as gateway.ErrBadChoice,
// booking nothing) when no candidate is in scope or the request is shed.
func (p *ScopedPolicy) Pick(req *gateway.Request, cands []gateway.Candidate) gateway.Choice {
	p.outNames = p.outNames[:0]
	p.shed, p.empty = false, false
	in, index := cands, p.index[:0]
	if p.allow != nil {
		in = p.scratch[:0]
		for i := range cands {
			if _, ok := p.allow[cands[i].Name]; ok {
				in = append(in, cands[i])
				index = append(index, i)
			}
		}
		p.scratch, p.index = in, index
		if len(in) == 0 {
			p.empty = true
			return gateway.Choice{Index: -1}
		}
	}
	if p.ShedAbove > 0 {
		shed := true
		for i := range in {
			if in[i].Outstanding() < p.ShedAbove {
				shed = false
				break
			}
		}
		if shed {
			p.shed = true
			return gateway.Choice{Index: -1}
		}
	}
	ch := p.inner.Pick(req, in)
	if ch.Index < 0 || ch.Index >= len(in) {
		return gateway.Choice{Index: -1}
	}
	if p.fallbacks > 0 {
		p.rankFallbacks(in, ch.Index)
	}
	if p.allow != nil {
		ch.Index = index[ch.Index]
	}
	return ch
}

// rankFallbacks records the best candidates other than the chosen one:
// longest cached prefix first, then fewest outstanding requests, then
// table order.
func (p *ScopedPolicy) rankFallbacks(in []gateway.Candidate, chosen int) {
	order := p.order[:0]
	for i := range in {
		if i != chosen {
			order = append(order, i)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int {
		ca, cb := &in[a], &in[b]
		if ca.Matched != cb.Matched {
			return cb.Matched - ca.Matched
		}
		return ca.Outstanding() - cb.Outstanding()
	})
	p.order = order
	for _, i := range order[:min(p.fallbacks, len(order))] {
		p.outNames = append(p.outNames, in[i].Name)
	}
}

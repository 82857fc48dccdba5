package reference

import (
	"math/rand/v2"
	"sync"

	"github.com/examlops/gateway"
)

// P2C is the power of two random choices (Mitzenmacher 2001, "The Power of
// Two Choices in Randomized Load Balancing"; Envoy's and Linkerd's
// least-request balancer): it samples two distinct candidates at random and
// routes to the one with fewer outstanding requests
// (gateway.Candidate.Outstanding), the first sampled on a tie.
//
// The zero value draws from a generator seeded with 0; use NewP2C for
// another seed. Safe for concurrent use.
type P2C struct {
	mu  sync.Mutex
	rng *rand.Rand
}

// NewP2C returns a P2C policy whose random choices are seeded with seed.
func NewP2C(seed uint64) *P2C {
	return &P2C{rng: rand.New(rand.NewPCG(seed, 0x9c2))}
}

var _ gateway.Policy = (*P2C)(nil)

// Pick implements gateway.Policy.
func (p *P2C) Pick(_ *gateway.Request, cands []gateway.Candidate) int {
	if len(cands) == 1 {
		return 0
	}
	p.mu.Lock()
	if p.rng == nil {
		p.rng = rand.New(rand.NewPCG(0, 0x9c2))
	}
	a := p.rng.IntN(len(cands))
	b := p.rng.IntN(len(cands) - 1)
	p.mu.Unlock()
	if b >= a {
		b++
	}
	if cands[b].Outstanding() < cands[a].Outstanding() {
		a = b
	}
	return a
}

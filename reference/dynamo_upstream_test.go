package reference

import (
	"testing"

	"github.com/examlops/gateway"
	"github.com/stretchr/testify/assert"
)

// Dynamo's router hashes a prompt's full blocks only
// (compute_block_hash_for_seq), so its overlap and active blocks never
// include a partial last block, and a prompt shorter than a block has
// none: new_tokens = isl − overlap·block_size counts the partial block as
// uncached wherever it is.
func TestDynamoFullBlocksOnly(t *testing.T) {
	arrive := func(p *Dynamo, id uint64, tokens int) {
		p.Arrive(Arrival{ID: id, Time: t0, Tokens: tokens, BlockTokens: 16})
	}
	// 168 tokens: 10 full blocks and 8 tokens. r0 holds all 11 key
	// blocks, r1 the 10 full ones: the same overlap, a tie.
	seen := map[int]bool{}
	for seed := range uint64(32) {
		p := NewDynamo(seed)
		cs := cands(2)
		cs[0].Matched, cs[1].Matched = 11, 10
		arrive(p, 1, 168)
		seen[p.Pick(reqFor(key(11), cs), cs)] = true
	}
	assert.Len(t, seen, 2, "the partial block gives r0 no edge")

	// An 8-token prompt has no full block: nothing becomes active.
	p := NewDynamo(1)
	cs := cands(1)
	arrive(p, 1, 8)
	p.Pick(reqFor(keyFrom(3, 1), cs), cs)
	p.Routed(1, "r0")
	w := p.worker("r0")
	assert.Empty(t, w.unique)
	assert.Equal(t, 8, w.activeTokens)
	p.Done(1, gateway.DoneInfo{})
	assert.Zero(t, w.activeTokens)
}

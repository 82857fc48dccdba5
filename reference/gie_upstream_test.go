package reference

import (
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/stretchr/testify/assert"
)

// A prompt with no blocks hashes to nothing: the prefix scorer gives 0
// when TotalBlocks is 0 (scorer/prefix/plugin.go), so the loads decide.
func TestGIEEmptyPromptScoresNoPrefix(t *testing.T) {
	cs := cands(3)
	cs[0].Load.QueueDepth, cs[1].Load.QueueDepth = 5, 5
	for _, p := range []gateway.Policy{NewGIE(1), NewLLMDPrecise(1)} {
		assert.Equal(t, 2, p.Pick(&gateway.Request{}, cs), "%T: the shortest queue", p)
	}
}

// A server whose engine reports no KV capacity gets the indexer's
// default LRU of 31,250 blocks (approximateprefix makeserver), not 1.
func TestGIEIndexFallbackCapacity(t *testing.T) {
	p := NewGIE(1)
	cs := cands(1)
	cs[0].CacheBlocks = 0
	route(p, 1, 0, keyFrom(1, 8), cs)
	route(p, 2, 0, keyFrom(1, 8), cs)
	assert.Equal(t, 8, p.Predicted(), "the prompt is still indexed")
}

// llm-d runs the same approximate prefix producer: its index too falls
// back to 31,250 blocks for a server reporting no capacity.
func TestLLMDPredictedIndexFallbackCapacity(t *testing.T) {
	p := NewLLMDPredicted(1, false)
	p.SetClock(func() time.Time { return t0 })
	cs := cands(1)
	cs[0].CacheBlocks = 0
	route(p, 1, 0, keyFrom(1, 8), cs)
	route(p, 2, 0, keyFrom(1, 8), cs)
	assert.Equal(t, 8, p.Predicted(), "the prompt is still indexed")
}

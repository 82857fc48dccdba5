package reference

import (
	"github.com/cespare/xxhash/v2"
	"github.com/examlops/gateway"
)

// PrefixAffinity is pure prefix affinity, the baseline of prefix-aware
// routing papers (e.g. Preble, ICLR 2025; the "prefix-cache affinity" scorer
// of llm-d used alone): it routes to the replica holding the longest cached
// prefix and ignores load entirely. Among equal matches, including when
// nothing matches, it picks by rendezvous hashing of the first block, so a
// prefix always lands on the same replica. On traffic sharing one system
// prompt it sends everything to one replica: the collapse the load-aware
// policies must avoid.
//
// The zero value is ready to use and safe for concurrent use.
type PrefixAffinity struct{}

var _ gateway.Policy = (*PrefixAffinity)(nil)

// Pick implements gateway.Policy.
func (p *PrefixAffinity) Pick(req *gateway.Request, cands []gateway.Candidate) int {
	best, bestH := -1, uint64(0)
	for i := range cands {
		c := &cands[i]
		if c.Matched != req.MaxMatched {
			continue
		}
		h := xxhash.Sum64String(c.Name) ^ req.Key[0]
		h ^= h >> 33
		h *= 0xff51afd7ed558ccd
		h ^= h >> 33
		if best < 0 || h > bestH {
			best, bestH = i, h
		}
	}
	return best
}

package reference

import (
	"cmp"
	"encoding/binary"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/cespare/xxhash/v2"
	"github.com/examlops/gateway"
)

// CHWBL is consistent hashing with bounded loads (Mirrokni, Thorup and
// Zadimoghaddam 2018), as KubeAI's prefix-hash load balancer uses it (KubeAI
// docs, "Load balancing"): the hash of the prompt's first PrefixBlocks
// blocks picks a point on a ring of Replication virtual nodes per replica,
// and the request goes to the first replica clockwise whose in-flight count
// plus one is within LoadFactor × the mean (KubeAI default 1.25).
//
// The zero value uses LoadFactor 1.25, Replication 256 and PrefixBlocks 1.
// Safe for concurrent use.
type CHWBL struct {
	// LoadFactor bounds a replica's load relative to the mean; 0 means 1.25.
	LoadFactor float64
	// Replication is the number of virtual nodes per replica; 0 means 256.
	Replication int
	// PrefixBlocks is how many leading blocks are hashed; 0 means 1.
	PrefixBlocks int

	mu    sync.Mutex
	names []string // the candidate names ring was built for, in order
	ring  []ringPoint
}

type ringPoint struct {
	h    uint64
	name string
}

var _ gateway.Policy = (*CHWBL)(nil)

// Pick implements gateway.Policy.
func (p *CHWBL) Pick(req *gateway.Request, cands []gateway.Candidate) gateway.Choice {
	lf := p.LoadFactor
	if lf == 0 {
		lf = 1.25
	}
	pb := p.PrefixBlocks
	if pb <= 0 {
		pb = 1
	}
	total := 0
	for i := range cands {
		total += cands[i].InFlight
	}
	bound := math.Ceil(lf * float64(total+1) / float64(len(cands)))
	h := hashUint64(req.Key[min(pb, len(req.Key))-1])

	p.mu.Lock()
	defer p.mu.Unlock()
	ring := p.ringFor(cands)
	start, _ := slices.BinarySearchFunc(ring, h, func(rp ringPoint, h uint64) int { return cmp.Compare(rp.h, h) })
	first := -1
	for k := range ring {
		name := ring[(start+k)%len(ring)].name
		i := indexOf(cands, name)
		if first < 0 {
			first = i
		}
		if float64(cands[i].InFlight+1) <= bound {
			ch := gateway.Choice{Index: i, Kind: gateway.KindAffinity}
			if i != first {
				ch.Kind, ch.Fallback = gateway.KindLoadAware, gateway.FallbackLoadGuard
			}
			return ch
		}
	}
	return gateway.Choice{Index: first, Kind: gateway.KindAffinity}
}

func indexOf(cands []gateway.Candidate, name string) int {
	for i := range cands {
		if cands[i].Name == name {
			return i
		}
	}
	return 0
}

// hashUint64 is the xxHash64 of x's 8 little-endian bytes, computed
// without a heap buffer.
func hashUint64(x uint64) uint64 {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], x)
	return xxhash.Sum64(b[:])
}

// ringFor returns the ring of the candidates' names, rebuilding it when the
// names or their order change; an unchanged set costs no allocation. p.mu
// must be held.
func (p *CHWBL) ringFor(cands []gateway.Candidate) []ringPoint {
	same := p.ring != nil && slices.EqualFunc(cands, p.names, func(c gateway.Candidate, n string) bool { return c.Name == n })
	if !same {
		rep := p.Replication
		if rep <= 0 {
			rep = 256
		}
		ring := make([]ringPoint, 0, rep*len(cands))
		for i := range cands {
			for v := range rep {
				b := binary.LittleEndian.AppendUint64([]byte(cands[i].Name+"#"), uint64(v))
				ring = append(ring, ringPoint{h: xxhash.Sum64(b), name: cands[i].Name})
			}
		}
		slices.SortFunc(ring, func(a, b ringPoint) int {
			return cmp.Or(cmp.Compare(a.h, b.h), strings.Compare(a.name, b.name))
		})
		p.names = p.names[:0]
		for i := range cands {
			p.names = append(p.names, cands[i].Name)
		}
		p.ring = ring
	}
	return p.ring
}

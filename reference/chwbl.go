package reference

import (
	"cmp"
	"encoding/binary"
	"slices"
	"strconv"
	"sync"

	"github.com/cespare/xxhash/v2"
	"github.com/examlops/gateway"
)

// CHWBL is consistent hashing with bounded loads (Mirrokni, Thorup and
// Zadimoghaddam 2018) as KubeAI's PrefixHash load balancing strategy runs
// it, followed from substratusai/kubeai at 2f32ef49 (2025-07-06):
//
//   - the key is the first PrefixCharLength (default 100) characters of the
//     request's first user message (api/openai/v1/chat_completions.go
//     Prefix; a completion's prompt for /v1/completions), hashed with
//     xxHash; here, the user message's content id from Arrive
//     (Arrival.UserContent), or the prompt's first block when no request
//     was announced; a request for a LoRA adapter hashes the adapter's name
//     first (internal/loadbalancer/group.go: req.Adapter+req.Prefix), and
//     KubeAI's filter to endpoints that have the adapter (every replica
//     here) is the only other adapter rule: it does not see slots;
//   - a ring of Replication (default 256) points per endpoint, each the
//     xxHash of the endpoint name followed by the point's number
//     (internal/loadbalancer/balance_chwbl.go);
//   - from the key's point clockwise, the first endpoint whose in-flight
//     count is at most LoadFactor (default 1.25, meanLoadFactor 125) times
//     (total in flight + 1) / endpoints, any endpoint when nothing is in
//     flight (chwblLoadOK); the first endpoint met when none qualifies.
//
// In-flight counts are the proxy's own (Candidate.InFlight). The zero value
// uses KubeAI's defaults. Safe for concurrent use.
type CHWBL struct {
	// LoadFactor bounds a replica's load relative to the mean; 0 means 1.25.
	LoadFactor float64
	// Replication is the number of virtual nodes per replica; 0 means 256.
	Replication int

	mu    sync.Mutex
	names []string // the candidate names ring was built for, in order
	ring  []ringPoint
	pend  pending
}

type ringPoint struct {
	h    uint64
	name string
}

var (
	_ gateway.Policy = (*CHWBL)(nil)
	_ Tracker        = (*CHWBL)(nil)
)

// Arrive implements Tracker: the request's first user message is its key.
func (p *CHWBL) Arrive(a Arrival) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pend = pending{a: a, set: true}
}

// FirstToken implements gateway.Observer; CHWBL does not use it.
func (p *CHWBL) FirstToken(uint64) {}

// Done implements gateway.Observer; the load is the gateway's in-flight count.
func (p *CHWBL) Done(uint64, gateway.DoneInfo) {}

// Routed implements gateway.Observer; the request is the last Pick's.
func (p *CHWBL) Routed(uint64, string) {}

// Pick implements gateway.Policy.
func (p *CHWBL) Pick(req *gateway.Request, cands []gateway.Candidate) int {
	lf := p.LoadFactor
	if lf == 0 {
		lf = 1.25
	}
	total := 0
	for i := range cands {
		total += cands[i].InFlight
	}
	threshold := float64(total+1) / float64(len(cands)) * lf
	p.mu.Lock()
	defer p.mu.Unlock()
	announced := p.pend.set
	a := p.pend.take()
	key := req.Key[0]
	if announced {
		key = a.UserContent
	}
	h := hashUint64(key)
	if req.Adapter != "" {
		// KubeAI hashes the adapter's name before the prefix
		// (internal/loadbalancer/group.go: req.Adapter+req.Prefix).
		var d xxhash.Digest
		d.Reset()
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], key)
		_, _ = d.WriteString(req.Adapter)
		_, _ = d.Write(b[:])
		h = d.Sum64()
	}
	ring := p.ringFor(cands)
	start, _ := slices.BinarySearchFunc(ring, h, func(rp ringPoint, h uint64) int { return cmp.Compare(rp.h, h) })
	first := -1
	for k := range ring {
		i := indexOf(cands, ring[(start+k)%len(ring)].name)
		if first < 0 {
			first = i
		}
		if total == 0 || float64(cands[i].InFlight) <= threshold {
			return i
		}
	}
	return first
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
				ring = append(ring, ringPoint{h: xxhash.Sum64String(cands[i].Name + strconv.Itoa(v)), name: cands[i].Name})
			}
		}
		slices.SortFunc(ring, func(a, b ringPoint) int {
			return cmp.Or(cmp.Compare(a.h, b.h), cmp.Compare(a.name, b.name))
		})
		p.names = p.names[:0]
		for i := range cands {
			p.names = append(p.names, cands[i].Name)
		}
		p.ring = ring
	}
	return p.ring
}

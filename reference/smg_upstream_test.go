package reference

import (
	"testing"
	"time"

	"github.com/examlops/gateway"
)

// TestSMGNodeKeepsItsLastTenant pins smg's tenant pick: string_tree.rs
// (lightseekorg/smg 73da68ca, match_prefix_with_counts) returns the node's
// cached last_tenant while that tenant still holds the node; the cache is
// set to the tenant that created the node (insert_from, Entry::Vacant) and
// is not moved by later inserts of other tenants. So a prompt first sent to
// one worker, then also to another by the imbalance path, keeps going to
// the first, whatever the node's map order.
func TestSMGNodeKeepsItsLastTenant(t *testing.T) {
	key := gateway.Key{0x11, 0x12, 0x13}
	for seed := uint64(0); seed < 32; seed++ {
		p := NewSMG(seed, false)
		t0 := time.Unix(0, 0)
		route := func(at time.Duration, inflightA, inflightB int) string {
			p.Arrive(Arrival{ID: uint64(at) + 1, Time: t0.Add(at), Tokens: 16 * len(key), BlockTokens: 16})
			cands := []gateway.Candidate{{Name: "A", InFlight: inflightA}, {Name: "B", InFlight: inflightB}}
			return cands[p.Pick(&gateway.Request{Key: key}, cands)].Name
		}
		first := route(time.Second, 0, 1) // empty tree: the least loaded, A
		if first != "A" {
			t.Fatalf("seed %d: first request went to %s, want A", seed, first)
		}
		// Imbalanced (100 vs 0): the least loaded, B, which the prompt's
		// nodes now hold too.
		if got := route(2*time.Second, 100, 0); got != "B" {
			t.Fatalf("seed %d: imbalanced request went to %s, want B", seed, got)
		}
		// Balanced, full match: the nodes' last tenant, A.
		if got := route(3*time.Second, 0, 0); got != "A" {
			t.Errorf("seed %d: full match went to %s, want A, the nodes' creator (last_tenant)", seed, got)
		}
	}
}

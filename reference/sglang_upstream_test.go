package reference

import (
	"testing"
	"time"

	"github.com/examlops/gateway"
)

// TestSGLangMissStampsMatchedTenant pins that a low match still stamps the
// matched tenant's path: cache_aware.rs (b93974f1, select_worker) calls
// tree.prefix_match before the threshold test, and prefix_match (tree.rs
// at 24ce7f6c) stamps the tenant it returns on the matched node and every
// ancestor whatever the match rate. So a prefix A was sent long ago, matched
// (too little) by a request that went to B, is fresh for A at the next
// eviction and outlives A's more recent but untouched prompt.
func TestSGLangMissStampsMatchedTenant(t *testing.T) {
	p := &SGLang{EvictionInterval: 5 * time.Second, MaxTreeChars: 32 * charsPerToken, Seed: 1}
	t0 := time.Unix(0, 0)
	route := func(at time.Duration, key gateway.Key, inflightA, inflightB int) string {
		p.Arrive(Arrival{ID: uint64(at), Time: t0.Add(at), Tokens: 16 * len(key), BlockTokens: 16})
		cands := []gateway.Candidate{{Name: "A", InFlight: inflightA}, {Name: "B", InFlight: inflightB}}
		return cands[p.Pick(&gateway.Request{Key: key}, cands)].Name
	}
	if got := route(1*time.Second, gateway.Key{0xa1, 0xa2}, 0, 1); got != "A" {
		t.Fatalf("first prompt went to %s, want A (fewer in flight)", got)
	}
	if got := route(2*time.Second, gateway.Key{0xb1, 0xb2}, 0, 1); got != "A" {
		t.Fatalf("second prompt went to %s, want A", got)
	}
	// One block of five matched (0.2, not above 0.5): a miss, to B.
	if got := route(3*time.Second, gateway.Key{0xa1, 0xc1, 0xc2, 0xc3, 0xc4}, 1, 0); got != "B" {
		t.Fatalf("low match went to %s, want B (fewer in flight)", got)
	}
	// The eviction due at 6 s cuts A from 64 tokens to 32: a2 (1 s) goes,
	// then b2 (2 s) before a1, stamped at 3 s by the miss.
	p.Arrive(Arrival{ID: 99, Time: t0.Add(7 * time.Second), Tokens: 16, BlockTokens: 16})
	a := p.tree.slot["A"]
	if n := p.tree.nodes[0xa1]; n == nil || n.holder(a) == nil {
		t.Errorf("A lost block a1, stamped by the miss at 3 s; upstream evicts b2 (2 s) first")
	}
	if n := p.tree.nodes[0xb2]; n != nil && n.holder(a) != nil {
		t.Errorf("A kept block b2 (2 s) over a1 (stamped at 3 s)")
	}
}

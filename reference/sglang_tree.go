package reference

import (
	"container/heap"

	"github.com/examlops/gateway"
)

// sgTree is SGLang's multi-tenant approximate radix tree (sgl-router
// src/policies/tree.rs, later sgl-model-gateway/src/policies/tree.rs) at
// block granularity: one tree shared by all tenants (replicas), each node
// a block of some routed prompt, recording which tenants were sent it and
// when each last touched it. SGLang's tree holds characters; this one
// holds the blocks of gateway keys, each as long as the tokens it covers,
// and sizes are counted in tokens (charsPerToken converts SGLang's
// character budget).
//
// The invariant tree.rs keeps holds here too: a tenant on a node is on
// every ancestor, since insertion walks from the root and eviction removes
// a tenant from its leaves only. Not safe for concurrent use.
type sgTree struct {
	root  sgNode
	nodes map[uint64]*sgNode
	slot  map[string]int32
	size  []int64  // tokens held per tenant slot
	salt  []uint64 // per tenant: its place in each node's iteration order
	seeds seeded
	pq    evictHeap
}

type sgNode struct {
	parent   *sgNode
	key      uint64
	tokens   int32
	children int32
	holders  []sgHolder
	last     int32 // smg's last_tenant cache: the node's creator, -1 none
}

// sgHolder is a tenant on a node: its last access (ns) and how many of the
// node's children it is on (zero makes the node one of its leaves).
type sgHolder struct {
	tenant int32
	kids   int32
	ts     int64
}

func newSGTree(r seeded) *sgTree {
	return &sgTree{root: sgNode{last: -1}, nodes: map[uint64]*sgNode{}, slot: map[string]int32{}, seeds: r}
}

// tenant returns name's slot, adding it (with size 0, as init_workers
// inserts "" for every worker) on first sight.
func (t *sgTree) tenant(name string) int32 {
	if s, ok := t.slot[name]; ok {
		return s
	}
	s := int32(len(t.size))
	t.slot[name] = s
	t.size = append(t.size, 0)
	t.salt = append(t.salt, uint64(t.seeds.rng.Uint64()))
	return s
}

func (n *sgNode) holder(tenant int32) *sgHolder {
	for i := range n.holders {
		if n.holders[i].tenant == tenant {
			return &n.holders[i]
		}
	}
	return nil
}

// match returns how many leading blocks of key the tree holds (for any
// tenant) and the deepest node matched (the root if none).
func (t *sgTree) match(key gateway.Key) (int, *sgNode) {
	n := &t.root
	for i, h := range key {
		c := t.nodes[h]
		if c == nil || c.parent != n {
			return i, n
		}
		n = c
	}
	return len(key), n
}

// pickTenant returns the tenant prefix_match reports for node n: the first
// in the node's map iteration order. That order is fixed for a node but
// arbitrary across nodes (a DashMap per node, each with its own hasher
// state); here it is a hash of the node and a per-tenant salt drawn from
// the run's seed. It returns -1 for a node no tenant holds.
func (t *sgTree) pickTenant(n *sgNode) int32 {
	best, bestH := int32(-1), uint64(0)
	for _, h := range n.holders {
		v := mix64(n.key ^ t.salt[h.tenant])
		if best < 0 || v < bestH {
			best, bestH = h.tenant, v
		}
	}
	return best
}

// cachedTenant is smg's pick for node n (kv_index string_tree.rs,
// match_prefix_with_counts): the node's cached last tenant while it still
// holds the node, else pickTenant's, which then becomes the cache. A node
// caches its creator; later inserts for other tenants leave it.
func (t *sgTree) cachedTenant(n *sgNode) int32 {
	if n.last >= 0 && n.holder(n.last) != nil {
		return n.last
	}
	s := t.pickTenant(n)
	if s >= 0 {
		n.last = s
	}
	return s
}

// touch stamps tenant's last access on n and every ancestor, as
// prefix_match does for the tenant it returns.
func (t *sgTree) touch(n *sgNode, tenant int32, now int64) {
	for ; n != nil; n = n.parent {
		if h := n.holder(tenant); h != nil {
			h.ts = now
		}
	}
}

// insert records key as sent to tenant at now. The last block of a prompt
// of tokens tokens covers what the full blocks before it leave.
func (t *sgTree) insert(key gateway.Key, tokens, bt int, tenant int32, now int64) {
	n := &t.root
	if h := n.holder(tenant); h != nil {
		h.ts = now
	} else {
		n.holders = append(n.holders, sgHolder{tenant: tenant, ts: now})
	}
	for i, k := range key {
		c := t.nodes[k]
		if c == nil || c.parent != n {
			size := bt
			if last := tokens - i*bt; i == len(key)-1 && last > 0 && last < bt {
				size = last
			}
			c = &sgNode{parent: n, key: k, tokens: int32(size), last: tenant}
			t.nodes[k] = c
			n.children++
		}
		if h := c.holder(tenant); h != nil {
			h.ts = now
		} else {
			c.holders = append(c.holders, sgHolder{tenant: tenant, ts: now})
			t.size[tenant] += int64(c.tokens)
			n.holder(tenant).kids++
		}
		n = c
	}
}

// evict removes, tenant by tenant, least recently used leaves until every
// tenant holds at most maxTokens (evict_tenant_by_size): leaves are popped
// oldest first, a tenant already within the bound keeps its own, and a
// parent left without children for the tenant becomes one of its leaves.
// Nodes no tenant holds are dropped.
func (t *sgTree) evict(maxTokens int64) {
	over := false
	for _, s := range t.size {
		over = over || s > maxTokens
	}
	if !over {
		return
	}
	t.pq = t.pq[:0]
	for _, n := range t.nodes {
		for _, h := range n.holders {
			if h.kids == 0 {
				t.pq = append(t.pq, evictEntry{ts: h.ts, tenant: h.tenant, node: n})
			}
		}
	}
	heap.Init(&t.pq)
	for t.pq.Len() > 0 {
		e := heap.Pop(&t.pq).(evictEntry)
		if t.size[e.tenant] <= maxTokens {
			continue
		}
		n := e.node
		h := n.holder(e.tenant)
		if h == nil || h.kids > 0 {
			continue
		}
		t.size[e.tenant] -= int64(n.tokens)
		*h = n.holders[len(n.holders)-1]
		n.holders = n.holders[:len(n.holders)-1]
		p := n.parent
		ph := p.holder(e.tenant)
		ph.kids--
		if len(n.holders) == 0 && n.children == 0 {
			delete(t.nodes, n.key)
			p.children--
		}
		if p != &t.root && ph.kids == 0 {
			heap.Push(&t.pq, evictEntry{ts: ph.ts, tenant: e.tenant, node: p})
		}
	}
}

// smallest returns the candidate whose tenant holds the fewest tokens
// (get_smallest_tenant). Ties go to the first in the tenant map's
// iteration order, fixed for a run but arbitrary: here the smallest salt.
func (t *sgTree) smallest(cands []gateway.Candidate) int {
	best := -1
	var bestSize int64
	var bestSalt uint64
	for i := range cands {
		s := t.tenant(cands[i].Name)
		if best < 0 || t.size[s] < bestSize || (t.size[s] == bestSize && t.salt[s] < bestSalt) {
			best, bestSize, bestSalt = i, t.size[s], t.salt[s]
		}
	}
	return best
}

type evictEntry struct {
	ts     int64
	tenant int32
	node   *sgNode
}

// evictHeap orders leaves by last access, oldest first; equal times (the
// blocks of one insertion share one) go by block hash, then tenant, so that
// runs are reproducible.
type evictHeap []evictEntry

func (h evictHeap) Len() int { return len(h) }
func (h evictHeap) Less(i, j int) bool {
	a, b := &h[i], &h[j]
	if a.ts != b.ts {
		return a.ts < b.ts
	}
	if a.node.key != b.node.key {
		return a.node.key < b.node.key
	}
	return a.tenant < b.tenant
}
func (h evictHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *evictHeap) Push(x any)   { *h = append(*h, x.(evictEntry)) }
func (h *evictHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// mix64 is the splitmix64 finaliser.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

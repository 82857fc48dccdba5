package sim

import "github.com/examlops/gateway/internal/hashtab"

// kvCache is one replica's KV cache, the simulation's truth about what a
// replica holds. It has cap block slots. Blocks are identified by their
// chained hash; a block in use by a running request is pinned (ref > 0);
// unpinned blocks stay cached on an LRU list and are evicted, least recently
// used first, when space is needed. Blocks a running request will compute
// (its uncached prompt and its answer) are reserved as an anonymous count
// from admission, so entries + reserved never exceed cap.
//
// Blocks are found through an exact table from chained hash to slot
// (hashtab.Map) placed by a secret: a crafted trace cannot make its
// probes long, and the secret decides nothing else. A block the table
// cannot place within its bounds (only someone who knows the secret can
// choose such blocks) is not cached: it stays reserved while its request
// runs, as a block still being computed.
//
// Per block it keeps 20 bytes in slices plus a table entry: memory is
// bounded by the capacity, never by the request count.
type kvCache struct {
	cap      int
	reserved int
	pinned   int
	idx      *hashtab.Map[int32] // block hash → slot, every slot in use
	hash     []uint64
	ref      []int32
	prev     []int32 // LRU links; -1 ends. head is least recently used.
	next     []int32
	head     int32
	tail     int32
	lruN     int
	free     int32 // free slots, linked through next
	evicted  []uint64
}

// newKVCache returns an empty cache of capacity blocks whose table places
// blocks under secret. The table has room for one block more than the
// capacity, which touch holds for a moment (it adds a new block before
// evicting the LRU one), so that it never grows.
func newKVCache(capacity int, secret uint64) *kvCache {
	return &kvCache{cap: capacity, idx: hashtab.New[int32](capacity+1, secret), head: -1, tail: -1, free: -1}
}

// blocks is the number of cached blocks, pinned or not.
func (c *kvCache) blocks() int { return c.pinned + c.lruN }

// used is the number of blocks held by running requests, pinned or
// reserved: what vLLM reports as KV-cache usage.
func (c *kvCache) used() int { return c.pinned + c.reserved }

// match returns how many leading blocks of key are cached, and writes
// their slots to slots[:m] (slots must have room for key).
func (c *kvCache) match(key []uint64, slots []int32) int {
	return c.idx.Prefix(key, slots[:len(key)])
}

// fits reports whether a request whose first m blocks of key are cached, at
// slots, can be admitted with extra more blocks of its own.
func (c *kvCache) fits(key []uint64, slots []int32, m, extra int) bool {
	need := len(key) - m + extra
	avail := c.cap - c.blocks() - c.reserved + c.lruN
	if avail < need {
		return false
	}
	for _, s := range slots[:m] {
		if c.ref[s] == 0 {
			avail--
		}
	}
	return avail >= need
}

// admit pins the first m blocks of key, at slots, and reserves the rest
// plus extra, evicting LRU blocks as needed; fits must have said yes.
// Evicted hashes are appended to c.evicted.
func (c *kvCache) admit(key []uint64, slots []int32, m, extra int) {
	for _, s := range slots[:m] {
		c.pin(s)
	}
	c.reserved += len(key) - m + extra
	for c.blocks()+c.reserved > c.cap {
		c.evictLRU()
	}
}

// commit turns the reservation of blocks m.. of key into cached, pinned
// blocks once their prefill is done, recording their slots; a block the
// table cannot place stays reserved, at slot -1.
func (c *kvCache) commit(key []uint64, slots []int32, m int) {
	for i, h := range key[m:] {
		s, had := c.get(h)
		if slots[m+i] = s; s < 0 {
			continue
		}
		c.reserved--
		if had {
			c.pin(s)
			continue
		}
		c.ref[s] = 1
		c.pinned++
	}
}

// release unpins the blocks at slots (all of the prompt, committed) and
// frees extra reserved blocks, caching the blocks of out (the answer)
// unpinned. Blocks are released leaves first, so the root of the prompt
// ends most recently used and LRU evicts leaves first. It appends to dst,
// in order, the blocks of out that are cached when it returns, and returns
// the extended slice: a block of out finding no room is skipped, and one
// inserted may be evicted again to make room for an earlier one. With
// extra >= len(out), as the engine reserves, every block of out fits.
func (c *kvCache) release(slots []int32, extra int, out, dst []uint64) []uint64 {
	c.reserved -= extra
	for i := len(out) - 1; i >= 0; i-- {
		h := out[i]
		if s, ok := c.idx.Get(h); ok {
			if c.ref[s] == 0 {
				c.unlink(s)
				c.pushMRU(s)
			}
			continue
		}
		for c.blocks()+c.reserved >= c.cap {
			if c.lruN == 0 {
				break
			}
			c.evictLRU()
		}
		if c.blocks()+c.reserved >= c.cap {
			continue
		}
		if s := c.alloc(h); s >= 0 {
			c.pushMRU(s)
		}
	}
	for i := len(slots) - 1; i >= 0; i-- {
		s := slots[i]
		if s < 0 { // left reserved by commit
			c.reserved--
			continue
		}
		c.ref[s]--
		if c.ref[s] == 0 {
			c.pinned--
			c.pushMRU(s)
		}
	}
	for _, h := range out {
		if c.idx.Has(h) {
			dst = append(dst, h)
		}
	}
	return dst
}

// touch is the pooled-LRU bound's use of the cache: blocks of key not
// cached are inserted, and all become most recently used, the root last.
// slots[:m] are where match found key[:m]; a block still at its slot is
// not looked up again (pass nil, 0 when there is no such match).
func (c *kvCache) touch(key []uint64, slots []int32, m int) {
	for i := len(key) - 1; i >= 0; i-- {
		h := key[i]
		if i < m {
			// A slot still in use for h holds it: every cached block has
			// one slot, and a freed slot has ref -1.
			if s := slots[i]; c.ref[s] >= 0 && c.hash[s] == h {
				c.unlink(s)
				c.pushMRU(s)
				continue
			}
		}
		s, had := c.get(h)
		switch {
		case had:
			c.unlink(s)
		case s < 0:
			continue
		case c.blocks() >= c.cap: // h, new, is not on the list yet
			c.evictLRU()
		}
		c.pushMRU(s)
	}
}

func (c *kvCache) pin(s int32) {
	if c.ref[s] == 0 {
		c.unlink(s)
		c.pinned++
	}
	c.ref[s]++
}

// alloc takes a free slot for block h, absent, and records it in the
// table; it returns -1, taking nothing, if the table cannot place h.
func (c *kvCache) alloc(h uint64) int32 {
	s, _ := c.get(h)
	return s
}

// get returns the slot of block h and true if h is cached; otherwise it
// takes a free slot for h, records it in the table and returns it and
// false, or -1 and false, taking nothing, if the table cannot place h.
// One probe of the table does both.
func (c *kvCache) get(h uint64) (int32, bool) {
	s := c.free
	if s < 0 {
		s = int32(len(c.hash))
	}
	cur, had, ok := c.idx.Add(h, s)
	switch {
	case had:
		return cur, true
	case !ok:
		return -1, false
	}
	if s == c.free {
		c.free = c.next[s]
	} else {
		c.hash = append(c.hash, 0)
		c.ref = append(c.ref, 0)
		c.prev = append(c.prev, -1)
		c.next = append(c.next, -1)
	}
	c.hash[s], c.ref[s], c.prev[s], c.next[s] = h, 0, -1, -1
	return s, false
}

func (c *kvCache) evictLRU() {
	s := c.head
	c.unlink(s)
	c.idx.Delete(c.hash[s])
	c.evicted = append(c.evicted, c.hash[s])
	c.ref[s] = -1 // free
	c.next[s] = c.free
	c.free = s
}

func (c *kvCache) unlink(s int32) {
	p, n := c.prev[s], c.next[s]
	if p >= 0 {
		c.next[p] = n
	} else {
		c.head = n
	}
	if n >= 0 {
		c.prev[n] = p
	} else {
		c.tail = p
	}
	c.prev[s], c.next[s] = -1, -1
	c.lruN--
}

func (c *kvCache) pushMRU(s int32) {
	c.prev[s], c.next[s] = c.tail, -1
	if c.tail >= 0 {
		c.next[c.tail] = s
	} else {
		c.head = s
	}
	c.tail = s
	c.lruN++
}

// check panics if the cache's bookkeeping is inconsistent or over capacity;
// a test hook.
func (c *kvCache) check() {
	if c.blocks()+c.reserved > c.cap {
		panic("sim: KV cache over capacity")
	}
	pinned, lru := 0, 0
	for h, s := range c.idx.All() {
		if s < 0 || int(s) >= len(c.hash) || c.hash[s] != h {
			panic("sim: block table points at the wrong slot")
		}
		if c.ref[s] < 0 {
			panic("sim: negative reference count")
		}
		if c.ref[s] > 0 {
			pinned++
		}
	}
	for s := c.head; s >= 0; s = c.next[s] {
		if c.ref[s] != 0 {
			panic("sim: pinned block on the LRU list")
		}
		lru++
	}
	if pinned != c.pinned || lru != c.lruN || pinned+lru != c.idx.Len() || c.reserved < 0 {
		panic("sim: KV cache counts inconsistent")
	}
}

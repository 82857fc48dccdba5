package sim

// kvCache is one replica's KV cache, the simulation's truth about what a
// replica holds. It has cap block slots. Blocks are identified by their
// chained hash; a block in use by a running request is pinned (ref > 0);
// unpinned blocks stay cached on an LRU list and are evicted, least recently
// used first, when space is needed. Blocks a running request will compute
// (its uncached prompt and its answer) are reserved as an anonymous count
// from admission, so entries + reserved never exceed cap.
//
// Per block it keeps 20 bytes in slices plus a map entry: memory is bounded
// by the capacity, never by the request count.
type kvCache struct {
	cap      int
	reserved int
	pinned   int
	idx      map[uint64]int32
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

func newKVCache(capacity int) *kvCache {
	return &kvCache{cap: capacity, idx: make(map[uint64]int32, min(capacity, 1<<16)), head: -1, tail: -1, free: -1}
}

func (c *kvCache) entries() int { return len(c.idx) }

// used is the number of blocks held by running requests, pinned or
// reserved: what vLLM reports as KV-cache usage.
func (c *kvCache) used() int { return c.pinned + c.reserved }

// match returns how many leading blocks of key are cached.
func (c *kvCache) match(key []uint64) int {
	for i, h := range key {
		if _, ok := c.idx[h]; !ok {
			return i
		}
	}
	return len(key)
}

// fits reports whether a request whose first m blocks of key are cached can
// be admitted with extra more blocks of its own.
func (c *kvCache) fits(key []uint64, m, extra int) bool {
	need := len(key) - m + extra
	avail := c.cap - len(c.idx) - c.reserved + c.lruN
	if avail < need {
		return false
	}
	for _, h := range key[:m] {
		if c.ref[c.idx[h]] == 0 {
			avail--
		}
	}
	return avail >= need
}

// admit pins the first m blocks of key and reserves the rest plus extra,
// evicting LRU blocks as needed; fits must have said yes. Evicted hashes are
// appended to c.evicted.
func (c *kvCache) admit(key []uint64, m, extra int) {
	for _, h := range key[:m] {
		c.pin(c.idx[h])
	}
	c.reserved += len(key) - m + extra
	for len(c.idx)+c.reserved > c.cap {
		c.evictLRU()
	}
}

// commit turns the reservation of blocks m.. of key into cached, pinned
// blocks once their prefill is done.
func (c *kvCache) commit(key []uint64, m int) {
	for _, h := range key[m:] {
		c.reserved--
		if s, ok := c.idx[h]; ok {
			c.pin(s)
			continue
		}
		s := c.alloc(h)
		c.ref[s] = 1
		c.pinned++
	}
}

// release unpins key (all of it committed) and frees extra reserved blocks,
// caching the blocks of out (the answer) unpinned. Blocks are released
// leaves first, so the root of the prompt ends most recently used and LRU
// evicts leaves first.
func (c *kvCache) release(key []uint64, extra int, out []uint64) {
	c.reserved -= extra
	for i := len(out) - 1; i >= 0; i-- {
		h := out[i]
		if s, ok := c.idx[h]; ok {
			if c.ref[s] == 0 {
				c.unlink(s)
				c.pushMRU(s)
			}
			continue
		}
		for len(c.idx)+c.reserved >= c.cap {
			if c.lruN == 0 {
				break
			}
			c.evictLRU()
		}
		if len(c.idx)+c.reserved >= c.cap {
			continue
		}
		c.pushMRU(c.alloc(h))
	}
	for i := len(key) - 1; i >= 0; i-- {
		s := c.idx[key[i]]
		c.ref[s]--
		if c.ref[s] == 0 {
			c.pinned--
			c.pushMRU(s)
		}
	}
}

// touch is the pooled-LRU bound's use of the cache: blocks of key not
// cached are inserted, and all become most recently used, the root last.
func (c *kvCache) touch(key []uint64) {
	for i := len(key) - 1; i >= 0; i-- {
		h := key[i]
		if s, ok := c.idx[h]; ok {
			c.unlink(s)
			c.pushMRU(s)
			continue
		}
		if len(c.idx) >= c.cap {
			c.evictLRU()
		}
		c.pushMRU(c.alloc(h))
	}
}

func (c *kvCache) pin(s int32) {
	if c.ref[s] == 0 {
		c.unlink(s)
		c.pinned++
	}
	c.ref[s]++
}

func (c *kvCache) alloc(h uint64) int32 {
	var s int32
	if c.free >= 0 {
		s = c.free
		c.free = c.next[s]
	} else {
		s = int32(len(c.hash))
		c.hash = append(c.hash, 0)
		c.ref = append(c.ref, 0)
		c.prev = append(c.prev, -1)
		c.next = append(c.next, -1)
	}
	c.hash[s], c.ref[s], c.prev[s], c.next[s] = h, 0, -1, -1
	c.idx[h] = s
	return s
}

func (c *kvCache) evictLRU() {
	s := c.head
	c.unlink(s)
	delete(c.idx, c.hash[s])
	c.evicted = append(c.evicted, c.hash[s])
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
	if len(c.idx)+c.reserved > c.cap {
		panic("sim: KV cache over capacity")
	}
	pinned, lru := 0, 0
	for _, s := range c.idx {
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
	if pinned != c.pinned || lru != c.lruN || pinned+lru != len(c.idx) || c.reserved < 0 {
		panic("sim: KV cache counts inconsistent")
	}
}

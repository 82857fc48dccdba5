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
	idx      blockTable
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
	return &kvCache{cap: capacity, idx: newBlockTable(capacity), head: -1, tail: -1, free: -1}
}

// used is the number of blocks held by running requests, pinned or
// reserved: what vLLM reports as KV-cache usage.
func (c *kvCache) used() int { return c.pinned + c.reserved }

// match returns how many leading blocks of key are cached, and writes
// their slots to slots[:m] (slots must have room for key).
func (c *kvCache) match(key []uint64, slots []int32) int {
	for i, h := range key {
		s, ok := c.idx.get(h)
		if !ok {
			return i
		}
		slots[i] = s
	}
	return len(key)
}

// fits reports whether a request whose first m blocks of key are cached, at
// slots, can be admitted with extra more blocks of its own.
func (c *kvCache) fits(key []uint64, slots []int32, m, extra int) bool {
	need := len(key) - m + extra
	avail := c.cap - c.idx.n - c.reserved + c.lruN
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
	for c.idx.n+c.reserved > c.cap {
		c.evictLRU()
	}
}

// commit turns the reservation of blocks m.. of key into cached, pinned
// blocks once their prefill is done, recording their slots.
func (c *kvCache) commit(key []uint64, slots []int32, m int) {
	for i, h := range key[m:] {
		c.reserved--
		if s, ok := c.idx.get(h); ok {
			c.pin(s)
			slots[m+i] = s
			continue
		}
		s := c.alloc(h)
		c.ref[s] = 1
		c.pinned++
		slots[m+i] = s
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
		if s, ok := c.idx.get(h); ok {
			if c.ref[s] == 0 {
				c.unlink(s)
				c.pushMRU(s)
			}
			continue
		}
		for c.idx.n+c.reserved >= c.cap {
			if c.lruN == 0 {
				break
			}
			c.evictLRU()
		}
		if c.idx.n+c.reserved >= c.cap {
			continue
		}
		c.pushMRU(c.alloc(h))
	}
	for i := len(slots) - 1; i >= 0; i-- {
		s := slots[i]
		c.ref[s]--
		if c.ref[s] == 0 {
			c.pinned--
			c.pushMRU(s)
		}
	}
	for _, h := range out {
		if _, ok := c.idx.get(h); ok {
			dst = append(dst, h)
		}
	}
	return dst
}

// touch is the pooled-LRU bound's use of the cache: blocks of key not
// cached are inserted, and all become most recently used, the root last.
func (c *kvCache) touch(key []uint64) {
	for i := len(key) - 1; i >= 0; i-- {
		h := key[i]
		if s, ok := c.idx.get(h); ok {
			c.unlink(s)
			c.pushMRU(s)
			continue
		}
		if c.idx.n >= c.cap {
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
	c.idx.put(h, s)
	return s
}

func (c *kvCache) evictLRU() {
	s := c.head
	c.unlink(s)
	c.idx.del(c.hash[s])
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
	if c.idx.n+c.reserved > c.cap {
		panic("sim: KV cache over capacity")
	}
	pinned, lru := 0, 0
	for i, s := range c.idx.vals {
		if s < 0 {
			continue
		}
		if c.hash[s] != c.idx.keys[i] {
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
	if pinned != c.pinned || lru != c.lruN || pinned+lru != c.idx.n || c.reserved < 0 {
		panic("sim: KV cache counts inconsistent")
	}
}

// blockTable maps block hashes to cache slots: open addressing with linear
// probing and backward-shift deletion, sized once for the cache's capacity
// at most half full. Block hashes are already well mixed.
type blockTable struct {
	keys  []uint64
	vals  []int32 // -1: empty
	mask  uint64
	shift uint
	n     int
}

func newBlockTable(capacity int) blockTable {
	size, shift := 16, uint(60)
	for size < 2*capacity {
		size, shift = size*2, shift-1
	}
	t := blockTable{keys: make([]uint64, size), vals: make([]int32, size), mask: uint64(size - 1), shift: shift}
	for i := range t.vals {
		t.vals[i] = -1
	}
	return t
}

func (t *blockTable) home(h uint64) uint64 { return (h * 0x9e3779b97f4a7c15) >> t.shift }

func (t *blockTable) get(h uint64) (int32, bool) {
	for i := t.home(h); ; i = (i + 1) & t.mask {
		v := t.vals[i]
		if v < 0 {
			return -1, false
		}
		if t.keys[i] == h {
			return v, true
		}
	}
}

// put inserts h, which must be absent.
func (t *blockTable) put(h uint64, v int32) {
	i := t.home(h)
	for t.vals[i] >= 0 {
		i = (i + 1) & t.mask
	}
	t.keys[i], t.vals[i] = h, v
	t.n++
}

// del removes h, which must be present.
func (t *blockTable) del(h uint64) {
	i := t.home(h)
	for t.keys[i] != h || t.vals[i] < 0 {
		i = (i + 1) & t.mask
	}
	for j := i; ; {
		j = (j + 1) & t.mask
		if t.vals[j] < 0 {
			break
		}
		k := t.home(t.keys[j])
		// Move j into the hole at i unless its home lies cyclically in (i, j].
		if (i <= j && (k <= i || k > j)) || (i > j && k <= i && k > j) {
			t.keys[i], t.vals[i] = t.keys[j], t.vals[j]
			i = j
		}
	}
	t.vals[i] = -1
	t.n--
}

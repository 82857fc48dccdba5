package gateway

import (
	"math/bits"
)

// The cache index records which replica holds which prefix blocks.
//
// Layout, chosen for a fast longest-prefix lookup across all replicas and a
// small, measured footprint (see BenchmarkIndexMemory):
//
//   - one open-addressing table of blocks (linear probing, Lemire's
//     multiply-shift from hash to slot, backward-shift deletion). A slot is
//     1+w consecutive words: the block's hash, then a bit set of the
//     replicas holding it, so a probe reads one cache line. A slot is empty
//     when its bit set is.
//   - per replica, a node per cached block (its hash and LRU links) and a
//     small open-addressing table from hash to node, so warming a block on
//     one replica costs O(1) however many replicas share it.
//
// A lookup walks the request's blocks once, ANDing holder bit sets, so it
// costs one table probe per matched block whatever the replica count.
// Blocks are warmed root-last, so the root of a chain is the most recently
// used and LRU evicts leaves first: a replica's cached set stays closed
// under prefixes, as an engine's own prefix cache is.
//
// The index is not safe for concurrent use; Gateway guards it with its mutex.

const (
	// MaxCacheBlocks is the largest Replica.CacheBlocks the index accepts.
	MaxCacheBlocks = 1<<31 - 2
	// MaxReplicas is the largest number of replicas one Gateway holds.
	MaxReplicas = 4096
	nilRef      = ^uint32(0)
	maxLoad     = 0.85 // of the block table
	repLoad     = 0.7  // of a replica's table: cheap slots, short probe runs
)

type index struct {
	tab   []uint64 // slots of 1+w words: hash, then holder bit set
	w     int      // words per bit set
	n     int      // slots
	used  int      // occupied slots
	limit int      // the table never grows past this many slots

	reps   []*repCache // by replica slot; nil where free
	active []uint64    // w words: replica slots in use
	alive  []uint64    // scratch for match
	sink   uint64      // keeps the prefetching loads of match and store
	moves  uint64      // counts deletions and rehashes, which move slots
}

func newIndex() *index {
	ix := &index{w: 1, active: make([]uint64, 1), alive: make([]uint64, 1)}
	ix.resize(16)
	return ix
}

// tableSlots is how many slots hold n entries within the load factor.
func tableSlots(n int) int { return int(float64(n)/maxLoad) + 1 }

// addReplica reserves a slot for a replica caching up to capacity blocks.
func (ix *index) addReplica(capacity int) uint32 {
	s := -1
	for i, r := range ix.reps {
		if r == nil {
			s = i
			break
		}
	}
	if s < 0 {
		s = len(ix.reps)
		ix.reps = append(ix.reps, nil)
	}
	if need := (len(ix.reps) + 63) / 64; need > ix.w {
		ix.rebuild(ix.n, need)
	}
	ix.reps[s] = newRepCache(uint32(s), capacity)
	ix.active[s/64] |= 1 << (s % 64)
	ix.limit += tableSlots(capacity)
	return uint32(s)
}

// removeReplica drops a replica's blocks and frees its slot.
func (ix *index) removeReplica(slot uint32) {
	r := ix.reps[slot]
	ix.clear(slot)
	ix.limit -= tableSlots(r.cap)
	ix.reps[slot] = nil
	ix.active[slot/64] &^= 1 << (slot % 64)
}

// clear drops every block a replica holds.
func (ix *index) clear(slot uint32) {
	r := ix.reps[slot]
	for r.lru != nilRef {
		ix.evict(r, r.lru)
	}
	*r = *newRepCache(r.slot, r.cap)
}

// cached reports how many blocks a replica holds.
func (ix *index) cached(slot uint32) int { return ix.reps[slot].n }

func (ix *index) home(h uint64) int {
	hi, _ := bits.Mul64(h, uint64(ix.n))
	return int(hi)
}

func (ix *index) empty(i int) bool {
	for _, b := range ix.tab[i*(1+ix.w)+1 : (i+1)*(1+ix.w)] {
		if b != 0 {
			return false
		}
	}
	return true
}

// find returns the table slot of block h, or -1.
func (ix *index) find(h uint64) int {
	if ix.w == 1 { // the common case, up to 64 replicas: one word of holders
		for i := ix.home(h); ; {
			k, holders := ix.tab[2*i], ix.tab[2*i+1]
			if holders == 0 {
				return -1
			}
			if k == h {
				return i
			}
			if i++; i == ix.n {
				i = 0
			}
		}
	}
	s := 1 + ix.w
	for i := ix.home(h); ; {
		if ix.empty(i) {
			return -1
		}
		if ix.tab[i*s] == h {
			return i
		}
		if i++; i == ix.n {
			i = 0
		}
	}
}

// insert adds block h, which must be absent, and returns its slot. The
// caller sets a holder bit before the next table operation.
func (ix *index) insert(h uint64) int {
	if float64(ix.used+1) > maxLoad*float64(ix.n) {
		ix.resize(max(16, min(2*ix.n, ix.limit)))
	}
	i := ix.home(h)
	for !ix.empty(i) {
		if i++; i == ix.n {
			i = 0
		}
	}
	ix.tab[i*(1+ix.w)] = h
	ix.used++
	return i
}

// resize rehashes the table into n slots (at least enough for its blocks).
func (ix *index) resize(n int) { ix.rebuild(n, ix.w) }

// rebuild rehashes the table into n slots of w-word bit sets.
func (ix *index) rebuild(n, w int) {
	n = max(n, tableSlots(ix.used+1))
	ix.moves++
	old, oldS, oldN := ix.tab, 1+ix.w, ix.n
	ix.tab, ix.n = make([]uint64, n*(1+w)), n
	oldW := ix.w
	ix.w = w
	for j := range oldN {
		src := old[j*oldS : (j+1)*oldS]
		occupied := false
		for _, b := range src[1:] {
			occupied = occupied || b != 0
		}
		if !occupied {
			continue
		}
		i := ix.home(src[0])
		for !ix.empty(i) {
			if i++; i == n {
				i = 0
			}
		}
		copy(ix.tab[i*(1+w):], src[:1+oldW])
	}
	if w != oldW {
		na := make([]uint64, w)
		copy(na, ix.active)
		ix.active, ix.alive = na, make([]uint64, w)
	}
}

// del removes table slot i, shifting later entries of its probe run back.
func (ix *index) del(i int) {
	s := 1 + ix.w
	j := i
	for {
		if j++; j == ix.n {
			j = 0
		}
		if ix.empty(j) {
			break
		}
		k := ix.home(ix.tab[j*s])
		// Move j into the hole at i unless its home lies cyclically in (i, j].
		if (i <= j && (k <= i || k > j)) || (i > j && k <= i && k > j) {
			copy(ix.tab[i*s:(i+1)*s], ix.tab[j*s:(j+1)*s])
			i = j
		}
	}
	clear(ix.tab[i*s : (i+1)*s])
	ix.used--
	ix.moves++
}

// match writes, for every active replica slot s, the number of leading
// blocks of key that replica holds into out[s], and returns the longest.
func (ix *index) match(key Key, out []int32) int {
	alive := ix.alive
	copy(alive, ix.active)
	s := 1 + ix.w
	// Touch every block's home slot first: the loads are independent, so
	// the processor overlaps their cache misses instead of taking them one
	// probe at a time in the walk below.
	var sink uint64
	for _, h := range key {
		sink += ix.tab[ix.home(h)*s]
	}
	ix.sink = sink
	if ix.w == 1 { // up to 64 replicas: one word, no inner loop
		a := alive[0]
		for i, h := range key {
			var nb uint64
			if pos := ix.find(h); pos >= 0 {
				nb = a & ix.tab[2*pos+1]
			}
			for d := a &^ nb; d != 0; d &= d - 1 {
				out[bits.TrailingZeros64(d)] = int32(i)
			}
			if a = nb; a == 0 {
				return i
			}
		}
		for ; a != 0; a &= a - 1 {
			out[bits.TrailingZeros64(a)] = int32(len(key))
		}
		return len(key)
	}
	for i, h := range key {
		pos := ix.find(h)
		any := false
		for wi, a := range alive {
			if a == 0 {
				continue
			}
			var nb uint64
			if pos >= 0 {
				nb = a & ix.tab[pos*s+1+wi]
			}
			for d := a &^ nb; d != 0; d &= d - 1 {
				out[wi*64+bits.TrailingZeros64(d)] = int32(i)
			}
			alive[wi] = nb
			any = any || nb != 0
		}
		if !any {
			return i
		}
	}
	for wi, a := range alive {
		for ; a != 0; a &= a - 1 {
			out[wi*64+bits.TrailingZeros64(a)] = int32(len(key))
		}
	}
	return len(key)
}

// store records that replica slot holds every block of key, making them
// its most recently used, the root last, and evicting least recently used
// blocks beyond its capacity.
func (ix *index) store(slot uint32, key Key) { ix.storeMatched(slot, key, len(key)) }

// storeMatched is store for a key of which the replica holds about the
// first matched blocks, as match found. Those it looks up in the replica's
// table to refresh; the rest it expects to be absent, so it asks the block
// table first, whose probe the insertion needs anyway, and so skips a
// fruitless probe of the replica's table for every block of a new suffix.
func (ix *index) storeMatched(slot uint32, key Key, matched int) {
	r := ix.reps[slot]
	if r.cap == 0 {
		return
	}
	// The blocks that already lead the LRU list in key order (the shared
	// system prompt of consecutive requests, or a repeated prompt) stay
	// where they are, and the rest go right behind them: the same order as
	// moving every block to the front, for a fraction of the probes. The
	// replica must hold more than the key, so that no eviction reaches
	// the blocks in front or leaves the rest of the list empty, which
	// would make it evict other blocks than a full warm-up would. (A raw
	// Key that repeats a block of that leading run may end in another
	// order; chained keys never repeat a block.)
	front, run := nilRef, 0
	if r.cap > len(key) {
		for l := r.mru; l != nilRef && run < matched && r.nodes[l].hash == key[run]; l = r.nodes[l].next {
			front, run = l, run+1
		}
	}
	if len(r.tab) > 0 && run < matched { // overlap the cache misses, as in match
		var sink uint32
		for _, h := range key[run:matched] {
			if v := r.tab[r.home(h)]; v != 0 {
				sink += r.nodes[v-1].prev
			}
		}
		ix.sink += uint64(sink)
	}
	for i := len(key) - 1; i >= run; i-- {
		h := key[i]
		pos := -1
		if i < matched {
			if l := r.lookup(h); l != nilRef {
				r.moveBehind(front, l)
				continue
			}
		} else if pos = ix.find(h); pos >= 0 && ix.holds(pos, slot) {
			r.moveBehind(front, r.lookup(h)) // held after all (a key repeating a block)
			continue
		}
		moves := ix.moves
		l := ix.alloc(r)
		if pos < 0 || ix.moves != moves { // eviction may have moved table slots
			pos = ix.find(h)
		}
		if pos < 0 {
			pos = ix.insert(h)
		}
		ix.tab[pos*(1+ix.w)+1+int(slot/64)] |= 1 << (slot % 64)
		r.nodes[l].hash = h
		r.add(h, l)
		r.linkBehind(front, l)
	}
}

// remove drops the blocks of key that replica slot holds, wherever they are.
func (ix *index) remove(slot uint32, key Key) {
	r := ix.reps[slot]
	for _, h := range key {
		if l := r.lookup(h); l != nilRef {
			ix.evict(r, l)
		}
	}
}

// alloc returns a free node of r, evicting its LRU block when full.
func (ix *index) alloc(r *repCache) uint32 {
	if r.free != nilRef {
		l := r.free
		r.free = r.nodes[l].next
		r.n++
		return l
	}
	if len(r.nodes) < r.cap {
		r.nodes = append(r.nodes, repNode{prev: nilRef, next: nilRef})
		r.n++
		return uint32(len(r.nodes) - 1)
	}
	l := r.lru
	ix.evict(r, l)
	r.free = r.nodes[l].next
	r.n++
	return l
}

// evict removes node l of r from the block table and its LRU list and
// frees it.
func (ix *index) evict(r *repCache, l uint32) {
	h := r.nodes[l].hash
	pos := ix.find(h)
	ix.tab[pos*(1+ix.w)+1+int(r.slot/64)] &^= 1 << (r.slot % 64)
	if ix.empty(pos) {
		ix.del(pos)
	}
	r.drop(h)
	r.unlink(l)
	r.nodes[l].next = r.free
	r.free = l
	r.n--
}

// repCache is one replica's cached blocks: nodes in LRU order and a table
// from block hash to node.
type repCache struct {
	slot  uint32
	cap   int
	nodes []repNode
	mru   uint32
	lru   uint32
	n     int    // nodes in use
	free  uint32 // free list through next

	tab  []uint32 // node+1 per slot; 0 is empty
	used int
}

// repNode is one cached block: its hash and LRU links (nilRef ends), in
// one 16-byte record so that touching a block reads one cache line.
type repNode struct {
	hash       uint64
	prev, next uint32
}

func newRepCache(slot uint32, capacity int) *repCache {
	return &repCache{slot: slot, cap: capacity, mru: nilRef, lru: nilRef, free: nilRef}
}

func (r *repCache) home(h uint64) int {
	hi, _ := bits.Mul64(h, uint64(len(r.tab)))
	return int(hi)
}

// lookup returns the node holding block h, or nilRef.
func (r *repCache) lookup(h uint64) uint32 {
	if len(r.tab) == 0 {
		return nilRef
	}
	for i := r.home(h); ; {
		v := r.tab[i]
		if v == 0 {
			return nilRef
		}
		if r.nodes[v-1].hash == h {
			return v - 1
		}
		if i++; i == len(r.tab) {
			i = 0
		}
	}
}

// add records that node l holds block h, which must be absent.
func (r *repCache) add(h uint64, l uint32) {
	if float64(r.used+1) > repLoad*float64(len(r.tab)) {
		r.grow()
	}
	i := r.home(h)
	for r.tab[i] != 0 {
		if i++; i == len(r.tab) {
			i = 0
		}
	}
	r.tab[i] = l + 1
	r.used++
}

func (r *repCache) grow() {
	n := max(16, min(2*len(r.tab), int(float64(r.cap)/repLoad)+1), int(float64(r.used+1)/repLoad)+1)
	old := r.tab
	r.tab = make([]uint32, n)
	for _, v := range old {
		if v == 0 {
			continue
		}
		i := r.home(r.nodes[v-1].hash)
		for r.tab[i] != 0 {
			if i++; i == n {
				i = 0
			}
		}
		r.tab[i] = v
	}
}

// drop forgets block h, which must be present.
func (r *repCache) drop(h uint64) {
	n := len(r.tab)
	i := r.home(h)
	for r.nodes[r.tab[i]-1].hash != h {
		if i++; i == n {
			i = 0
		}
	}
	for j := i; ; {
		if j++; j == n {
			j = 0
		}
		if r.tab[j] == 0 {
			break
		}
		k := r.home(r.nodes[r.tab[j]-1].hash)
		if (i <= j && (k <= i || k > j)) || (i > j && k <= i && k > j) {
			r.tab[i] = r.tab[j]
			i = j
		}
	}
	r.tab[i] = 0
	r.used--
}

func (r *repCache) unlink(l uint32) {
	p, n := r.nodes[l].prev, r.nodes[l].next
	if p != nilRef {
		r.nodes[p].next = n
	} else {
		r.mru = n
	}
	if n != nilRef {
		r.nodes[n].prev = p
	} else {
		r.lru = p
	}
}

func (r *repCache) pushFront(l uint32) {
	r.nodes[l].prev = nilRef
	r.nodes[l].next = r.mru
	if r.mru != nilRef {
		r.nodes[r.mru].prev = l
	}
	r.mru = l
	if r.lru == nilRef {
		r.lru = l
	}
}

// linkBehind links node l, which is not in the list, right behind node
// front, or at the front if front is nilRef.
func (r *repCache) linkBehind(front, l uint32) {
	if front == nilRef {
		r.pushFront(l)
		return
	}
	n := r.nodes[front].next
	r.nodes[l].prev, r.nodes[l].next = front, n
	r.nodes[front].next = l
	if n != nilRef {
		r.nodes[n].prev = l
	} else {
		r.lru = l
	}
}

// moveBehind moves node l right behind node front, or to the front if
// front is nilRef. Moving front itself leaves it where it is.
func (r *repCache) moveBehind(front, l uint32) {
	if l == front || (front == nilRef && r.mru == l) || (front != nilRef && r.nodes[front].next == l) {
		return
	}
	r.unlink(l)
	r.linkBehind(front, l)
}

// holds reports whether table slot pos records replica slot as a holder.
func (ix *index) holds(pos int, slot uint32) bool {
	return ix.tab[pos*(1+ix.w)+1+int(slot/64)]&(1<<(slot%64)) != 0
}

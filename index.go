package gateway

import (
	"math/bits"
)

// The cache index records which replica holds which prefix blocks.
//
// Layout, chosen for a fast longest-prefix lookup across all replicas and a
// small, measured footprint (see BenchmarkIndexMemory):
//
//   - one open-addressing table keyed by block hash (linear probing,
//     Lemire's multiply-shift to map a hash to a slot, backward-shift
//     deletion). Each slot holds the block's hash, the head of its holder
//     list and a bit set of the replicas that hold it (w words).
//   - per replica, a node per cached block: its hash, LRU links and the next
//     node of the same block's holder list. A node reference packs the
//     replica's slot in the top bits and the node's local number below.
//
// A lookup walks the request's blocks once, ANDing holder bit sets, so it
// costs one table probe per matched block whatever the replica count.
// Blocks are warmed root-last, so the root of a chain is the most recently
// used and LRU evicts leaves first: a replica's cached set stays closed
// under prefixes, as an engine's own prefix cache is.
//
// The index is not safe for concurrent use; Gateway guards it with its mutex.

const (
	localBits = 22
	// MaxCacheBlocks is the largest Replica.CacheBlocks the index accepts.
	MaxCacheBlocks = 1<<localBits - 1
	// MaxReplicas is the largest number of replicas one Gateway holds.
	MaxReplicas = 1 << (32 - localBits)
	nilRef      = ^uint32(0)
	maxLoad     = 0.85
)

type index struct {
	keys  []uint64 // block hash per table slot
	heads []uint32 // first holder node per slot; nilRef marks an empty slot
	bits  []uint64 // w words per slot: which replica slots hold the block
	w     int      // words per bit set
	used  int      // occupied table slots
	limit int      // table never grows past this many slots (capacity bound)

	reps   []*repCache // by replica slot; nil where free
	active []uint64    // w words: replica slots in use
	alive  []uint64    // scratch for match

	// found holds the table slots of the blocks the last match walked,
	// valid while moves still equals foundAt: deletions and resizes move
	// slots.
	found   []int32
	moves   uint64
	foundAt uint64
}

type repCache struct {
	slot  uint32
	cap   int
	hash  []uint64 // per node
	prev  []uint32 // LRU links (local numbers); nilRef ends
	next  []uint32
	nextH []uint32 // next node (global ref) of the same block's holder list
	mru   uint32
	lru   uint32
	n     int    // nodes in use
	free  uint32 // free list through next
}

func newIndex() *index {
	ix := &index{w: 1}
	ix.active = make([]uint64, 1)
	ix.alive = make([]uint64, 1)
	ix.resize(16)
	return ix
}

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
		ix.widen(need)
	}
	ix.reps[s] = &repCache{slot: uint32(s), cap: capacity, mru: nilRef, lru: nilRef, free: nilRef}
	ix.active[s/64] |= 1 << (s % 64)
	ix.limit += int(float64(capacity)/maxLoad) + 1
	return uint32(s)
}

// removeReplica drops a replica's blocks and frees its slot.
func (ix *index) removeReplica(slot uint32) {
	r := ix.reps[slot]
	ix.clear(slot)
	ix.limit -= int(float64(r.cap)/maxLoad) + 1
	ix.reps[slot] = nil
	ix.active[slot/64] &^= 1 << (slot % 64)
}

// clear drops every block a replica holds.
func (ix *index) clear(slot uint32) {
	r := ix.reps[slot]
	for r.lru != nilRef {
		ix.evict(r, r.lru)
	}
	r.hash, r.prev, r.next, r.nextH = nil, nil, nil, nil
	r.n, r.free = 0, nilRef
}

// cached reports how many blocks a replica holds.
func (ix *index) cached(slot uint32) int { return ix.reps[slot].n }

// widen grows every bit set to w words.
func (ix *index) widen(w int) {
	nb := make([]uint64, len(ix.heads)*w)
	for i := range ix.heads {
		copy(nb[i*w:], ix.bits[i*ix.w:(i+1)*ix.w])
	}
	ix.bits = nb
	na := make([]uint64, w)
	copy(na, ix.active)
	ix.active = na
	ix.alive = make([]uint64, w)
	ix.w = w
}

func (ix *index) home(h uint64) int {
	hi, _ := bits.Mul64(h, uint64(len(ix.heads)))
	return int(hi)
}

// find returns the table slot of block h, or -1.
func (ix *index) find(h uint64) int {
	n := len(ix.heads)
	for i := ix.home(h); ; {
		if ix.heads[i] == nilRef {
			return -1
		}
		if ix.keys[i] == h {
			return i
		}
		if i++; i == n {
			i = 0
		}
	}
}

// insert adds block h, which must be absent, and returns its slot.
func (ix *index) insert(h uint64) int {
	if float64(ix.used+1) > maxLoad*float64(len(ix.heads)) {
		ix.resize(max(16, min(2*len(ix.heads), ix.limit)))
	}
	n := len(ix.heads)
	i := ix.home(h)
	for ix.heads[i] != nilRef {
		if i++; i == n {
			i = 0
		}
	}
	ix.keys[i] = h
	ix.used++
	return i
}

// resize rehashes the table into n slots (at least enough for its blocks).
func (ix *index) resize(n int) {
	n = max(n, int(float64(ix.used+1)/maxLoad)+1)
	ix.moves++
	oldK, oldH, oldB := ix.keys, ix.heads, ix.bits
	ix.keys = make([]uint64, n)
	ix.heads = make([]uint32, n)
	ix.bits = make([]uint64, n*ix.w)
	for i := range ix.heads {
		ix.heads[i] = nilRef
	}
	for j, hd := range oldH {
		if hd == nilRef {
			continue
		}
		i := ix.home(oldK[j])
		for ix.heads[i] != nilRef {
			if i++; i == n {
				i = 0
			}
		}
		ix.keys[i], ix.heads[i] = oldK[j], hd
		copy(ix.bits[i*ix.w:(i+1)*ix.w], oldB[j*ix.w:(j+1)*ix.w])
	}
}

// del removes table slot i, shifting later entries of its probe run back.
func (ix *index) del(i int) {
	n := len(ix.heads)
	w := ix.w
	j := i
	for {
		if j++; j == n {
			j = 0
		}
		if ix.heads[j] == nilRef {
			break
		}
		k := ix.home(ix.keys[j])
		// Move j into the hole at i unless its home lies cyclically in (i, j].
		if (i <= j && (k <= i || k > j)) || (i > j && k <= i && k > j) {
			ix.keys[i], ix.heads[i] = ix.keys[j], ix.heads[j]
			copy(ix.bits[i*w:(i+1)*w], ix.bits[j*w:(j+1)*w])
			i = j
		}
	}
	ix.heads[i] = nilRef
	clear(ix.bits[i*w : (i+1)*w])
	ix.used--
	ix.moves++
}

func (ix *index) holds(pos int, slot uint32) bool {
	return ix.bits[pos*ix.w+int(slot/64)]&(1<<(slot%64)) != 0
}

// match writes, for every active replica slot s, the number of leading
// blocks of key that replica holds into out[s], and returns the longest.
func (ix *index) match(key Key, out []int32) int {
	alive := ix.alive
	copy(alive, ix.active)
	w := ix.w
	ix.found, ix.foundAt = ix.found[:0], ix.moves
	for i, h := range key {
		pos := ix.find(h)
		ix.found = append(ix.found, int32(pos))
		any := false
		for wi, a := range alive {
			if a == 0 {
				continue
			}
			var nb uint64
			if pos >= 0 {
				nb = a & ix.bits[pos*w+wi]
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
func (ix *index) store(slot uint32, key Key) {
	ix.storeMatched(slot, key, 0)
}

// storeMatched is store for a key whose first matched blocks the replica
// holds, as the last call to match found: those it refreshes without
// probing the table again.
func (ix *index) storeMatched(slot uint32, key Key, matched int) {
	r := ix.reps[slot]
	if r.cap == 0 {
		return
	}
	for i := len(key) - 1; i >= matched; i-- {
		h := key[i]
		if pos := ix.find(h); pos >= 0 && ix.holds(pos, slot) {
			r.toFront(ix.node(pos, slot))
			continue
		}
		local := ix.alloc(r)
		pos := ix.find(h) // eviction may have moved table slots
		if pos < 0 {
			pos = ix.insert(h)
		}
		r.hash[local] = h
		r.nextH[local] = ix.heads[pos]
		ix.heads[pos] = slot<<localBits | local
		ix.bits[pos*ix.w+int(slot/64)] |= 1 << (slot % 64)
		r.pushFront(local)
	}
	for i := matched - 1; i >= 0; i-- {
		pos := int(ix.found[i])
		if ix.moves != ix.foundAt {
			pos = ix.find(key[i])
		}
		r.toFront(ix.node(pos, slot))
	}
}

// remove drops the blocks of key that replica slot holds, wherever they are.
func (ix *index) remove(slot uint32, key Key) {
	r := ix.reps[slot]
	for _, h := range key {
		if pos := ix.find(h); pos >= 0 && ix.holds(pos, slot) {
			ix.evict(r, ix.node(pos, slot))
		}
	}
}

// node returns the local number of replica slot's node for table slot pos,
// which it must hold.
func (ix *index) node(pos int, slot uint32) uint32 {
	for ref := ix.heads[pos]; ; {
		rs, local := ref>>localBits, ref&MaxCacheBlocks
		if rs == slot {
			return local
		}
		ref = ix.reps[rs].nextH[local]
	}
}

// alloc returns a free node of r, evicting its LRU block when full.
func (ix *index) alloc(r *repCache) uint32 {
	if r.free != nilRef {
		l := r.free
		r.free = r.next[l]
		r.n++
		return l
	}
	if len(r.hash) < r.cap {
		r.hash = append(r.hash, 0)
		r.prev = append(r.prev, nilRef)
		r.next = append(r.next, nilRef)
		r.nextH = append(r.nextH, nilRef)
		r.n++
		return uint32(len(r.hash) - 1)
	}
	l := r.lru
	ix.evict(r, l)
	r.free = r.next[l]
	r.n++
	return l
}

// evict removes node l of r from its block and its LRU list and frees it.
func (ix *index) evict(r *repCache, l uint32) {
	pos := ix.find(r.hash[l])
	ref := r.slot<<localBits | l
	if ix.heads[pos] == ref {
		ix.heads[pos] = r.nextH[l]
	} else {
		p := ix.heads[pos]
		for {
			pr := ix.reps[p>>localBits]
			nx := pr.nextH[p&MaxCacheBlocks]
			if nx == ref {
				pr.nextH[p&MaxCacheBlocks] = r.nextH[l]
				break
			}
			p = nx
		}
	}
	ix.bits[pos*ix.w+int(r.slot/64)] &^= 1 << (r.slot % 64)
	if ix.heads[pos] == nilRef {
		ix.del(pos)
	}
	r.unlink(l)
	r.next[l] = r.free
	r.free = l
	r.n--
}

func (r *repCache) unlink(l uint32) {
	p, n := r.prev[l], r.next[l]
	if p != nilRef {
		r.next[p] = n
	} else {
		r.mru = n
	}
	if n != nilRef {
		r.prev[n] = p
	} else {
		r.lru = p
	}
}

func (r *repCache) pushFront(l uint32) {
	r.prev[l] = nilRef
	r.next[l] = r.mru
	if r.mru != nilRef {
		r.prev[r.mru] = l
	}
	r.mru = l
	if r.lru == nilRef {
		r.lru = l
	}
}

func (r *repCache) toFront(l uint32) {
	if r.mru == l {
		return
	}
	r.unlink(l)
	r.pushFront(l)
}

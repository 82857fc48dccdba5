package gateway

import (
	"math/bits"
	"math/rand/v2"

	"github.com/examlops/gateway/internal/hashtab"
)

// The cache index records which replica holds which prefix blocks.
//
// Layout, chosen for a fast longest-prefix lookup across all replicas and a
// small, measured footprint (see BenchmarkIndexMemory):
//
//   - one open-addressing table of blocks (linear probing with runs kept
//     sorted, Lemire's multiply-shift from hash to home slot,
//     backward-shift deletion). A slot is 1+w consecutive words: the
//     block's placed hash (below), then a bit set of the replicas holding
//     it, so a probe reads one cache line. A slot is empty when its bit set
//     is.
//   - per replica, a node per cached block (its placed hash and LRU links)
//     and a small table of the same kind from hash to node, so warming a
//     block on one replica costs O(1) however many replicas share it.
//
// The tables are ordered hash tables (Amble and Knuth 1974), probed,
// filled and emptied by package internal/hashtab, which the simulator's
// tables share: the homes of n slots lie in 0..n-1, maxProbe spare slots
// follow so that no run wraps around, and, since the home slot grows with
// the hash, keeping each run sorted by hash keeps the occupied slots in
// ascending order of hash and of home: Robin Hood placement, with ties
// broken by hash. A probe stops at the first slot whose hash is not below
// the one sought, so a lookup for an absent block ends about as soon as
// one for a present block, with one comparison per slot.
//
// A lookup walks the request's blocks once, ANDing holder bit sets, so it
// costs one table probe per matched block whatever the replica count.
// Blocks are warmed root-last, so the root of a chain is the most recently
// used and LRU evicts leaves first: a replica's cached set stays closed
// under prefixes, as an engine's own prefix cache is.
//
// Hash flooding. Block hashes are public (anyone can compute the Key of a
// prompt, and the API accepts raw Keys), so a table placing blocks by them
// could be fed blocks that all home into one cluster, making every probe
// walk it. The index therefore places a block by its placed hash, a keyed
// permutation of the block hash (mix) under a secret drawn from the
// runtime's random source when the index is created: nobody outside the
// process can predict which blocks collide. Being a permutation, it keeps
// distinct blocks distinct, so the index behaves exactly as if it were
// keyed by the block hashes themselves; the secret decides where a block
// sits, never which replica a request is sent to.
//
// The work of one operation is bounded besides, whatever the keys:
//
//   - a lookup probes at most maxProbe (128) slots per block, in the block
//     table and in a replica's table: no block sits maxProbe or more slots
//     past its home slot;
//   - an insertion scans and shifts at most maxShift (4,096) slots;
//   - a block that cannot be placed within these bounds is left out of the
//     index (counted in dropped), as if it were not cached: the request
//     is still routed, with a shorter match there.
//
// With the secret in place the bounds are far from reached: in a block
// table of 1.2M slots filled to its load factor (0.85) with random blocks,
// the largest distance from home is 40 slots and the longest run of
// occupied slots 583; in a replica's table (load 0.7), 16 and 184
// (TestPlacementStatistics). Both grow only logarithmically with the table,
// so a block is left out only if someone can predict the placement, that
// is, knows the secret. Deletion shifts back the rest of a run (to its
// end or to a block at its home): as long as the runs random placement
// makes, but not capped.
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
	// maxProbe bounds a block's distance from its home slot, and so the
	// slots a lookup probes, in every table of the index.
	maxProbe = hashtab.MaxProbe
	// maxShift bounds the slots an insertion scans for a free slot and
	// shifts to make room.
	maxShift = hashtab.MaxShift
)

type index struct {
	tab   []uint64 // n+maxProbe slots of 1+w words: placed hash, then holder bit set
	w     int      // words per bit set
	n     int      // home slots
	used  int      // occupied slots
	limit int      // the table never grows past this many home slots

	reps    []*repCache // by replica slot; nil where free
	active  []uint64    // w words: replica slots in use
	alive   []uint64    // scratch for match
	sink    uint64      // keeps the prefetching loads of mixKey and store
	moves   uint64      // counts deletions, shifting insertions and rehashes, which move slots
	dropped uint64      // blocks left out for exceeding maxProbe or maxShift
	seed    seed        // the secret of placement
	mk      Key         // scratch for mixKey
}

// seed is an index's secret, a hashtab.Seed: mix(h) = k2·f(k1·(h ⊕ k0))
// with f(x) = x ⊕ (x >> 32). k1 and k2 are odd, so every step, and mix, is
// a permutation of the 64-bit values; the tables use the top bits of the
// result, which depend on every bit of h.
type seed struct{ k0, k1, k2 uint64 }

// newSeed expands a secret into a seed (hashtab.NewSeed).
func newSeed(secret uint64) seed {
	s := hashtab.NewSeed(secret)
	return seed{s.K0, s.K1, s.K2}
}

// mix returns the placed hash of block hash h (hashtab.Seed.Mix).
func (sd *seed) mix(h uint64) uint64 {
	return hashtab.Seed{K0: sd.k0, K1: sd.k1, K2: sd.k2}.Mix(h)
}

// newIndex returns an empty index placing blocks under a secret drawn
// from the runtime's random source, which the operating system seeds per
// process.
func newIndex() *index { return newIndexSecret(rand.Uint64()) }

// newIndexSecret returns an empty index placing blocks under secret.
func newIndexSecret(secret uint64) *index {
	ix := &index{w: 1, active: make([]uint64, 1), alive: make([]uint64, 1), seed: newSeed(secret)}
	ix.resize(16)
	return ix
}

// mixKey returns the placed hashes of key's blocks, the form every other
// method takes keys in, in a scratch slice that the next call reuses.
//
// It also touches every block's home slot: the loads are independent, so
// the processor overlaps their cache misses instead of taking them one
// probe at a time when match or store walks the key.
func (ix *index) mixKey(key Key) Key {
	if cap(ix.mk) < len(key) {
		ix.mk = make(Key, len(key), max(len(key), 2*cap(ix.mk)))
	}
	mk := ix.mk[:len(key)]
	s := 1 + ix.w
	var sink uint64
	for i, h := range key {
		m := ix.seed.mix(h)
		mk[i] = m
		sink += ix.tab[ix.home(m)*s]
	}
	ix.sink = sink
	return mk
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

func (ix *index) home(m uint64) int { return hashtab.Home(m, ix.n) }

// dist is how far slot i lies past the home of placed hash m.
func (ix *index) dist(i int, m uint64) int { return i - ix.home(m) }

// slots is the table's length in slots: n homes, then maxProbe spares.
func (ix *index) slots() int { return hashtab.Slots(ix.n) }

func (ix *index) empty(i int) bool {
	for _, b := range ix.tab[i*(1+ix.w)+1 : (i+1)*(1+ix.w)] {
		if b != 0 {
			return false
		}
	}
	return true
}

// at reads slot i of the table for package hashtab: its placed hash and
// whether it is occupied.
//
// A free slot is all zeros (del clears the slot it frees, and a resized
// table starts zeroed), so a nonzero hash is a held block, and only a
// zero one needs the holder words scanned.
func (ix *index) at(i int) (uint64, bool) {
	if k := ix.tab[i*(1+ix.w)]; k != 0 {
		return k, true
	}
	return 0, !ix.empty(i)
}

// find returns the table slot of placed hash m, or -1. It probes at most
// maxProbe slots, stopping at the first empty slot or greater hash.
func (ix *index) find(m uint64) int {
	if ix.w == 1 { // the common case, up to 64 replicas: one word of holders
		return hashtab.Find(ix.n, m, func(i int) (uint64, bool) { return ix.tab[2*i], ix.tab[2*i+1] != 0 })
	}
	return hashtab.Find(ix.n, m, func(i int) (uint64, bool) { return ix.at(i) })
}

// insert adds placed hash m, which must be absent, and returns its slot,
// or -1 if it cannot be placed within maxProbe and maxShift. The caller
// sets a holder bit before the next table operation.
func (ix *index) insert(m uint64) int {
	if float64(ix.used+1) > maxLoad*float64(ix.n) {
		ix.resize(max(16, min(2*ix.n, ix.limit)))
	}
	return ix.place(m)
}

// place is insert into a table with room: m goes before the first greater
// hash of its run, and the blocks from there to the next empty slot shift
// one slot on, unless that would put a block maxProbe or more slots past
// its home, shift more than maxShift slots or run off the table's end.
func (ix *index) place(m uint64) int {
	s := 1 + ix.w
	at := func(i int) (uint64, bool) { return ix.at(i) }
	i := hashtab.Seat(ix.n, m, at)
	e := hashtab.Room(ix.n, i, at)
	if e < 0 {
		ix.dropped++
		return -1
	}
	copy(ix.tab[(i+1)*s:(e+1)*s], ix.tab[i*s:e*s])
	clear(ix.tab[i*s+1 : (i+1)*s])
	ix.tab[i*s] = m
	ix.used++
	if e > i {
		ix.moves++
	}
	return i
}

// resize rehashes the table into n slots (at least enough for its blocks).
func (ix *index) resize(n int) { ix.rebuild(n, ix.w) }

// rebuild rehashes the table into n slots of w-word bit sets. A block
// that no longer fits within the bounds (only if someone knows the
// secret) is forgotten by its holders.
func (ix *index) rebuild(n, w int) {
	n = max(n, tableSlots(ix.used+1))
	ix.moves++
	old, oldS := ix.tab, 1+ix.w
	oldSlots := len(old) / oldS
	ix.tab, ix.n, ix.used = make([]uint64, hashtab.Slots(n)*(1+w)), n, 0
	if w != ix.w {
		na := make([]uint64, w)
		copy(na, ix.active)
		ix.active, ix.alive = na, make([]uint64, w)
	}
	ix.w = w
	// The old slots are in ascending order of hash, so each block goes at
	// the end of its run: nothing shifts.
	for j := range oldSlots {
		src := old[j*oldS : (j+1)*oldS]
		occupied := false
		for _, b := range src[1:] {
			occupied = occupied || b != 0
		}
		if !occupied {
			continue
		}
		if i := ix.place(src[0]); i >= 0 {
			copy(ix.tab[i*(1+w)+1:], src[1:])
		} else {
			ix.forget(src[0], src[1:])
		}
	}
}

// forget drops block m from every replica in holders; the block table no
// longer has it.
func (ix *index) forget(m uint64, holders []uint64) {
	for wi, b := range holders {
		for ; b != 0; b &= b - 1 {
			r := ix.reps[wi*64+bits.TrailingZeros64(b)]
			if l := r.lookup(m); l != nilRef {
				r.drop(m)
				r.unlink(l)
				r.release(l)
			}
		}
	}
}

// del removes table slot i, shifting the rest of its run back one slot
// up to the next empty slot or block at its home.
func (ix *index) del(i int) {
	s := 1 + ix.w
	j := hashtab.Delete(ix.n, i, func(i int) (uint64, bool) { return ix.at(i) })
	copy(ix.tab[i*s:(j-1)*s], ix.tab[(i+1)*s:j*s])
	clear(ix.tab[(j-1)*s : j*s])
	ix.used--
	ix.moves++
}

// match writes, for every active replica slot s, the number of leading
// blocks of mk (placed hashes, see mixKey, which prefetches their slots)
// that replica holds into out[s], and returns the longest.
func (ix *index) match(mk Key, out []int32) int {
	alive := ix.alive
	copy(alive, ix.active)
	s := 1 + ix.w
	if ix.w == 1 { // up to 64 replicas: one word, no inner loop
		a := alive[0]
		for i, m := range mk {
			var nb uint64
			if pos := ix.find(m); pos >= 0 {
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
			out[bits.TrailingZeros64(a)] = int32(len(mk))
		}
		return len(mk)
	}
	for i, m := range mk {
		pos := ix.find(m)
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
			out[wi*64+bits.TrailingZeros64(a)] = int32(len(mk))
		}
	}
	return len(mk)
}

// store records that replica slot holds every block of mk (placed hashes),
// making them its most recently used, the root last, and evicting least
// recently used blocks beyond its capacity.
func (ix *index) store(slot uint32, mk Key) { ix.storeMatched(slot, mk, len(mk)) }

// storeMatched is store for a key of which the replica holds about the
// first matched blocks, as match found. Those it looks up in the replica's
// table to refresh; the rest it expects to be absent, so it asks the block
// table first, whose probe the insertion needs anyway, and so skips a
// fruitless probe of the replica's table for every block of a new suffix.
func (ix *index) storeMatched(slot uint32, mk Key, matched int) {
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
	if r.cap > len(mk) {
		for l := r.mru; l != nilRef && run < matched && r.nodes[l].hash == mk[run]; l = r.nodes[l].next {
			front, run = l, run+1
		}
	}
	if len(r.tab) > 0 && run < matched { // overlap the cache misses, as in match
		var sink uint32
		for _, m := range mk[run:matched] {
			if v := r.tab[r.home(m)]; v != 0 {
				sink += r.nodes[v-1].prev
			}
		}
		ix.sink += uint64(sink)
	}
	for i := len(mk) - 1; i >= run; i-- {
		m := mk[i]
		pos := -1
		if i < matched {
			if l := r.lookup(m); l != nilRef {
				r.moveBehind(front, l)
				continue
			}
		} else if pos = ix.find(m); pos >= 0 && ix.holds(pos, slot) {
			r.moveBehind(front, r.lookup(m)) // held after all (a key repeating a block)
			continue
		}
		moves, dropped := ix.moves, ix.dropped
		l := ix.alloc(r)
		r.nodes[l].hash = m
		ok := ix.addRep(r, l)
		if ok {
			// Unless the block table was asked above (and nothing moved
			// since; evictions only remove blocks), ask it now.
			if i < matched || (pos >= 0 && ix.moves != moves) {
				pos = ix.find(m)
			}
			if pos < 0 {
				pos = ix.insert(m)
			}
			if ok = pos >= 0; ok {
				ix.tab[pos*(1+ix.w)+1+int(slot/64)] |= 1 << (slot % 64)
			} else {
				r.drop(m)
			}
		}
		if !ok {
			r.release(l)
		}
		// A bound was hit: the front block may have been forgotten.
		if ix.dropped != dropped && front != nilRef && r.lookup(mk[run-1]) != front {
			front = nilRef
		}
		if ok {
			r.linkBehind(front, l)
		}
	}
}

// remove drops the blocks of mk (placed hashes) that replica slot holds,
// wherever they are.
func (ix *index) remove(slot uint32, mk Key) {
	r := ix.reps[slot]
	for _, m := range mk {
		if l := r.lookup(m); l != nilRef {
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
	m := r.nodes[l].hash
	ix.unhold(r, m)
	r.drop(m)
	r.unlink(l)
	r.release(l)
}

// unhold clears r's holder bit of block m, deleting the block when no
// replica holds it any more.
func (ix *index) unhold(r *repCache, m uint64) {
	pos := ix.find(m)
	ix.tab[pos*(1+ix.w)+1+int(r.slot/64)] &^= 1 << (r.slot % 64)
	if ix.empty(pos) {
		ix.del(pos)
	}
}

// holds reports whether table slot pos records replica slot as a holder.
func (ix *index) holds(pos int, slot uint32) bool {
	return ix.tab[pos*(1+ix.w)+1+int(slot/64)]&(1<<(slot%64)) != 0
}

// repCache is one replica's cached blocks: nodes in LRU order and an
// ordered hash table from placed hash to node.
type repCache struct {
	slot  uint32
	cap   int
	nodes []repNode
	mru   uint32
	lru   uint32
	n     int    // nodes in use
	free  uint32 // free list through next

	tab   []uint32 // node+1 per slot, homes+maxProbe slots; 0 is empty
	homes int      // home slots
	used  int
}

// repNode is one cached block: its placed hash and LRU links (nilRef
// ends), in one 16-byte record so that touching a block reads one cache
// line.
type repNode struct {
	hash       uint64
	prev, next uint32
}

func newRepCache(slot uint32, capacity int) *repCache {
	return &repCache{slot: slot, cap: capacity, mru: nilRef, lru: nilRef, free: nilRef}
}

func (r *repCache) home(m uint64) int { return hashtab.Home(m, r.homes) }

// at reads slot i of r's table for package hashtab: its placed hash and
// whether it is occupied.
func (r *repCache) at(i int) (uint64, bool) {
	if v := r.tab[i]; v != 0 {
		return r.nodes[v-1].hash, true
	}
	return 0, false
}

// dist is how far slot i lies past the home of placed hash m.
func (r *repCache) dist(i int, m uint64) int { return i - r.home(m) }

// lookup returns the node holding block m, or nilRef, probing at most
// maxProbe slots.
func (r *repCache) lookup(m uint64) uint32 {
	if r.homes == 0 {
		return nilRef
	}
	if i := hashtab.Find(r.homes, m, func(i int) (uint64, bool) { return r.at(i) }); i >= 0 {
		return r.tab[i] - 1
	}
	return nilRef
}

// place records node l, holding block m, which must be absent, in a table
// with room, as index.place does; it reports whether l fits within the
// bounds.
func (r *repCache) place(m uint64, l uint32) bool {
	at := func(i int) (uint64, bool) { return r.at(i) }
	i := hashtab.Seat(r.homes, m, at)
	e := hashtab.Room(r.homes, i, at)
	if e < 0 {
		return false
	}
	copy(r.tab[i+1:e+1], r.tab[i:e])
	r.tab[i] = l + 1
	r.used++
	return true
}

// addRep records in r's table that node l holds its block, growing the
// table as needed, and reports whether it fit within the bounds.
func (ix *index) addRep(r *repCache, l uint32) bool {
	if float64(r.used+1) > repLoad*float64(r.homes) {
		ix.growRep(r)
	}
	if !r.place(r.nodes[l].hash, l) {
		ix.dropped++
		return false
	}
	return true
}

// growRep rehashes r's table into a larger one. A node that no longer
// fits within the bounds (only if someone knows the secret) is dropped
// from the replica.
func (ix *index) growRep(r *repCache) {
	n := max(16, min(2*r.homes, int(float64(r.cap)/repLoad)+1), int(float64(r.used+1)/repLoad)+1)
	old := r.tab
	r.tab, r.homes, r.used = make([]uint32, hashtab.Slots(n)), n, 0
	for _, v := range old {
		if v != 0 && !r.place(r.nodes[v-1].hash, v-1) {
			ix.unhold(r, r.nodes[v-1].hash)
			r.unlink(v - 1)
			r.release(v - 1)
			ix.dropped++
		}
	}
}

// drop forgets block m, which must be present, shifting the rest of its
// run back.
func (r *repCache) drop(m uint64) {
	at := func(i int) (uint64, bool) { return r.at(i) }
	i := hashtab.Find(r.homes, m, at)
	j := hashtab.Delete(r.homes, i, at)
	copy(r.tab[i:j-1], r.tab[i+1:j])
	r.tab[j-1] = 0
	r.used--
}

// release puts node l, unlinked, on the free list.
func (r *repCache) release(l uint32) {
	r.nodes[l].next = r.free
	r.free = l
	r.n--
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

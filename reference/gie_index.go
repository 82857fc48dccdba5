package reference

// gieIndex is the approximate prefix index of the Gateway API Inference
// Extension's endpoint picker (approximateprefix/indexer.go): for each
// server an LRU of the block hashes of the prompts routed to it, and for
// each hash the servers holding it. Not safe for concurrent use.
type gieIndex struct {
	holders map[uint64][]int32 // hash → servers
	lrus    []*lruSet
	slot    map[string]int32
	count   []int // scratch: matched blocks per server
}

func newGIEIndex() *gieIndex {
	return &gieIndex{holders: map[uint64][]int32{}, slot: map[string]int32{}}
}

// server returns name's slot, creating its LRU with capacity blocks on
// first sight (the indexer sizes a server's LRU when it first adds to it).
func (x *gieIndex) server(name string, capacity int) int32 {
	if s, ok := x.slot[name]; ok {
		return s
	}
	s := int32(len(x.lrus))
	x.slot[name] = s
	x.lrus = append(x.lrus, newLRUSet(max(capacity, 1)))
	x.count = append(x.count, 0)
	return s
}

// match counts, for each server, the leading hashes it holds the way
// matchLongestPrefix does: hashes are taken in order while any server
// holds one, and each counts for every server holding it. The counts are
// left in x.count, indexed by slot.
func (x *gieIndex) match(hashes []uint64) {
	clear(x.count)
	for _, h := range hashes {
		hs := x.holders[h]
		if len(hs) == 0 {
			return
		}
		for _, s := range hs {
			x.count[s]++
		}
	}
}

// add records hashes for server s, most recent last, evicting the least
// recently used beyond its capacity.
func (x *gieIndex) add(hashes []uint64, s int32) {
	l := x.lrus[s]
	for _, h := range hashes {
		if l.touch(h) {
			continue
		}
		if ev, ok := l.insert(h); ok {
			x.drop(ev, s)
		}
		x.holders[h] = append(x.holders[h], s)
	}
}

func (x *gieIndex) drop(h uint64, s int32) {
	hs := x.holders[h]
	for i, v := range hs {
		if v == s {
			hs[i] = hs[len(hs)-1]
			hs = hs[:len(hs)-1]
			break
		}
	}
	if len(hs) == 0 {
		delete(x.holders, h)
	} else {
		x.holders[h] = hs
	}
}

// lruSet is a fixed-capacity LRU set of hashes (hashicorp/golang-lru's
// Cache as the indexer uses it), its entries linked in slices.
type lruSet struct {
	cap        int
	pos        map[uint64]int32
	key        []uint64
	prev, next []int32
	head, tail int32 // head is least recently used
}

func newLRUSet(capacity int) *lruSet {
	return &lruSet{cap: capacity, pos: map[uint64]int32{}, head: -1, tail: -1}
}

// touch marks h most recently used and reports whether it was present.
func (l *lruSet) touch(h uint64) bool {
	i, ok := l.pos[h]
	if !ok {
		return false
	}
	l.unlink(i)
	l.pushTail(i)
	return true
}

// insert adds h, absent, as most recently used; when full it first evicts
// the least recently used hash and returns it.
func (l *lruSet) insert(h uint64) (uint64, bool) {
	var evicted uint64
	full := len(l.pos) >= l.cap
	var i int32
	if full {
		i = l.head
		evicted = l.key[i]
		delete(l.pos, evicted)
		l.unlink(i)
		l.key[i] = h
	} else {
		i = int32(len(l.key))
		l.key = append(l.key, h)
		l.prev = append(l.prev, -1)
		l.next = append(l.next, -1)
	}
	l.pos[h] = i
	l.pushTail(i)
	return evicted, full
}

func (l *lruSet) unlink(i int32) {
	p, n := l.prev[i], l.next[i]
	if p >= 0 {
		l.next[p] = n
	} else {
		l.head = n
	}
	if n >= 0 {
		l.prev[n] = p
	} else {
		l.tail = p
	}
	l.prev[i], l.next[i] = -1, -1
}

func (l *lruSet) pushTail(i int32) {
	l.prev[i] = l.tail
	l.next[i] = -1
	if l.tail >= 0 {
		l.next[l.tail] = i
	} else {
		l.head = i
	}
	l.tail = i
}

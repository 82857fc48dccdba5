package hashtab

import "iter"

// Map is an ordered hash table (see the package doc) from 64-bit keys to
// values of type V, placing keys by a secret: every operation probes at
// most MaxProbe slots and shifts at most MaxShift, whatever the keys. It
// keeps at most half its home slots occupied, growing as needed. The
// secret decides only where a key sits: Get, Has and Len answer the same
// for every secret, unless a key could not be placed within the bounds
// (Put reports it), which needs someone who knows the secret to choose the
// keys.
//
// The placed hashes and the values lie in two arrays, so that a probe
// reads only the first: 8 bytes a slot plus the value's size. A Map is not
// safe for concurrent use.
type Map[V any] struct {
	seed    Seed
	keys    []uint64 // placed hashes, Slots(n); free marks an empty slot
	vals    []V      // beside keys
	n       int      // home slots
	len     int      // keys in the table
	top     bool     // holds the key placed at free, kept aside
	topVal  V
	dropped int
}

// free, the largest placed hash, marks an empty slot: a probe stops at the
// first slot whose placed hash is not below the one sought, empty slots
// included, so Find and Seat read every slot as occupied and need no test
// for empty ones (Room and Delete do). The one key placed at free is kept
// aside.
const free = ^uint64(0)

// New returns an empty Map with room for capacity keys before it grows,
// placing keys under secret.
func New[V any](capacity int, secret uint64) *Map[V] {
	t := &Map[V]{seed: NewSeed(secret)}
	t.rebuild(max(16, 2*capacity))
	return t
}

// Len returns the number of keys in t.
func (t *Map[V]) Len() int {
	if t.top {
		return t.len + 1
	}
	return t.len
}

// Dropped returns how many keys Put could not place within the bounds.
func (t *Map[V]) Dropped() int { return t.dropped }

// Get returns the value of key k and whether t holds k.
func (t *Map[V]) Get(k uint64) (V, bool) {
	m := t.seed.Mix(k)
	if m != free {
		keys := t.keys
		if i := Find(t.n, m, func(i int) (uint64, bool) { return keys[i], true }); i >= 0 {
			return t.vals[i], true
		}
		var zero V
		return zero, false
	}
	return t.topVal, t.top
}

// Prefix returns how many leading keys of ks t holds, and writes their
// values to vals, which must be as long as ks: Get over a chain of keys,
// in one call.
func (t *Map[V]) Prefix(ks []uint64, vals []V) int {
	// Locals, which the loop's stores to vals cannot change.
	sd, n, keys, tv := t.seed, t.n, t.keys, t.vals
	vals = vals[:len(ks)]
	for j, k := range ks {
		m := sd.Mix(k)
		if m == free {
			if !t.top {
				return j
			}
			vals[j] = t.topVal
			continue
		}
		i := Find(n, m, func(i int) (uint64, bool) { return keys[i], true })
		if i < 0 {
			return j
		}
		vals[j] = tv[i]
	}
	return len(ks)
}

// Has reports whether t holds key k.
func (t *Map[V]) Has(k uint64) bool {
	_, ok := t.Get(k)
	return ok
}

// Put sets the value of key k, adding k if absent, and reports whether t
// held k before and whether it holds k now: ok is false only if k could
// not be placed within the bounds, which leaves t as it was.
func (t *Map[V]) Put(k uint64, v V) (had, ok bool) {
	i, had, ok := t.add(k, v)
	if had {
		if i < 0 {
			t.topVal = v
		} else {
			t.vals[i] = v
		}
	}
	return had, ok
}

// Add adds key k with value v unless t holds k, and returns the value of
// k afterwards and whether t held k before: a held key keeps its value.
// ok is false only if k was absent and could not be placed within the
// bounds, which leaves t as it was.
func (t *Map[V]) Add(k uint64, v V) (cur V, had, ok bool) {
	i, had, ok := t.add(k, v)
	switch {
	case !ok:
		return cur, false, false
	case i < 0:
		return t.topVal, had, true
	}
	return t.vals[i], had, true
}

// add finds key k or adds it with value v: it returns its slot (-1 for
// the key kept aside) and whether t held it, or ok false if k is absent
// and does not fit within the bounds.
func (t *Map[V]) add(k uint64, v V) (i int, had, ok bool) {
	m := t.seed.Mix(k)
	if m == free {
		if had = t.top; !had {
			t.top, t.topVal = true, v
		}
		return -1, had, true
	}
	keys := t.keys
	i = Seat(t.n, m, func(i int) (uint64, bool) { return keys[i], true })
	if i >= 0 && keys[i] == m {
		return i, true, true
	}
	if 2*(t.len+1) > t.n { // grow for absent keys only
		t.rebuild(2 * t.n)
		keys := t.keys
		i = Seat(t.n, m, func(i int) (uint64, bool) { return keys[i], true })
	}
	if !t.place(i, m, v) {
		t.dropped++
		return -1, false, false
	}
	return i, false, true
}

// place puts m, absent, with value v at slot i, its seat (or -1), shifting
// the slots from there to the next empty one a slot on, and reports
// whether it fit within the bounds. The shifts are short (a slot or two
// at the Map's load), so a loop moves them, cheaper than two copies.
func (t *Map[V]) place(i int, m uint64, v V) bool {
	keys, vals := t.keys, t.vals
	e := Room(t.n, i, func(i int) (uint64, bool) { k := keys[i]; return k, k != free })
	if e < 0 {
		return false
	}
	for ; e > i; e-- {
		keys[e], vals[e] = keys[e-1], vals[e-1]
	}
	keys[i], vals[i] = m, v
	t.len++
	return true
}

// Delete removes key k and reports whether t held it.
func (t *Map[V]) Delete(k uint64) bool {
	m := t.seed.Mix(k)
	if m == free {
		ok := t.top
		t.top, t.topVal = false, *new(V)
		return ok
	}
	keys := t.keys
	i := Find(t.n, m, func(i int) (uint64, bool) { return keys[i], true })
	if i < 0 {
		return false
	}
	j := Delete(t.n, i, func(i int) (uint64, bool) { k := keys[i]; return k, k != free })
	vals := t.vals
	for ; i < j-1; i++ {
		keys[i], vals[i] = keys[i+1], vals[i+1]
	}
	keys[i], vals[i] = free, *new(V)
	t.len--
	return true
}

// All yields every key of t with its value, in an order that depends on
// the secret. t must not change during the iteration.
func (t *Map[V]) All() iter.Seq2[uint64, V] {
	return func(yield func(uint64, V) bool) {
		u := t.seed.unmixer()
		if t.top && !yield(u.unmix(free), t.topVal) {
			return
		}
		for i, m := range t.keys {
			if m != free && !yield(u.unmix(m), t.vals[i]) {
				return
			}
		}
	}
}

// rebuild rehashes t into n home slots. The old slots are in ascending
// order of placed hash, so each key goes at the end of its run and
// nothing shifts; and a key's distance from its home never grows when n
// does (its home at most doubles, and so do the homes before it), so
// every key fits again.
func (t *Map[V]) rebuild(n int) {
	oldKeys, oldVals := t.keys, t.vals
	t.keys, t.vals, t.n, t.len = make([]uint64, Slots(n)), make([]V, Slots(n)), n, 0
	for i := range t.keys {
		t.keys[i] = free
	}
	keys := t.keys
	for j, m := range oldKeys {
		if m == free {
			continue
		}
		i := Seat(n, m, func(i int) (uint64, bool) { return keys[i], true })
		if !t.place(i, m, oldVals[j]) {
			t.dropped++
		}
	}
}

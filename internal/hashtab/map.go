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
// A slot holds a key's placed hash beside its value: 8 bytes plus the
// value's size, rounded up to 8. A Map is not safe for concurrent use.
type Map[V any] struct {
	seed    Seed
	tab     []entry[V] // Slots(n) slots; placed hash free marks an empty one
	n       int        // home slots
	len     int        // keys in tab
	top     bool       // holds the key placed at free, kept aside
	topVal  V
	dropped int
}

type entry[V any] struct {
	m uint64
	v V
}

// free, the largest placed hash, marks an empty slot: a probe stops at the
// first slot whose placed hash is not below the one sought, empty slots
// included. The one key placed at free is kept aside.
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

func (t *Map[V]) find(m uint64) int {
	return Find(t.n, m, func(i int) (uint64, bool) { m := t.tab[i].m; return m, m != free })
}

// Get returns the value of key k and whether t holds k.
func (t *Map[V]) Get(k uint64) (V, bool) {
	m := t.seed.Mix(k)
	if m == free {
		return t.topVal, t.top
	}
	if i := t.find(m); i >= 0 {
		return t.tab[i].v, true
	}
	var zero V
	return zero, false
}

// Has reports whether t holds key k.
func (t *Map[V]) Has(k uint64) bool {
	_, ok := t.Get(k)
	return ok
}

// Put sets the value of key k, adding k if absent, and reports whether t
// holds k afterwards: false only if k could not be placed within the
// bounds, which leaves t as it was.
func (t *Map[V]) Put(k uint64, v V) bool {
	m := t.seed.Mix(k)
	if m == free {
		t.top, t.topVal = true, v
		return true
	}
	if i := t.find(m); i >= 0 {
		t.tab[i].v = v
		return true
	}
	if 2*(t.len+1) > t.n {
		t.rebuild(2 * t.n)
	}
	if !t.insert(m, v) {
		t.dropped++
		return false
	}
	return true
}

// insert places m, absent, with value v, and reports whether it fit
// within the bounds.
func (t *Map[V]) insert(m uint64, v V) bool {
	at := func(i int) (uint64, bool) { m := t.tab[i].m; return m, m != free }
	i := Seat(t.n, m, at)
	e := Room(t.n, i, at)
	if e < 0 {
		return false
	}
	copy(t.tab[i+1:e+1], t.tab[i:e])
	t.tab[i] = entry[V]{m, v}
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
	i := t.find(m)
	if i < 0 {
		return false
	}
	j := Delete(t.n, i, func(i int) (uint64, bool) { m := t.tab[i].m; return m, m != free })
	copy(t.tab[i:j-1], t.tab[i+1:j])
	t.tab[j-1] = entry[V]{m: free}
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
		for _, e := range t.tab {
			if e.m != free && !yield(u.unmix(e.m), e.v) {
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
	old := t.tab
	t.tab, t.n, t.len = make([]entry[V], Slots(n)), n, 0
	for i := range t.tab {
		t.tab[i].m = free
	}
	for _, e := range old {
		if e.m != free && !t.insert(e.m, e.v) {
			t.dropped++
		}
	}
}

package gateway

import (
	"fmt"
	"maps"
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/examlops/gateway/keys"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// modelCache is the naive reference for one replica's slice of the index:
// an LRU list of block hashes, most recently used first.
type modelCache struct {
	cap int
	lru []uint64
}

func (m *modelCache) has(h uint64) bool { return slices.Contains(m.lru, h) }

func (m *modelCache) drop(h uint64) {
	if i := slices.Index(m.lru, h); i >= 0 {
		m.lru = slices.Delete(m.lru, i, i+1)
	}
}

// store makes every block of key most recently used, the root last,
// evicting the least recently used block whenever a new one does not fit.
func (m *modelCache) store(key Key) {
	for i := len(key) - 1; i >= 0; i-- {
		h := key[i]
		if m.has(h) {
			m.drop(h)
		} else if len(m.lru) == m.cap {
			m.lru = m.lru[:len(m.lru)-1]
		}
		m.lru = slices.Insert(m.lru, 0, h)
	}
}

func (m *modelCache) remove(key Key) {
	for _, h := range key {
		m.drop(h)
	}
}

// match counts the leading blocks of key the replica holds.
func (m *modelCache) match(key Key) int {
	n := 0
	for n < len(key) && m.has(key[n]) {
		n++
	}
	return n
}

// checkIndex verifies the index's internal consistency: table slots, bit
// sets, per-replica hash tables, LRU lists and counts all agree, and every
// table keeps its blocks in ascending order of hash, none before its home
// or maxProbe or more slots past it, and none displaced right after an
// empty slot (so that every probe run from a home is unbroken). (Plain comparisons: require's per-call cost dominated
// tests on large indexes.)
func checkIndex(t require.TestingT, ix *index) {
	check := func(ok bool, format string, args ...any) {
		if !ok {
			t.Errorf(format, args...)
			t.FailNow()
		}
	}
	used := 0
	s := 1 + ix.w
	holders := map[uint64][]uint64{}
	check(len(ix.tab) == ix.slots()*s, "table of %d words for %d slots of %d", len(ix.tab), ix.slots(), s)
	last := uint64(0)
	for i := range ix.slots() {
		if ix.empty(i) {
			check(ix.tab[i*s] == 0, "empty table slot %d keeps a hash", i)
			continue
		}
		h := ix.tab[i*s]
		check(used == 0 || h > last, "slot %d: hash %x after %x", i, h, last)
		used, last = used+1, h
		d := ix.dist(i, h)
		check(d >= 0 && d < maxProbe, "block %x sits %d slots from its home", h, d)
		check(d == 0 || (i > 0 && !ix.empty(i-1)), "block %x after an empty slot is off its home", h)
		check(ix.find(h) == i, "block %x is not found at its slot %d", h, i)
		holders[h] = append([]uint64(nil), ix.tab[i*s+1:(i+1)*s]...)
		for wi := range ix.w {
			check(ix.tab[i*s+1+wi]&^ix.active[wi] == 0, "inactive replica holds block %x", h)
		}
	}
	check(used == ix.used, "used table slots: %d, counted %d", ix.used, used)
	seen := map[uint64][]uint64{}
	for sl, r := range ix.reps {
		if r == nil {
			check(ix.active[sl/64]&(1<<(sl%64)) == 0, "free replica slot %d is active", sl)
			continue
		}
		n := 0
		prev := nilRef
		for l := r.mru; l != nilRef; l = r.nodes[l].next {
			check(r.nodes[l].prev == prev, "LRU back link of node %d", l)
			h := r.nodes[l].hash
			check(r.lookup(h) == l, "replica table does not map block %x to its node", h)
			pos := ix.find(h)
			check(pos >= 0, "cached block %x missing from the table", h)
			check(ix.holds(pos, uint32(sl)), "cached block %x lacks its holder bit", h)
			if seen[h] == nil {
				seen[h] = make([]uint64, ix.w)
			}
			seen[h][sl/64] |= 1 << (sl % 64)
			prev = l
			n++
			check(n <= r.cap, "LRU list longer than capacity %d", r.cap)
		}
		check(r.lru == prev, "LRU tail")
		check(len(r.tab) == 0 || len(r.tab) == r.homes+maxProbe, "replica slot %d: table of %d slots for %d homes", sl, len(r.tab), r.homes)
		last, held := uint64(0), 0
		for i, v := range r.tab {
			if v == 0 {
				continue
			}
			h := r.nodes[v-1].hash
			check(held == 0 || h > last, "replica slot %d: table slot %d: hash %x after %x", sl, i, h, last)
			held, last = held+1, h
			d := r.dist(i, h)
			check(d >= 0 && d < maxProbe, "replica slot %d: block %x sits %d slots from its home", sl, h, d)
			check(d == 0 || (i > 0 && r.tab[i-1] != 0), "replica slot %d: block %x after an empty slot is off its home", sl, h)
		}
		check(r.n == n, "node count of replica slot %d: %d, counted %d", sl, r.n, n)
		check(r.used == n, "replica table entries of slot %d: %d, nodes %d", sl, r.used, n)
	}
	require.Equal(t, holders, seen, "holder bit sets disagree with the replicas' nodes")
}

// lruOrder lists a replica's cached blocks, most recently used first.
func lruOrder(r *repCache) []uint64 {
	out := []uint64{}
	for l := r.mru; l != nilRef; l = r.nodes[l].next {
		out = append(out, r.nodes[l].hash)
	}
	return out
}

// TestPropIndexRepeatedBlocksStayConsistent stores keys that repeat blocks
// (no chained key does, but a caller's raw Key may): the index must stay
// consistent and hold each distinct block once.
func TestPropIndexRepeatedBlocksStayConsistent(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ix := newIndex()
		slot := ix.addReplica(rapid.IntRange(1, 8).Draw(t, "cap"))
		for range rapid.IntRange(1, 30).Draw(t, "steps") {
			k := Key(rapid.SliceOfN(rapid.Uint64Range(1, 4), 1, 6).Draw(t, "key"))
			ix.store(slot, k)
			checkIndex(t, ix)
			held := lruOrder(ix.reps[slot])
			require.Len(t, held, len(slices.Compact(slices.Sorted(slices.Values(held)))), "a block held twice")
		}
	})
}

// modelKeys draws keys from a small universe of chains over ids 0..2, so
// that keys share prefixes often.
func drawModelKey(t *rapid.T, label string) Key {
	return keys.AppendHashes(nil, rapid.SliceOfN(rapid.Uint64Range(0, 2), 1, 6).Draw(t, label))
}

// TestPropIndexMatchesModel drives the index with random store, remove,
// clear, add and remove-replica operations and checks every match against
// the naive model and the index's invariants after every step.
func TestPropIndexMatchesModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ix := newIndex()
		model := map[uint32]*modelCache{}
		active := func() []uint32 { return slices.Sorted(maps.Keys(model)) }
		out := make([]int32, 0)
		for range rapid.IntRange(1, 60).Draw(t, "steps") {
			op := rapid.IntRange(0, 9).Draw(t, "op")
			if len(model) == 0 {
				op = 0
			}
			switch {
			case op == 0 && len(model) < 6: // add a replica
				c := rapid.IntRange(1, 6).Draw(t, "cap")
				s := ix.addReplica(c)
				_, dup := model[s]
				require.False(t, dup, "slot %d handed out twice", s)
				model[s] = &modelCache{cap: c}
			case op == 1 && len(model) > 1: // remove a replica
				s := rapid.SampledFrom(active()).Draw(t, "slot")
				ix.removeReplica(s)
				delete(model, s)
			case op <= 5: // store, as an engine event or as Route warms
				s := rapid.SampledFrom(active()).Draw(t, "slot")
				k := drawModelKey(t, "key")
				if rapid.Bool().Draw(t, "asRoute") {
					if n := len(ix.reps); len(out) < n {
						out = make([]int32, n)
					}
					ix.match(k, out)
					ix.storeMatched(s, k, int(out[s]))
				} else {
					ix.store(s, k)
				}
				model[s].store(k)
			case op == 6: // remove blocks, any subset of a key
				s := rapid.SampledFrom(active()).Draw(t, "slot")
				k := drawModelKey(t, "key")
				lo := rapid.IntRange(0, len(k)-1).Draw(t, "from")
				ix.remove(s, k[lo:])
				model[s].remove(k[lo:])
			case op == 7: // clear
				s := rapid.SampledFrom(active()).Draw(t, "slot")
				ix.clear(s)
				model[s].lru = nil
			}
			checkIndex(t, ix)
			// Every step ends with a match checked against the model.
			k := drawModelKey(t, "probe")
			if n := len(ix.reps); len(out) < n {
				out = make([]int32, n)
			}
			got := ix.match(k, out)
			want := 0
			for s, m := range model {
				require.Equal(t, m.match(k), int(out[s]), "replica slot %d", s)
				require.Equal(t, append([]uint64{}, m.lru...), lruOrder(ix.reps[s]), "LRU order of replica slot %d", s)
				want = max(want, m.match(k))
			}
			require.Equal(t, want, got, "longest match")
		}
	})
}

// TestIndexManyReplicasMatchesModel runs the model check with more than 64
// replicas, so bit sets span several words and slots are reused.
func TestIndexManyReplicasMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ix := newIndex()
	model := map[uint32]*modelCache{}
	for range 130 {
		c := 1 + rng.IntN(8)
		model[ix.addReplica(c)] = &modelCache{cap: c}
	}
	key := func() Key {
		ids := make([]uint64, 1+rng.IntN(8))
		for i := range ids {
			ids[i] = uint64(rng.IntN(3))
		}
		return keys.AppendHashes(nil, ids)
	}
	slots := func() []uint32 { return slices.Sorted(maps.Keys(model)) }
	out := make([]int32, 256)
	for step := range 4000 {
		ss := slots()
		s := ss[rng.IntN(len(ss))]
		switch r := rng.IntN(20); {
		case r == 0 && len(model) > 60:
			ix.removeReplica(s)
			delete(model, s)
		case r == 1 && len(model) < 200:
			c := 1 + rng.IntN(8)
			model[ix.addReplica(c)] = &modelCache{cap: c}
		case r == 2:
			ix.clear(s)
			model[s].lru = nil
		case r == 3:
			k := key()
			ix.remove(s, k)
			model[s].remove(k)
		default:
			k := key()
			ix.store(s, k)
			model[s].store(k)
		}
		if step%500 == 0 {
			checkIndex(t, ix)
		}
		if n := len(ix.reps); len(out) < n {
			out = make([]int32, n)
		}
		k := key()
		got := ix.match(k, out)
		want := 0
		for s, m := range model {
			require.Equal(t, m.match(k), int(out[s]), "step %d replica slot %d", step, s)
			want = max(want, m.match(k))
		}
		require.Equal(t, want, got)
	}
	checkIndex(t, ix)
	require.Greater(t, ix.w, 1, "test must span several bit-set words")
}

// TestPropGatewayIndexMatchesModel checks the same model through the public
// API: Route warms the chosen replica (indexApproximate), ApplyEvent
// stores, removes and clears, replicas come and go. Every decision's
// Matched and Hit, and every replica's CachedBlocks, must equal the model,
// and CachedBlocks never exceeds CacheBlocks.
func TestPropGatewayIndexMatchesModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		mode := rapid.SampledFrom([]Mode{ModeRoundRobin, ModeCacheAware, ModeLoadAware}).Draw(t, "mode")
		var reps []Replica
		model := map[string]*modelCache{}
		for i := range rapid.IntRange(1, 4).Draw(t, "n") {
			c := rapid.IntRange(1, 6).Draw(t, "cap")
			reps = append(reps, Replica{Name: fmt.Sprintf("r%d", i), CacheBlocks: c})
			model[reps[i].Name] = &modelCache{cap: c}
		}
		g, err := New(reps, WithMode(mode))
		require.NoError(t, err)
		next := len(reps)
		names := func() []string {
			var s []string
			for _, r := range g.Replicas() {
				s = append(s, r.Name)
			}
			return s
		}
		for range rapid.IntRange(1, 50).Draw(t, "steps") {
			switch op := rapid.IntRange(0, 9).Draw(t, "op"); {
			case op <= 4:
				k := drawModelKey(t, "key")
				d, err := g.Route(k)
				require.NoError(t, err)
				m := model[d.Replica]
				require.Equal(t, m.match(k), d.Matched, "Matched on %s", d.Replica)
				require.Equal(t, m.match(k) == len(k), d.Hit)
				require.Equal(t, len(k), d.Blocks)
				m.store(k)
				d.Done(DoneInfo{})
			case op == 5:
				name := rapid.SampledFrom(names()).Draw(t, "name")
				k := drawModelKey(t, "key")
				require.NoError(t, g.ApplyEvent(name, CacheEvent{Kind: BlocksStored, Blocks: k}))
				model[name].store(k)
			case op == 6:
				name := rapid.SampledFrom(names()).Draw(t, "name")
				k := drawModelKey(t, "key")
				require.NoError(t, g.ApplyEvent(name, CacheEvent{Kind: BlocksRemoved, Blocks: k}))
				model[name].remove(k)
			case op == 7:
				name := rapid.SampledFrom(names()).Draw(t, "name")
				require.NoError(t, g.ApplyEvent(name, CacheEvent{Kind: AllCleared}))
				model[name].lru = nil
			case op == 8 && len(model) > 1:
				name := rapid.SampledFrom(names()).Draw(t, "name")
				require.NoError(t, g.RemoveReplica(name))
				delete(model, name)
			case op == 9:
				c := rapid.IntRange(1, 6).Draw(t, "cap")
				name := fmt.Sprintf("r%d", next)
				next++
				require.NoError(t, g.AddReplica(Replica{Name: name, CacheBlocks: c}))
				model[name] = &modelCache{cap: c}
			}
			for _, st := range g.Replicas() {
				require.Equal(t, len(model[st.Name].lru), st.CachedBlocks, "CachedBlocks of %s", st.Name)
				require.LessOrEqual(t, st.CachedBlocks, st.CacheBlocks)
			}
			g.mu.Lock()
			checkIndex(t, g.idx)
			g.mu.Unlock()
		}
	})
}

// TestIndexCapacityAndPrefixClosure: a key longer than a replica's
// capacity leaves exactly its first capacity blocks cached (leaves are
// evicted first, so the cached set stays closed under prefixes).
func TestIndexCapacityAndPrefixClosure(t *testing.T) {
	for _, c := range []int{1, 2, 5, 64} {
		t.Run(fmt.Sprint(c), func(t *testing.T) {
			ix := newIndex()
			s := ix.addReplica(c)
			ids := make([]uint64, 100)
			for i := range ids {
				ids[i] = uint64(i)
			}
			k := keys.AppendHashes(nil, ids)
			ix.store(s, k)
			require.Equal(t, c, ix.cached(s))
			out := make([]int32, 1)
			require.Equal(t, c, ix.match(k, out))
			checkIndex(t, ix)
		})
	}
}

// TestIndexTableStaysBounded: churning far more distinct blocks through a
// replica than it holds keeps the table within its limit.
func TestIndexTableStaysBounded(t *testing.T) {
	ix := newIndex()
	s := ix.addReplica(100)
	for i := range uint64(20000) {
		ix.store(s, keys.AppendHashes(nil, []uint64{i, i + 1}))
	}
	require.Equal(t, 100, ix.cached(s))
	require.LessOrEqual(t, ix.n, max(16, ix.limit))
	require.Equal(t, 100, ix.used)
	checkIndex(t, ix)
	require.Equal(t, 0, bits.OnesCount64(ix.active[0])-1)
}

package hashtab

import (
	"math/rand/v2"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// checkMap verifies a Map's invariants: its table has Slots(n) slots, the
// occupied ones in ascending order of placed hash, none before its home or
// MaxProbe or more slots past it, none displaced right after an empty slot
// (so every probe run from a home is unbroken), and its counts agree.
func checkMap[V any](t require.TestingT, m *Map[V]) {
	require.Len(t, m.keys, Slots(m.n))
	require.Len(t, m.vals, Slots(m.n))
	used, last := 0, uint64(0)
	for i, k := range m.keys {
		if k == free {
			continue
		}
		require.True(t, used == 0 || k > last, "slot %d: %x after %x", i, k, last)
		used, last = used+1, k
		d := i - Home(k, m.n)
		require.True(t, d >= 0 && d < MaxProbe, "key %x sits %d slots from its home", k, d)
		require.True(t, d == 0 || m.keys[i-1] != free, "key %x after an empty slot is off its home", k)
	}
	require.Equal(t, used, m.len)
	require.LessOrEqual(t, 2*m.len, m.n, "at most half the home slots occupied")
}

// keysAt returns count keys whose placed hashes, under secret in a table
// of n home slots, all have home slot h: what someone who knew the secret
// would send to flood one run.
func keysAt(secret uint64, n, h, count int) []uint64 {
	sd := NewSeed(secret)
	lo := uint64(float64(h) / float64(n) * (1 << 64)) // about the first placed hash homing at h
	out := make([]uint64, 0, count)
	for m := lo; len(out) < count; m += 1 << 20 {
		if Home(m, n) == h {
			out = append(out, sd.Unmix(m))
		}
	}
	return out
}

func TestSeed(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		sd := NewSeed(rapid.Uint64().Draw(t, "secret"))
		h := rapid.Uint64().Draw(t, "h")
		require.Equal(t, h, sd.Unmix(sd.Mix(h)), "Mix is a permutation")
	})
	a, b := NewSeed(1), NewSeed(2)
	require.NotEqual(t, a.Mix(42), b.Mix(42), "the secret changes the placement")
	require.Equal(t, uint64(1), a.K1&1)
	require.Equal(t, uint64(1), a.K2&1)
}

// longestRun is the longest run of occupied slots of m's table.
func longestRun[V any](m *Map[V]) int {
	run, longest := 0, 0
	for _, k := range m.keys {
		if k == free {
			run = 0
			continue
		}
		run++
		longest = max(longest, run)
	}
	return longest
}

// mapRuns counts TestMapModel's runs that saw Put refuse a key.
var mapRuns struct{ all, refusing int }

// TestMapModel runs random operations on a Map and on a Go map, with keys
// from families an unkeyed table would cluster (consecutive integers, a
// shared top 20 bits) and keys a flooder who knows the secret would
// choose (all homing at one slot, alone or in bursts), and checks that
// they agree and that the Map keeps its invariants. A key that Put refuses
// is absent afterwards, and Put refuses only when a run of at least
// MaxProbe occupied slots exists, which at the Map's load (at most one
// half) only a flood makes.
func TestMapModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		secret := rapid.Uint64().Draw(t, "secret")
		// 500: room for the operations below without growing, so the
		// flooding keys keep their home.
		capacity := rapid.SampledFrom([]int{0, 5, 64, 500}).Draw(t, "capacity")
		m := New[int](capacity, secret)
		model := map[uint64]int{}
		next := rapid.Uint64().Draw(t, "start")
		flood := keysAt(secret, m.n, m.n/2, 2*MaxProbe) // one home of the table as created
		pool := []uint64{0, ^uint64(0), NewSeed(secret).Unmix(free)}
		key := func(t *rapid.T) uint64 {
			var k uint64
			switch rapid.IntRange(0, 4).Draw(t, "family") {
			case 0: // reuse, so that Get, Put and Delete hit present keys
				k = rapid.SampledFrom(pool).Draw(t, "old")
			case 1:
				k = rapid.Uint64().Draw(t, "random")
			case 2:
				next++
				k = next
			case 3:
				k = 0xabcde<<44 | rapid.Uint64().Draw(t, "low")>>20
			case 4:
				k = rapid.SampledFrom(flood).Draw(t, "flood")
			}
			pool = append(pool, k)
			return k
		}
		refused := 0
		put := func(k uint64, v int) {
			_, want := model[k]
			had, ok := m.Put(k, v)
			require.Equal(t, want, had, "Put reports whether the key was held")
			if ok {
				model[k] = v
				return
			}
			refused++
			require.False(t, had, "a present key is always updated")
			require.GreaterOrEqual(t, longestRun(m), MaxProbe, "refused without a full run")
		}
		for range rapid.IntRange(1, 300).Draw(t, "ops") {
			switch rapid.IntRange(0, 5).Draw(t, "op") {
			case 0:
				put(key(t), rapid.Int().Draw(t, "v"))
			case 5: // Add: a held key keeps its value
				k, v := key(t), rapid.Int().Draw(t, "v")
				want, wantHad := model[k]
				cur, had, ok := m.Add(k, v)
				require.Equal(t, wantHad, had)
				switch {
				case had:
					require.True(t, ok)
					require.Equal(t, want, cur)
				case ok:
					require.Equal(t, v, cur)
					model[k] = v
				default:
					refused++
					require.GreaterOrEqual(t, longestRun(m), MaxProbe, "refused without a full run")
				}
			case 1: // a burst of flooding keys
				for i, k := range flood[:rapid.IntRange(1, len(flood)).Draw(t, "burst")] {
					put(k, i)
				}
			case 2:
				k := key(t)
				_, want := model[k]
				require.Equal(t, want, m.Delete(k))
				delete(model, k)
			case 3, 4:
				k := key(t)
				want, ok := model[k]
				got, gok := m.Get(k)
				require.Equal(t, ok, gok)
				require.Equal(t, ok, m.Has(k))
				if ok {
					require.Equal(t, want, got)
				}
				// Prefix over a chain of keys: the leading ones held.
				ks := []uint64{k, key(t), key(t)}
				vals := make([]int, len(ks))
				n := 0
				for n < len(ks) {
					if _, held := model[ks[n]]; !held {
						break
					}
					n++
				}
				require.Equal(t, n, m.Prefix(ks, vals))
				for j := range n {
					require.Equal(t, model[ks[j]], vals[j])
				}
			}
			require.Equal(t, len(model), m.Len())
		}
		checkMap(t, m)
		require.Equal(t, refused, m.Dropped())
		all := map[uint64]int{}
		for k, v := range m.All() {
			all[k] = v
		}
		require.Equal(t, model, all)
		mapRuns.all++
		if refused > 0 {
			mapRuns.refusing++
		}
	})
	t.Logf("%d of %d runs saw Put refuse a key", mapRuns.refusing, mapRuns.all)
	require.NotZero(t, mapRuns.refusing, "no run exercised the bounds")
}

// TestMapRandomKeysNeverRefused fills a Map with a million random keys,
// through several growths: none is refused, and the largest distance from
// home stays far below MaxProbe.
func TestMapRandomKeysNeverRefused(t *testing.T) {
	n := 1 << 20
	if testing.Short() {
		n = 1 << 16
	}
	m := New[struct{}](16, 7)
	rng := rand.New(rand.NewPCG(1, 2))
	for range n {
		_, ok := m.Put(rng.Uint64(), struct{}{})
		require.True(t, ok)
	}
	checkMap(t, m)
	most := 0
	for i, k := range m.keys {
		if k != free {
			most = max(most, i-Home(k, m.n))
		}
	}
	t.Logf("%d keys in %d home slots: largest distance from home %d", m.Len(), m.n, most)
	require.Less(t, most, MaxProbe/4)
	require.Zero(t, m.Dropped())
}

// TestMapProbeBound: keys chosen with the secret to share one home fill
// MaxProbe slots; the next are refused, leave the Map as it was, and every
// lookup, present or absent, stays within MaxProbe probes.
func TestMapProbeBound(t *testing.T) {
	m := New[int](1000, 5)
	keys := keysAt(5, m.n, 10, MaxProbe+20)
	for i, k := range keys {
		_, ok := m.Put(k, i)
		require.Equal(t, i < MaxProbe, ok, "key %d", i)
	}
	checkMap(t, m)
	require.Equal(t, MaxProbe, m.Len())
	require.Equal(t, 20, m.Dropped())
	for i, k := range keys {
		v, ok := m.Get(k)
		require.Equal(t, i < MaxProbe, ok)
		if ok {
			require.Equal(t, i, v)
		}
	}
	for i, k := range keys[:MaxProbe] {
		require.True(t, m.Delete(k), "key %d", i)
		checkMap(t, m)
	}
	require.Zero(t, m.Len())
}

// TestMapShiftBound: a run longer than MaxShift, of keys each at its own
// home, refuses a key that would shift all of it, and accepts one that
// shifts fewer than MaxShift slots.
func TestMapShiftBound(t *testing.T) {
	m := New[int](MaxShift+200, 9)
	run := MaxShift + 100
	for h := range run {
		k := keysAt(9, m.n, h, 1)[0]
		_, ok := m.Put(k, h)
		require.True(t, ok)
	}
	checkMap(t, m)
	// Home 0's keys are sorted; a key greater than slot 0's goes to slot 1
	// and would shift the rest of the run.
	var shifting uint64
	for _, k := range keysAt(9, m.n, 0, 64) {
		if mk := m.seed.Mix(k); mk > m.keys[0] && !m.Has(k) {
			shifting = k
			break
		}
	}
	_, ok := m.Put(shifting, -1)
	require.False(t, ok, "a shift of %d slots", run-1)
	require.Equal(t, 1, m.Dropped())
	require.Equal(t, run, m.Len())
	for _, k := range keysAt(9, m.n, run-50, 64) {
		if !m.Has(k) {
			_, ok := m.Put(k, -2)
			require.True(t, ok, "a shift of about 50 slots")
			break
		}
	}
	checkMap(t, m)
}

// TestMapGrowsForNewKeysOnly: a Map holding as many keys as it has room
// for grows on adding a key, not on Put or Add of a key it holds.
func TestMapGrowsForNewKeysOnly(t *testing.T) {
	m := New[int](100, 3)
	n := m.n
	for k := range uint64(100) {
		_, ok := m.Put(k, int(k))
		require.True(t, ok)
	}
	require.Equal(t, n, m.n)
	had, ok := m.Put(7, -7)
	require.True(t, had && ok)
	cur, had, ok := m.Add(8, -8)
	require.True(t, had && ok)
	require.Equal(t, 8, cur, "Add keeps a held key's value")
	require.Equal(t, n, m.n, "no growth for held keys")
	_, ok = m.Put(100, 100)
	require.True(t, ok)
	require.Equal(t, 2*n, m.n, "growth for a new key")
	v, _ := m.Get(7)
	require.Equal(t, -7, v)
	checkMap(t, m)
}

// TestCoreBounds: on tables that break the invariants (every slot
// occupied, by keys below or above the one sought), Find, Seat and Room
// still read at most MaxProbe, MaxProbe and MaxShift+1 slots, and never
// one outside the table.
func TestCoreBounds(t *testing.T) {
	const n = 10 * MaxShift
	for _, fill := range []uint64{0, 1 << 62, ^uint64(0) - 1} {
		reads := 0
		at := func(i int) (uint64, bool) {
			if i < 0 || i >= Slots(n) {
				t.Fatalf("slot %d read outside a table of %d", i, Slots(n))
			}
			reads++
			return fill, true
		}
		for _, m := range []uint64{0, 1 << 62, ^uint64(0)} {
			reads = 0
			i := Find(n, m, at)
			require.LessOrEqual(t, reads, MaxProbe)
			require.True(t, i == -1 || fill == m)
			reads = 0
			s := Seat(n, m, at)
			require.LessOrEqual(t, reads, MaxProbe)
			reads = 0
			require.Equal(t, -1, Room(n, s, at), "a full table has no room")
			require.LessOrEqual(t, reads, MaxShift+1)
		}
	}
	require.Equal(t, -1, Room(16, -1, func(int) (uint64, bool) { t.Fatal("read"); return 0, false }))
}

// TestInlined: the design rests on the compiler inlining the core's
// functions, and the Slot function literals with them, into the tables
// that call them (go build -gcflags=-m). Without that, every probe of
// Route would be an indirect call.
func TestInlined(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the compiler")
	}
	// go test puts its own GOROOT/bin first in PATH (runtime.GOROOT is
	// deprecated).
	out, err := exec.Command("go", "build", "-gcflags=-m", ".", "../..", "../../sim").CombinedOutput()
	require.NoError(t, err, "%s", out)
	s := string(out)
	for _, f := range []string{"Home", "Slots", "Find", "Seat", "Room", "Delete"} {
		require.Contains(t, s, "can inline "+f+"\n")
	}
	for _, site := range []string{
		"index.go", // the index: block table and replicas' tables
		"map.go",   // Map, the simulator's tables
	} {
		for _, f := range []string{"Find", "Seat", "Room", "Delete"} {
			found := false
			for _, line := range strings.Split(s, "\n") {
				if strings.Contains(line, site) && strings.HasSuffix(line, "inlining call to hashtab."+f) ||
					strings.Contains(line, site) && site == "map.go" && strings.HasSuffix(line, "inlining call to "+f) {
					found = true
				}
			}
			require.True(t, found, "%s does not inline %s", site, f)
		}
	}
	require.NotContains(t, s, "cannot inline (*index).at", "the block table's Slot")
	require.NotContains(t, s, "cannot inline (*repCache).at", "the replicas' Slot")
}

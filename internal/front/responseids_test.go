package front

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestResponseIDsBound: one client's table keeps MaxResponseIDs ids and
// forgets the least recently used first: an id looked up survives ids
// learned after it; an id is its model's.
func TestResponseIDsBound(t *testing.T) {
	var r ResponseIDs
	for i := range MaxResponseIDs {
		r.Add(fmt.Sprintf("resp_%d", i), "m", "r0", "10.0.0.1")
	}
	_, ok := r.Owner("resp_5", "m") // used: now the most recent
	require.True(t, ok)
	for i := MaxResponseIDs; i < MaxResponseIDs+10; i++ {
		r.Add(fmt.Sprintf("resp_%d", i), "m", "r0", "10.0.0.1")
	}
	require.Equal(t, MaxResponseIDs, r.Len())
	_, ok = r.Owner("resp_4", "m")
	require.False(t, ok, "the least recently used are forgotten")
	_, ok = r.Owner("resp_5", "m")
	require.True(t, ok, "an id used since is kept")
	_, ok = r.Owner("resp_10", "m")
	require.False(t, ok, "the 11th least recently used went in its place")
	got, ok := r.Owner(fmt.Sprintf("resp_%d", MaxResponseIDs+9), "m")
	require.True(t, ok)
	require.Equal(t, "r0", got)
	_, ok = r.Owner(fmt.Sprintf("resp_%d", MaxResponseIDs+9), "other")
	require.False(t, ok, "an id is its model's")
	model, replica, ok := r.Lookup("resp_5")
	require.True(t, ok)
	require.Equal(t, [2]string{"m", "r0"}, [2]string{model, replica})
	r.Forget("resp_5")
	_, _, ok = r.Lookup("resp_5")
	require.False(t, ok, "forgotten")
	require.Equal(t, MaxResponseIDs-1, r.Len())
}

// TestResponseIDsShare (issue 29, N4): 30 conversations of 30 clients
// survive one other client's 65,536 responses, which forgets only its
// own; with the first-in-first-out table all 30 were forgotten.
func TestResponseIDsShare(t *testing.T) {
	var r ResponseIDs
	for i := range 30 {
		r.Add(fmt.Sprintf("resp_c%d", i), "m", fmt.Sprintf("r%d", i%3), fmt.Sprintf("10.0.1.%d", i))
	}
	for i := range MaxResponseIDs {
		r.Add(fmt.Sprintf("resp_flood_%d", i), "m", "r0", "10.9.9.9")
	}
	kept := 0
	for i := range 30 {
		if got, ok := r.Owner(fmt.Sprintf("resp_c%d", i), "m"); ok && got == fmt.Sprintf("r%d", i%3) {
			kept++
		}
	}
	require.Equal(t, 30, kept, "pins kept of 30")
	require.Equal(t, MaxResponseIDs, r.Len())
	_, ok := r.Owner(fmt.Sprintf("resp_flood_%d", MaxResponseIDs-1), "m")
	require.True(t, ok, "the flooding client keeps its most recent")
	_, ok = r.Owner("resp_flood_29", "m")
	require.False(t, ok, "and forgets its oldest")
}

// TestClientOf: an address, with or without a port, is its IP; IPv6 its
// /64; anything else the one anonymous client.
func TestClientOf(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.1:5555":           "10.0.0.1",
		"10.0.0.1":                "10.0.0.1",
		" 10.0.0.1 ":              "10.0.0.1",
		"[::ffff:10.0.0.1]:80":    "10.0.0.1",
		"[2001:db8:1:2:3::4]:443": "2001:db8:1:2::/64",
		"2001:db8:1:2:ffff::9":    "2001:db8:1:2::/64",
		"[fe80::1%eth0]:80":       "fe80::/64",
		"":                        "",
		"unix":                    "",
		"host.example:80":         "",
		"10.0.0.1:5555, 10.0.0.2": "",
	} {
		assert.Equal(t, want, ClientOf(in), "%q", in)
	}
}

// TestEvicteeProperty: the eviction rule (evictee) takes an id only from
// a client that, after the add, still holds at least as many as the
// adder: the victim holds ids, and the most of anyone (the adder counted
// with its new id).
func TestEvicteeProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		counts := rapid.SliceOfN(rapid.IntRange(0, 50), 1, 20).Draw(t, "counts")
		if slices.Max(counts) == 0 {
			counts[0] = 1
		}
		adder := rapid.IntRange(0, len(counts)-1).Draw(t, "adder")
		v := evictee(adder, counts)
		after := slices.Clone(counts)
		after[adder]++
		after[v]--
		if counts[v] == 0 {
			t.Fatalf("victim %d holds no id: %v", v, counts)
		}
		if v != adder {
			if counts[v] <= counts[adder] {
				t.Fatalf("victim %d (%d ids) holds no more than adder %d (%d): %v", v, counts[v], adder, counts[adder], counts)
			}
			if after[v] < after[adder]-1 {
				t.Fatalf("victim %d left with %d below adder's %d", v, after[v], after[adder])
			}
		}
		if counts[v] != slices.Max(counts) && !(v == adder && counts[v]+1 >= slices.Max(counts)) {
			t.Fatalf("victim %d (%d ids) is not a largest holder: %v", v, counts[v], counts)
		}
	})
}

// TestResponseIDsModel: a small table under random adds, uses and
// forgets from a few clients, against a model that keeps every id with
// its client and last use: never more than its capacity; a full table
// forgets the least recently used id of a client evictee allows (one
// holding the most, the adder counted with its new id); nothing else is
// forgotten; a client is kept only while it holds ids.
func TestResponseIDsModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		capacity := rapid.IntRange(1, 12).Draw(t, "capacity")
		nClients := rapid.IntRange(1, 4).Draw(t, "clients")
		r := ResponseIDs{max: capacity}
		type entry struct{ client, used int }
		model := map[string]*entry{}
		clock, next := 0, 0
		counts := func() []int {
			c := make([]int, nClients)
			for _, e := range model {
				c[e.client]++
			}
			return c
		}
		for range rapid.IntRange(1, 80).Draw(t, "ops") {
			clock++
			switch rapid.IntRange(0, 3).Draw(t, "op") {
			case 0, 1: // add
				cl := rapid.IntRange(0, nClients-1).Draw(t, "client")
				id := fmt.Sprintf("resp_%d", next)
				next++
				before := counts()
				full := len(model) >= capacity
				r.Add(id, "m", "r", fmt.Sprintf("10.0.0.%d", cl))
				var gone []string
				for k := range model {
					if _, _, ok := r.peek(k); !ok {
						gone = append(gone, k)
					}
				}
				switch {
				case !full && len(gone) > 0:
					t.Fatalf("forgot %v with room", gone)
				case full && len(gone) != 1:
					t.Fatalf("full table forgot %v, want one id", gone)
				case full:
					e := model[gone[0]]
					if v := evictee(cl, before); before[e.client] != before[v] || (v == cl) != (e.client == cl) {
						t.Fatalf("forgot client %d's id, evictee says client %d (counts %v, adder %d)", e.client, v, before, cl)
					}
					for k, o := range model {
						if o.client == e.client && o.used < e.used {
							t.Fatalf("forgot %s (used %d) before %s (used %d)", gone[0], e.used, k, o.used)
						}
					}
					delete(model, gone[0])
				}
				model[id] = &entry{client: cl, used: clock}
			case 2: // use
				if next == 0 {
					continue
				}
				id := fmt.Sprintf("resp_%d", rapid.IntRange(0, next-1).Draw(t, "id"))
				_, ok := r.Owner(id, "m")
				if e := model[id]; (e != nil) != ok {
					t.Fatalf("Owner(%s) = %v, model has %v", id, ok, e != nil)
				} else if ok {
					e.used = clock
				}
			case 3: // forget
				if next == 0 {
					continue
				}
				id := fmt.Sprintf("resp_%d", rapid.IntRange(0, next-1).Draw(t, "id"))
				r.Forget(id)
				delete(model, id)
			}
			if r.Len() != len(model) || r.Len() > capacity {
				t.Fatalf("table holds %d, model %d, capacity %d", r.Len(), len(model), capacity)
			}
			// The clients kept are those holding ids: a client is
			// forgotten with its last id, so their number is bounded by
			// the ids', however many clients come and go.
			holding := 0
			for _, n := range counts() {
				if n > 0 {
					holding++
				}
			}
			if len(r.clients) != holding {
				t.Fatalf("table keeps %d clients, %d hold ids", len(r.clients), holding)
			}
		}
	})
}

// peek is Lookup without marking the id used (tests only).
func (r *ResponseIDs) peek(id string) (model, replica string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.m[id]
	if !ok {
		return "", "", false
	}
	return p.model, p.replica, true
}

// TestResponseIDsMemory measures the table at its bound (EXA_MEASURE=1):
// MaxResponseIDs ids of vLLM's shape ("resp_" and 32 hex digits), from
// one client, and each from another client (the worst case).
func TestResponseIDsMemory(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("set EXA_MEASURE=1 to measure")
	}
	for _, tc := range []struct {
		name   string
		client func(i int) string
	}{
		{"one client", func(int) string { return "10.0.0.1" }},
		{"a client each", func(i int) string { return fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255) }},
	} {
		clients := make([]string, MaxResponseIDs)
		for i := range clients {
			clients[i] = tc.client(i)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		var r ResponseIDs
		for i := range MaxResponseIDs {
			r.Add(fmt.Sprintf("resp_%032x", i), "meta-llama/Llama-3.1-8B-Instruct", fmt.Sprintf("r%d", i%8), clients[i])
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		d := float64(after.HeapAlloc - before.HeapAlloc)
		t.Logf("%s: %d ids: %.1f MiB, %.0f bytes an id", tc.name, MaxResponseIDs, d/(1<<20), d/MaxResponseIDs)
		runtime.KeepAlive(&r)
	}
}

// TestResponseIDsOwnerAllocs: looking an id up (a continuation's pin,
// which refreshes it) allocates nothing.
func TestResponseIDsOwnerAllocs(t *testing.T) {
	var r ResponseIDs
	for i := range 100 {
		r.Add(fmt.Sprintf("resp_%d", i), "m", "r0", fmt.Sprintf("10.0.0.%d", i%7))
	}
	allocs := testing.AllocsPerRun(100, func() {
		if _, ok := r.Owner("resp_3", "m"); !ok {
			t.Fatal("unknown")
		}
		if _, ok := r.Owner("resp_77", "m"); !ok {
			t.Fatal("unknown")
		}
	})
	require.Zero(t, allocs)
}

// BenchmarkResponseIDsAdd: learning an id into a full table (an
// eviction each time), from one client and from a client among 1,024.
func BenchmarkResponseIDsAdd(b *testing.B) {
	for _, clients := range []int{1, 1024} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			var r ResponseIDs
			names := make([]string, clients)
			for i := range names {
				names[i] = fmt.Sprintf("10.1.%d.%d", i>>8, i&255)
			}
			ids := make([]string, MaxResponseIDs+b.N)
			for i := range ids {
				ids[i] = fmt.Sprintf("resp_%032x", i)
			}
			for i := range MaxResponseIDs {
				r.Add(ids[i], "m", "r0", names[i%clients])
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				r.Add(ids[MaxResponseIDs+i], "m", "r0", names[i%clients])
			}
		})
	}
}

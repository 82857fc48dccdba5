package gateway

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/examlops/gateway/keys"
)

// Benchmarks for the targets of issue 2:
//
//	Route16:             ≤ 3 µs/op, 0 allocs/op (hashing a 4,096-byte prompt included)
//	Route256:            ≤ 10 µs/op
//	PrefixKey64KiB:      ≥ 5 GB/s
//	IndexMemory/16x65536 ≤ 48 B/entry at 1M (block, replica) entries
//
// Both Route benchmarks run on an index that already holds the prompts,
// in four variants: hot, one prompt over and over, so the index entries it
// touches stay in the processor's caches; warm, 64 prompts in turn over an
// index of about 205k entries (16 replicas) whose tables outgrow the
// caches, so most probes miss; all-hold, where every replica holds every
// prompt; and warm-exact, indexExact, where Route does not warm the index.
//
// Run: go test -run '^$' -bench . -benchmem -count 6 .

// routeFixtures caches warm gateways across a benchmark's repeated runs.
var routeFixtures struct {
	sync.Mutex
	m map[string]routeFixture
}

type routeFixture struct {
	g       *Gateway
	prompts []string
}

// fixture returns a warm gateway of n replicas: every replica holds the
// shared 1 KiB system prompt and `others` other 64-block prefixes; each
// of the 64 request prompts (4,096 bytes, 64 blocks) is held whole by one
// or two replicas, or by all of them if allHold.
func fixture(b *testing.B, n, others int, allHold bool, mode Mode, opts ...Option) routeFixture {
	name := fmt.Sprint(n, others, allHold, mode, len(opts))
	routeFixtures.Lock()
	defer routeFixtures.Unlock()
	if f, ok := routeFixtures.m[name]; ok {
		return f
	}
	if routeFixtures.m == nil {
		routeFixtures.m = map[string]routeFixture{}
	}
	g, prompts := warmGateway(b, n, others, allHold, append([]Option{WithMode(mode), withSecret(0x5eed)}, opts...)...)
	f := routeFixture{g, prompts}
	routeFixtures.m[name] = f
	return f
}

// benchRoute hashes a 4,096-byte prompt into a reused buffer and routes it,
// reporting completion at once: one request per op.
func benchRoute(b *testing.B, f routeFixture) {
	buf := make(Key, 0, 128)
	b.SetBytes(4096)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		p := f.prompts[i%len(f.prompts)]
		buf = appendPrefix(buf[:0], p[:1024], p[1024:], "")
		d, err := f.g.Route(buf)
		if err != nil {
			b.Fatal(err)
		}
		d.Done(DoneInfo{})
	}
}

func BenchmarkRoute16(b *testing.B) {
	b.Run("warm", func(b *testing.B) { benchRoute(b, fixture(b, 16, 200, false, ModeCacheAware)) })
	b.Run("all-hold", func(b *testing.B) { benchRoute(b, fixture(b, 16, 200, true, ModeCacheAware)) })
	// exact: the index is not warmed on Route (indexExact), isolating the
	// lookup and policy from the approximate index's warming.
	b.Run("warm-exact", func(b *testing.B) { benchRoute(b, fixture(b, 16, 200, false, ModeCacheAware, withIndex(indexExact))) })
	// hot: the same fixture, one prompt over and over, so the blocks it
	// touches stay in the processor's caches: the cost of the work itself,
	// without the cache misses of a large index.
	b.Run("hot", func(b *testing.B) { benchRoute(b, hot(fixture(b, 16, 200, false, ModeCacheAware))) })
}

func BenchmarkRoute256(b *testing.B) {
	b.Run("warm", func(b *testing.B) { benchRoute(b, fixture(b, 256, 50, false, ModeCacheAware)) })
	b.Run("all-hold", func(b *testing.B) { benchRoute(b, fixture(b, 256, 50, true, ModeCacheAware)) })
	b.Run("warm-exact", func(b *testing.B) { benchRoute(b, fixture(b, 256, 50, false, ModeCacheAware, withIndex(indexExact))) })
	b.Run("hot", func(b *testing.B) { benchRoute(b, hot(fixture(b, 256, 50, false, ModeCacheAware))) })
}

// hot narrows a fixture to its first prompt.
func hot(f routeFixture) routeFixture {
	f.prompts = f.prompts[:1]
	return f
}

// BenchmarkRouteRoundRobin16 is the same-run baseline: the same fixture and
// hashing, routed round-robin.
func BenchmarkRouteRoundRobin16(b *testing.B) {
	benchRoute(b, fixture(b, 16, 200, false, ModeRoundRobin))
}

// BenchmarkRouteParallel routes from GOMAXPROCS goroutines at once on the
// warm 16-replica gateway.
func BenchmarkRouteParallel(b *testing.B) {
	f := fixture(b, 16, 200, false, ModeCacheAware)
	var seed atomic.Uint64
	b.SetBytes(4096)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		buf := make(Key, 0, 128)
		i := int(seed.Add(17))
		for pb.Next() {
			p := f.prompts[i%len(f.prompts)]
			i++
			buf = appendPrefix(buf[:0], p[:1024], p[1024:], "")
			d, err := f.g.Route(buf)
			if err != nil {
				b.Error(err)
				return
			}
			d.Done(DoneInfo{})
		}
	})
}

// BenchmarkIndexMemory fills a gateway's index with exactly 1,048,576
// (block, replica) entries and reports the heap it takes per entry,
// measured with runtime.ReadMemStats after a GC before and after.
func BenchmarkIndexMemory(b *testing.B) {
	// distinct: every replica holds its own 65,536 (or 4,096) blocks, in
	// chains of 64; no block is shared.
	distinct := func(n, perReplica int) func(*Gateway) {
		return func(g *Gateway) {
			ids := make([]uint64, 64)
			for r := range n {
				name := fmt.Sprintf("r%d", r)
				for c := range perReplica / 64 {
					for j := range ids {
						ids[j] = uint64(r)<<40 | uint64(c)<<8 | uint64(j)
					}
					if err := g.ApplyEvent(name, CacheEvent{Kind: BlocksStored, Blocks: keys.AppendHashes(nil, ids)}); err != nil {
						b.Fatal(err)
					}
				}
			}
		}
	}
	// shared: realistic sharing. Every request is a 32-block system prompt
	// (one of 4), a 16-block document (one of 2,048, skewed) and 16 blocks
	// of its own session; each replica fills to capacity with them.
	shared := func(n int) func(*Gateway) {
		return func(g *Gateway) {
			rng := rand.New(rand.NewPCG(3, 4))
			ids := make([]uint64, 64)
			seq := uint64(0)
			for r := range n {
				name := fmt.Sprintf("r%d", r)
				for {
					sys := uint64(rng.IntN(4))
					doc := uint64(rng.IntN(64) * rng.IntN(32)) // skewed towards small ids
					seq++
					for j := range ids {
						switch {
						case j < 32:
							ids[j] = 1<<60 | sys<<8 | uint64(j)
						case j < 48:
							ids[j] = 2<<60 | doc<<8 | uint64(j)
						default:
							ids[j] = 3<<60 | seq<<8 | uint64(j)
						}
					}
					if err := g.ApplyEvent(name, CacheEvent{Kind: BlocksStored, Blocks: keys.AppendHashes(nil, ids)}); err != nil {
						b.Fatal(err)
					}
					if g.idx.cached(g.snap.Load().byName[name].slot) == 65536 {
						break
					}
				}
			}
		}
	}
	for _, bc := range []struct {
		name  string
		n     int
		cap   int
		fill  func(*Gateway)
		check int // entries expected
	}{
		{"16x65536-distinct", 16, 65536, distinct(16, 65536), 1 << 20},
		{"256x4096-distinct", 256, 4096, distinct(256, 4096), 1 << 20},
		{"16x65536-shared-prefix", 16, 65536, shared(16), 1 << 20},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			var perEntry, unique float64
			for range b.N {
				var m0, m1 runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&m0)
				reps := replicaNames(bc.n)
				for i := range reps {
					reps[i].CacheBlocks = bc.cap
				}
				g, err := New(reps, withIndex(indexExact))
				if err != nil {
					b.Fatal(err)
				}
				bc.fill(g)
				runtime.GC()
				runtime.ReadMemStats(&m1)
				entries := 0
				for _, st := range g.Replicas() {
					entries += st.CachedBlocks
				}
				if entries != bc.check {
					b.Fatalf("filled %d entries, want %d", entries, bc.check)
				}
				perEntry = float64(int64(m1.HeapAlloc)-int64(m0.HeapAlloc)) / float64(entries)
				unique = float64(g.idx.used)
				runtime.KeepAlive(g)
			}
			b.ReportMetric(perEntry, "B/entry")
			b.ReportMetric(unique, "blocks")
		})
	}
}

// benchHasher cuts text as keys.PrefixKey does.
var benchHasher, _ = keys.NewHasher(keys.TextBlockBytes)

// appendPrefix appends keys.PrefixKey's key to dst without allocating.
func appendPrefix(dst Key, system, session, rag string) Key {
	dst = benchHasher.AppendSegment(dst, keys.SegmentSystem, system)
	dst = benchHasher.AppendSegment(dst, keys.SegmentSession, session)
	return benchHasher.AppendSegment(dst, keys.SegmentRAG, rag)
}

// BenchmarkSaturated is the admission check (Gateway.Saturated) on the
// Route benchmarks' fixtures, every replica at its queue threshold (so the
// check reads them all and sheds), beside Route/hot of the same fixture:
// the check's cost relative to a Route.
//
//	go test -run '^$' -bench 'Saturated' -benchmem -count 6 .
func BenchmarkSaturated(b *testing.B) {
	for _, n := range []int{16, 256} {
		f := fixture(b, n, 50, false, ModeCacheAware)
		for _, st := range f.g.Replicas() {
			if err := f.g.UpdateLoad(st.Name, Load{QueueDepth: 5}); err != nil {
				b.Fatal(err)
			}
		}
		a := Admission{QueueDepth: 5, KVUtilization: 0.8, Staleness: time.Hour}
		b.Run(fmt.Sprintf("replicas=%d/check=saturated", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if !f.g.Saturated(Target{}, a) {
					b.Fatal("not saturated")
				}
			}
		})
		b.Run(fmt.Sprintf("replicas=%d/check=route-hot", n), func(b *testing.B) { benchRoute(b, hot(f)) })
	}
}

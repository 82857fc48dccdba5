package gateway

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/examlops/gateway/keys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConcurrentUse runs routing with Done and FirstToken, load updates,
// health changes, replica add/remove, cache events and status reads in
// parallel goroutines, a bounded number of iterations each (run it with
// -race). Afterwards, with every decision done, no replica has load left,
// the counters add up and the index is consistent.
func TestConcurrentUse(t *testing.T) {
	tests := []struct {
		name string
		opts []Option
	}{
		{"cache_aware", []Option{WithMode(ModeCacheAware)}},
		{"cache_aware/exact", []Option{WithMode(ModeCacheAware), withIndex(indexExact)}},
		{"round_robin", nil},
		{"load_aware/slo", []Option{WithMode(ModeLoadAware), WithSLOLatency(50 * time.Millisecond)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			concurrentUse(t, tt.opts)
		})
	}
}

func concurrentUse(t *testing.T, opts []Option) {
	const (
		routers = 4
		iters   = 600
		extras  = 4
	)
	base := []Replica{{Name: "r0", CacheBlocks: 64}, {Name: "r1", CacheBlocks: 8}, {Name: "r2", CacheBlocks: 16}, {Name: "r3"}}
	g := mustNew(t, base, opts...)
	names := []string{"r0", "r1", "r2", "r3"}
	for i := range extras {
		names = append(names, fmt.Sprintf("e%d", i))
	}
	ks := make([]Key, 32)
	for i := range ks {
		ids := []uint64{0} // a shared first block, as real traffic has
		for b := range 1 + i%12 {
			ids = append(ids, uint64(i%5)<<8|uint64(b))
		}
		ks[i] = keys.AppendHashes(nil, ids)
	}

	var (
		wg     sync.WaitGroup
		routed atomic.Uint64
	)
	guard := func(name string, fn func(rng *rand.Rand)) {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s panicked: %v", name, r)
				}
			}()
			fn(rand.New(rand.NewPCG(seed, 99)))
		}(uint64(len(name)) * 7919)
	}
	for w := range routers {
		guard(fmt.Sprintf("router%d", w), func(rng *rand.Rand) {
			var open []Decision
			for i := range iters {
				d, err := g.Route(ks[rng.IntN(len(ks))])
				if err != nil {
					t.Errorf("Route: %v", err) // r0 stays healthy: routing never fails
					continue
				}
				routed.Add(1)
				if rng.IntN(2) == 0 {
					d.FirstToken()
				}
				open = append(open, d)
				if len(open) > 4 || i == iters-1 {
					for _, o := range open {
						ttft := time.Duration(rng.IntN(100)) * time.Millisecond
						o.Done(DoneInfo{Latency: ttft, TTFT: ttft, Elapsed: ttft + time.Duration(rng.IntN(500))*time.Millisecond, OutputTokens: rng.IntN(64)})
						o.Done(DoneInfo{}) // a second Done is a no-op
					}
					open = open[:0]
				}
			}
		})
	}
	tolerate := func(err error) {
		if err != nil && !errors.Is(err, ErrUnknownReplica) {
			t.Errorf("unexpected error: %v", err)
		}
	}
	guard("loads", func(rng *rand.Rand) {
		for range iters {
			tolerate(g.UpdateLoad(names[rng.IntN(len(names))], Load{
				QueueDepth: rng.IntN(10), Running: rng.IntN(10), KVUtilization: rng.Float64(),
				Latency: time.Duration(rng.IntN(100)) * time.Millisecond,
			}))
		}
	})
	guard("health", func(rng *rand.Rand) {
		for range iters {
			tolerate(g.SetHealthy(names[1+rng.IntN(len(names)-1)], rng.IntN(3) != 0))
		}
	})
	guard("membership", func(rng *rand.Rand) {
		for range iters / 4 {
			name := names[len(base)+rng.IntN(extras)]
			if err := g.AddReplica(Replica{Name: name, CacheBlocks: 1 + rng.IntN(32)}); errors.Is(err, ErrInvalid) {
				tolerate(g.RemoveReplica(name))
			} else if err != nil {
				t.Errorf("AddReplica: %v", err)
			}
		}
	})
	guard("events", func(rng *rand.Rand) {
		for range iters {
			name := names[rng.IntN(len(names))]
			k := ks[rng.IntN(len(ks))]
			tolerate(g.ApplyEvent(name, CacheEvent{Kind: CacheEventKind(rng.IntN(3)), Blocks: k[:1+rng.IntN(len(k))]}))
		}
	})
	guard("readers", func(rng *rand.Rand) {
		for range iters {
			for _, st := range g.Replicas() {
				if st.CachedBlocks > st.CacheBlocks {
					t.Errorf("%s caches %d blocks over its capacity %d", st.Name, st.CachedBlocks, st.CacheBlocks)
				}
			}
			_ = g.Stats()
		}
	})
	wg.Wait()

	require.False(t, t.Failed())
	assert.Equal(t, routed.Load(), g.Stats().Routed)
	for _, st := range g.Replicas() {
		assert.Zero(t, st.InFlight, "%s in flight after all Done", st.Name)
		assert.Zero(t, st.PendingPrefill, "%s pending prefill after all Done", st.Name)
		assert.LessOrEqual(t, st.CachedBlocks, st.CacheBlocks)
	}
	g.mu.Lock()
	checkIndex(t, g.idx)
	g.mu.Unlock()
	checkPoolSpeeds(t, g)
}

// checkPoolSpeeds: the gateway's sum of its replicas' times per block
// (speed.go) is the sum over the replicas it has, however learning,
// additions and removals interleaved.
func checkPoolSpeeds(t testing.TB, g *Gateway) {
	t.Helper()
	var sum, n uint64
	for _, rs := range g.snap.Load().list {
		if a := rs.speed.Load() >> 32; a > 0 {
			sum, n = sum+a, n+1
		}
	}
	assert.Equal(t, sum<<16|n, g.speeds.Load(), "pool speed sum")
	sum, n = 0, 0
	for _, rs := range g.snap.Load().list {
		rs.learner.mu.Lock()
		if v := rs.learner.load.packed(); v > 0 {
			sum, n = sum+v, n+1
		}
		rs.learner.mu.Unlock()
	}
	assert.Equal(t, sum<<16|n, g.growths.Load(), "pool growth sum")
}

package gateway

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

// BenchmarkFlood measures hash flooding (issue 16): Route and ApplyEvent
// on a full index fed raw Keys of new blocks, one 16-block key per op,
// whose hashes are
//
//   - random: uniformly random 64-bit values, the baseline;
//   - consecutive: consecutive integers, 16 per key;
//   - top20: random values sharing their top 20 bits.
//
// An index that places blocks by their hashes unkeyed puts every
// consecutive or top20 block into one cluster of slots. Each family runs
// on 16 replicas of 4,096 blocks each, filled to capacity with keys of the
// same family before timing, so every op inserts 16 blocks and evicts as
// many: route routes a new key cache-aware (indexApproximate records it on
// the chosen replica), apply stores one on the next replica (indexExact).
//
// This file uses only the public API, so that it also builds against
// older code for a same-run comparison: copy it into a checkout and build
// both test binaries with go test -c.
//
// Run: go test -run '^$' -bench Flood -benchmem -count 6 .
func BenchmarkFlood(b *testing.B) {
	for _, fam := range []string{"random", "consecutive", "top20"} {
		for _, op := range []string{"route", "apply"} {
			b.Run(fam+"/"+op, func(b *testing.B) { benchFlood(b, fam, op) })
		}
	}
}

const (
	floodReplicas = 16
	floodCap      = 4096
	floodBlocks   = 16
)

// floodKeys generates an endless stream of new keys of one family.
type floodKeys struct {
	fam  string
	rng  *rand.Rand
	next uint64 // consecutive: the next integer
}

func (f *floodKeys) key(buf Key) Key {
	buf = buf[:0]
	for range floodBlocks {
		var h uint64
		switch f.fam {
		case "random":
			h = f.rng.Uint64()
		case "consecutive":
			f.next++
			h = f.next
		case "top20":
			h = 0xabcde<<44 | f.rng.Uint64()>>20
		}
		buf = append(buf, h)
	}
	return buf
}

type floodFixture struct {
	g     *Gateway
	keys  *floodKeys
	names []string
	n     int // ops so far, for apply's replica rotation
}

var floodFixtures struct {
	sync.Mutex
	m map[string]*floodFixture
}

// newFloodFixture returns a gateway filled to capacity with keys of family
// fam, cached across the benchmark's repeated runs.
func newFloodFixture(b *testing.B, fam, op string) *floodFixture {
	floodFixtures.Lock()
	defer floodFixtures.Unlock()
	if f, ok := floodFixtures.m[fam+op]; ok {
		return f
	}
	reps := make([]Replica, floodReplicas)
	for i := range reps {
		reps[i] = Replica{Name: fmt.Sprintf("r%d", i), CacheBlocks: floodCap}
	}
	opts := []Option{WithMode(ModeCacheAware)}
	if op == "apply" {
		opts = append(opts, withIndex(indexExact))
	}
	g, err := New(reps, opts...)
	if err != nil {
		b.Fatal(err)
	}
	f := &floodFixture{g: g, keys: &floodKeys{fam: fam, rng: rand.New(rand.NewPCG(16, 16))}}
	for _, r := range reps {
		f.names = append(f.names, r.Name)
	}
	buf := make(Key, 0, floodBlocks)
	for range floodReplicas * floodCap / floodBlocks {
		f.step(b, op, buf)
	}
	if floodFixtures.m == nil {
		floodFixtures.m = map[string]*floodFixture{}
	}
	floodFixtures.m[fam+op] = f
	return f
}

// step routes or applies one new key.
func (f *floodFixture) step(b *testing.B, op string, buf Key) {
	k := f.keys.key(buf)
	if op == "route" {
		d, err := f.g.Route(k)
		if err != nil {
			b.Fatal(err)
		}
		d.Done(DoneInfo{})
		return
	}
	f.n++
	if err := f.g.ApplyEvent(f.names[f.n%floodReplicas], CacheEvent{Kind: BlocksStored, Blocks: k}); err != nil {
		b.Fatal(err)
	}
}

func benchFlood(b *testing.B, fam, op string) {
	f := newFloodFixture(b, fam, op)
	buf := make(Key, 0, floodBlocks)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		f.step(b, op, buf)
	}
}

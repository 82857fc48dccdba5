package reference

import (
	"encoding/binary"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/examlops/gateway"
	"github.com/examlops/gateway/keys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestCHWBLPickAllocs: once its ring is built, Pick allocates nothing for
// an unchanged candidate set, whatever the key and loads.
func TestCHWBLPickAllocs(t *testing.T) {
	tests := []struct {
		name string
		n    int
		load int
	}{
		{"one replica", 1, 0},
		{"four idle", 4, 0},
		{"eight loaded", 8, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &CHWBL{}
			cs := cands(tt.n)
			for i := range cs {
				cs[i].InFlight = tt.load * i
			}
			r := req(3, cs)
			p.Pick(r, cs) // builds the ring
			id := uint64(0)
			allocs := testing.AllocsPerRun(200, func() {
				id++
				r.Key[0] = id
				p.Pick(r, cs)
			})
			assert.Zero(t, allocs)
		})
	}
}

// TestCHWBLHash: the heap-free hash equals xxHash64 of the little-endian
// bytes, so rings and picks are those of before.
func TestCHWBLHash(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		x := rapid.Uint64().Draw(t, "x")
		if got, want := hashUint64(x), xxhash.Sum64(binary.LittleEndian.AppendUint64(nil, x)); got != want {
			t.Fatalf("hashUint64(%d) = %d, want %d", x, got, want)
		}
	})
}

// TestCHWBLRebuildsOnChange: a CHWBL reused while the candidate set changes
// (names added, removed, renamed or reordered) picks exactly as a fresh one
// does, so the cached ring never goes stale.
func TestCHWBLRebuildsOnChange(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		reused := &CHWBL{Replication: 16}
		for range rapid.IntRange(1, 20).Draw(t, "steps") {
			n := rapid.IntRange(1, 6).Draw(t, "n")
			cs := make([]gateway.Candidate, n)
			used := map[string]bool{}
			for i := range cs {
				name := rapid.SampledFrom([]string{"a", "b", "c", "d", "e", "f", "g", "h"}).Filter(func(s string) bool { return !used[s] }).Draw(t, "name")
				used[name] = true
				cs[i] = gateway.Candidate{Name: name, InFlight: rapid.IntRange(0, 5).Draw(t, "load")}
			}
			k := keys.AppendHashes(nil, []uint64{rapid.Uint64().Draw(t, "id")})
			got := reused.Pick(&gateway.Request{Key: k}, cs)
			want := (&CHWBL{Replication: 16}).Pick(&gateway.Request{Key: k}, cs)
			require.Equal(t, want, got)
		}
	})
}

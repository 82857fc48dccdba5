package sim

import (
	"testing"

	"github.com/examlops/gateway/internal/hashtab"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReleaseReportsCachedAnswerBlocks: release returns exactly the answer
// blocks left cached, which the engine forwards as BlocksStored in exact
// index mode; blocks that found no room, or were evicted again for an
// earlier block, are not claimed.
func TestReleaseReportsCachedAnswerBlocks(t *testing.T) {
	tests := []struct {
		name        string
		cap, extra  int
		out         []uint64
		want        []uint64
		wantEvicted []uint64
	}{
		{"room reserved for all", 5, 3, []uint64{10, 11, 12}, []uint64{10, 11, 12}, nil},
		{"no room", 2, 0, []uint64{10, 11}, nil, nil},
		{"room for one", 3, 0, []uint64{10, 11, 12}, []uint64{10}, []uint64{12, 11}},
		{"answer repeats the prompt", 2, 0, []uint64{2}, []uint64{2}, nil},
		{"no answer", 2, 0, nil, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newKVCache(tt.cap, 1)
			key := []uint64{1, 2}
			slots := make([]int32, len(key))
			m := c.match(key, slots)
			require.True(t, c.fits(key, slots, m, tt.extra))
			c.admit(key, slots, m, tt.extra)
			c.commit(key, slots, m)
			got := c.release(slots, tt.extra, tt.out, nil)
			c.check()
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.wantEvicted, c.evicted)
			for _, h := range tt.out {
				cached := c.idx.Has(h)
				assert.Equal(t, cached, contains(got, h), "block %d", h)
			}
		})
	}
}

func contains(s []uint64, h uint64) bool {
	for _, x := range s {
		if x == h {
			return true
		}
	}
	return false
}

// TestCacheBlocksBeyondTheBounds: blocks that someone who knows the
// table's secret chose to share one home slot are cached up to the probe
// bound (hashtab.MaxProbe); the rest stay reserved while their request
// runs, are released with it, and are never found, and the cache's
// bookkeeping holds throughout.
func TestCacheBlocksBeyondTheBounds(t *testing.T) {
	const secret = 42
	sd := hashtab.NewSeed(secret)
	key := make([]uint64, hashtab.MaxProbe+72)
	for i := range key {
		key[i] = sd.Unmix(uint64(i)) // placed hashes 0, 1, 2, …: all home at slot 0
	}
	c := newKVCache(300, secret)
	slots := make([]int32, len(key))
	require.True(t, c.fits(key, slots, 0, 1))
	c.admit(key, slots, 0, 1)
	c.commit(key, slots, 0)
	c.check()
	require.Equal(t, hashtab.MaxProbe, c.pinned)
	require.Equal(t, 72+1, c.reserved, "the blocks left out stay reserved")
	require.Equal(t, hashtab.MaxProbe, c.match(key, make([]int32, len(key))))
	require.Empty(t, c.release(slots, 1, nil, nil))
	c.check()
	require.Zero(t, c.reserved)
	require.Zero(t, c.pinned)
	require.Equal(t, hashtab.MaxProbe, c.lruN)
	c.touch(key, nil, 0) // the pooled-LRU bound's path: the same blocks fit
	c.check()
	require.Equal(t, hashtab.MaxProbe, c.lruN)
	require.Equal(t, 2*72, c.idx.Dropped(), "commit and touch each refused the 72 blocks beyond the bound")
}

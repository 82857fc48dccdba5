package sim

import (
	"testing"

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

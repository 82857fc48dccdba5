package sim

import (
	"cmp"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestMinHeap: pushes and pops in any interleaving pop in (key, tie)
// order, against a sorted slice, and a popped pointer is not kept.
func TestMinHeap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var h minHeap[*int]
		var model []heapItem[*int]
		tie := uint64(0)
		for range rapid.IntRange(0, 200).Draw(t, "ops") {
			if len(model) > 0 && rapid.Bool().Draw(t, "pop") {
				slices.SortFunc(model, func(a, b heapItem[*int]) int {
					return cmp.Or(cmp.Compare(a.key, b.key), cmp.Compare(a.tie, b.tie))
				})
				got := h.pop()
				require.Equal(t, model[0], got)
				model = model[1:]
				require.Nil(t, h[:len(h)+1][len(h)].v, "the vacated item keeps no pointer")
				continue
			}
			tie++
			v := rapid.Int().Draw(t, "v")
			k := rapid.Int64Range(-3, 3).Draw(t, "key") // many equal keys
			h.push(k, tie, &v)
			model = append(model, heapItem[*int]{k, tie, &v})
		}
		require.Len(t, h, len(model))
	})
}

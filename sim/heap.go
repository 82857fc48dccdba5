package sim

// minHeap is a binary min-heap of values of type T ordered by (key, tie),
// ascending: the engine's events by (time, sequence number), a replica's
// decoding sequences by (finishing step, id). The users keep tie unique,
// so the order is total and the simulation deterministic. Keys sit beside
// the values, so comparisons read no value. The zero value is empty.
type minHeap[T any] []heapItem[T]

type heapItem[T any] struct {
	key int64
	tie uint64
	v   T
}

func (a *heapItem[T]) less(b *heapItem[T]) bool {
	return a.key < b.key || (a.key == b.key && a.tie < b.tie)
}

// push adds v under (key, tie).
func (h *minHeap[T]) push(key int64, tie uint64, v T) {
	*h = append(*h, heapItem[T]{key, tie, v})
	q := *h
	for i := len(q) - 1; i > 0; {
		p := (i - 1) / 2
		if !q[i].less(&q[p]) {
			break
		}
		q[i], q[p] = q[p], q[i]
		i = p
	}
}

// pop removes and returns the least item; h must not be empty.
func (h *minHeap[T]) pop() heapItem[T] {
	q := *h
	top := q[0]
	n := len(q) - 1
	q[0] = q[n]
	q[n] = heapItem[T]{} // drop the reference a pointer value holds
	q = q[:n]
	for i := 0; ; {
		l := 2*i + 1
		if l >= n {
			break
		}
		c := l
		if r := l + 1; r < n && q[r].less(&q[l]) {
			c = r
		}
		if !q[c].less(&q[i]) {
			break
		}
		q[i], q[c] = q[c], q[i]
		i = c
	}
	*h = q
	return top
}

package flow

// itemHeap is a binary heap of items that keeps each item's index in it:
// a flow's requests by (key, seq), index fi; or, with exp set, the queue's
// by (deadline, seq), index ei.
type itemHeap[T any] struct {
	s   []*item[T]
	exp bool
}

// before orders a flow's items: by key, then arrival.
func (a *item[T]) before(b *item[T]) bool {
	if a.key != b.key {
		return a.key < b.key
	}
	return a.seq < b.seq
}

// expires orders the expiry heap: by deadline, then arrival.
func (a *item[T]) expires(b *item[T]) bool {
	if !a.req.Deadline.Equal(b.req.Deadline) {
		return a.req.Deadline.Before(b.req.Deadline)
	}
	return a.seq < b.seq
}

func (h *itemHeap[T]) less(i, j int) bool {
	if h.exp {
		return h.s[i].expires(h.s[j])
	}
	return h.s[i].before(h.s[j])
}

func (h *itemHeap[T]) index(i int) {
	if h.exp {
		h.s[i].ei = i
	} else {
		h.s[i].fi = i
	}
}

func (h *itemHeap[T]) swap(i, j int) {
	h.s[i], h.s[j] = h.s[j], h.s[i]
	h.index(i)
	h.index(j)
}

func (h *itemHeap[T]) push(it *item[T]) {
	h.s = append(h.s, it)
	h.index(len(h.s) - 1)
	h.up(len(h.s) - 1)
}

func (h *itemHeap[T]) removeAt(i int) {
	last := len(h.s) - 1
	if i != last {
		h.swap(i, last)
	}
	h.s[last] = nil
	h.s = h.s[:last]
	if i != last && !h.down(i) {
		h.up(i)
	}
}

func (h *itemHeap[T]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h *itemHeap[T]) down(i int) bool {
	start, n := i, len(h.s)
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if r := c + 1; r < n && h.less(r, c) {
			c = r
		}
		if !h.less(c, i) {
			break
		}
		h.swap(i, c)
		i = c
	}
	return i > start
}

package flow

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// A flood on one queue fills the shared budget only until another queue's
// request arrives: past the budget it displaces by Push's rule, across the
// queues (a lower band's first, else the newest of a flow at least two
// longer than its own), and is refused when no request may go.
func TestBudgetDisplacesAcrossQueues(t *testing.T) {
	b, err := NewBudget(Limits{MaxRequests: 4, MaxBytes: 1000})
	require.NoError(t, err)
	batch := mustNew[string](t, Config{Budget: b}) // a model flooded by one tenant
	chat := mustNew[string](t, Config{Budget: b})  // another model
	other := mustNew[string](t, Config{Budget: b}) // a third, holding one it may not give up
	var gone []string
	out := func(v string) { gone = append(gone, v) }
	push := func(q *Queue[string], v, flow string, prio int, bytes int64) error {
		_, err := q.Push(Request[string]{Value: v, Flow: flow, Priority: prio, Bytes: bytes}, t0, out)
		return err
	}
	for _, v := range []string{"n1", "n2", "n3", "n4"} {
		require.NoError(t, push(batch, v, "noisy", 0, 10))
	}
	var fe *FullError
	require.ErrorAs(t, push(batch, "n5", "noisy", 0, 10), &fe, "the longest flow displaces no one")
	assert.Equal(t, "global", fe.Scope)

	require.NoError(t, push(chat, "q1", "quiet", 0, 10))
	require.NoError(t, push(chat, "q2", "quiet", 0, 10))
	assert.Equal(t, []string{"n4", "n3"}, gone, "the other model's request displaces the flood's newest")
	require.ErrorAs(t, push(chat, "q3", "quiet", 0, 10), &fe, "two each: displacing would not even them")
	assert.Equal(t, "global", fe.Scope)

	require.NoError(t, push(chat, "hi", "noisy", 1, 10))
	assert.Equal(t, []string{"n4", "n3", "n2"}, gone, "a higher band displaces from the lowest band below it: of equal flows, the queue that held first")

	// Bytes: a request that the newest of the longest flow would not make
	// room for is refused, and nothing changes.
	_, err = other.Push(Request[string]{Value: "big", Priority: 2, Bytes: 990}, t0, out)
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, FullError{Scope: "global", Resource: "requests", Priority: 2, Held: 4, Max: 4}, *fe)
	assert.Len(t, gone, 3)
	n, bytes := b.Held()
	assert.Equal(t, []any{4, int64(40)}, []any{n, bytes})

	// A request pushed with no displaced function is never displaced by
	// another queue's.
	assert.Equal(t, []string{"n1"}, drainStr(batch))
	_, err = other.Push(Request[string]{Value: "kept", Flow: "x"}, t0, nil)
	require.NoError(t, err)
	for _, v := range []string{"q1", "q2", "hi"} {
		_, ok := chat.Next(func(string) bool { return true })
		require.True(t, ok, v)
	}
	for _, v := range []string{"b1", "b2", "b3"} {
		require.NoError(t, push(batch, v, "noisy", 0, 10))
	}
	require.NoError(t, push(chat, "q4", "quiet", 1, 10))
	assert.Equal(t, []string{"n4", "n3", "n2", "b3"}, gone, "batch's band 0 is lowest")
	require.NoError(t, push(chat, "q5", "quiet", 1, 10))
	assert.Equal(t, []string{"n4", "n3", "n2", "b3", "b2"}, gone)
	require.NoError(t, push(chat, "q6", "quiet", 1, 10))
	assert.Equal(t, []string{"n4", "n3", "n2", "b3", "b2", "b1"}, gone)
	require.ErrorAs(t, push(chat, "q7", "quiet", 1, 10), &fe, "only other's request is below, and it has no displaced function")
	assert.Equal(t, []string{"kept"}, drainStr(other))
	n, bytes = b.Held()
	assert.Equal(t, []any{3, int64(30)}, []any{n, bytes})
}

func drainStr(q *Queue[string]) []string {
	var out []string
	for {
		v, ok := q.Next(func(string) bool { return true })
		if !ok {
			return out
		}
		out = append(out, v)
	}
}

// breq is a request in TestPropBudgetAcrossQueues' model.
type breq struct {
	v, q, prio int
	flow       string
	bytes      int64
	cb         bool
	h          Handle[int]
}

// bmodel is what queues sharing a budget hold, with what the rule
// depends on: the order in which each band's flows became backlogged
// (the queue's ring) and the order in which queues started to hold.
type bmodel struct {
	held  []breq              // in push order: a flow's newest is its last
	rings map[[2]int][]string // by (queue, band)
	join  []int               // queues holding requests, in the order they started to
}

func (m *bmodel) flowLen(q, prio int, flow string) int {
	n := 0
	for _, r := range m.held {
		if r.q == q && r.prio == prio && r.flow == flow {
			n++
		}
	}
	return n
}

func (m *bmodel) add(r breq) {
	k := [2]int{r.q, r.prio}
	if m.flowLen(r.q, r.prio, r.flow) == 0 {
		m.rings[k] = append(m.rings[k], r.flow)
	}
	if !slices.ContainsFunc(m.held, func(o breq) bool { return o.q == r.q }) {
		m.join = append(m.join, r.q)
	}
	m.held = append(m.held, r)
}

func (m *bmodel) drop(v int) breq {
	i := slices.IndexFunc(m.held, func(r breq) bool { return r.v == v })
	r := m.held[i]
	m.held = slices.Delete(m.held, i, i+1)
	k := [2]int{r.q, r.prio}
	if m.flowLen(r.q, r.prio, r.flow) == 0 {
		m.rings[k] = slices.DeleteFunc(m.rings[k], func(f string) bool { return f == r.flow })
	}
	if !slices.ContainsFunc(m.held, func(o breq) bool { return o.q == r.q }) {
		m.join = slices.DeleteFunc(m.join, func(q int) bool { return q == r.q })
	}
	return r
}

// candidate is queue q's offer for a request of priority prio: the newest
// of the longest flow (the first backlogged among equals) of its lowest
// band below prio, else of band prio; ok false if none or if it has no
// displaced function.
func (m *bmodel) candidate(q, prio int) (r breq, n int, ok bool) {
	band, found := 0, false
	for _, o := range m.held {
		if o.q == q && o.prio < prio && (!found || o.prio < band) {
			band, found = o.prio, true
		}
	}
	if !found {
		band = prio
	}
	var flow string
	for _, f := range m.rings[[2]int{q, band}] {
		if l := m.flowLen(q, band, f); l > n {
			flow, n = f, l
		}
	}
	if n == 0 {
		return breq{}, 0, false
	}
	for _, o := range m.held {
		if o.q == q && o.prio == band && o.flow == flow {
			r = o
		}
	}
	return r, n, r.cb
}

// Queues sharing a budget, driven at random: each push past the budget
// displaces exactly the request the rule names (across the queues) when
// it makes room, and is otherwise refused with a global FullError and
// nothing changed; every displaced request is answered once, with the
// displaced function it was pushed with; the budget always counts what
// the queues hold, within its limits.
func TestPropBudgetAcrossQueues(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		lim := Limits{MaxRequests: rapid.IntRange(1, 8).Draw(t, "maxRequests"), MaxBytes: rapid.Int64Range(1, 300).Draw(t, "maxBytes")}
		b, err := NewBudget(lim)
		if err != nil {
			t.Fatal(err)
		}
		nq := rapid.IntRange(1, 3).Draw(t, "queues")
		qs := make([]*Queue[int], nq)
		for i := range qs {
			// The queues' own limits never bind: only the budget does.
			if qs[i], err = New[int](Config{Budget: b, MaxFlows: 16, Fairness: Fairness(rapid.IntRange(0, 1).Draw(t, "fairness"))}); err != nil {
				t.Fatal(err)
			}
		}
		m := &bmodel{rings: map[[2]int][]string{}}
		answered := map[int]int{} // value → queue whose displaced function answered it
		var gone []int            // answered during the current push
		seq := 0
		for step := 0; step < 50; step++ {
			switch rapid.IntRange(0, 3).Draw(t, "op") {
			case 0, 1: // push
				seq++
				r := breq{v: seq, q: rapid.IntRange(0, nq-1).Draw(t, "q"), prio: rapid.IntRange(-1, 2).Draw(t, "prio"),
					flow: rapid.SampledFrom([]string{"a", "b", "c"}).Draw(t, "flow"), bytes: rapid.Int64Range(0, 120).Draw(t, "bytes"), cb: rapid.IntRange(0, 5).Draw(t, "cb") > 0}
				// The request the rule displaces, if any.
				var want breq
				wantOK := false
				n, bytes := b.Held()
				fits := n+1 <= lim.MaxRequests && bytes+r.bytes <= lim.MaxBytes
				if !fits && r.cb && r.prio >= 0 {
					best, bn, bi := breq{}, 0, -1
					for _, q := range m.join {
						c, cn, ok := m.candidate(q, r.prio)
						if ok && (bi < 0 || c.prio < best.prio || (c.prio == best.prio && cn > bn)) {
							best, bn, bi = c, cn, q
						}
					}
					if bi >= 0 && (best.prio < r.prio || bn >= m.flowLen(r.q, r.prio, r.flow)+2) && bytes-best.bytes+r.bytes <= lim.MaxBytes {
						want, wantOK = best, true
					}
				}
				before := make([]Stats, nq)
				for i, q := range qs {
					before[i] = q.Stats()
				}
				gone = nil
				var cb func(int)
				if r.cb {
					qi := r.q
					cb = func(v int) {
						if _, dup := answered[v]; dup {
							t.Fatalf("%d answered twice", v)
						}
						answered[v] = qi
						gone = append(gone, v)
					}
				}
				h, err := qs[r.q].Push(Request[int]{Value: r.v, Flow: r.flow, Priority: r.prio, Bytes: r.bytes}, t0, cb)
				switch {
				case r.prio < 0:
					if !errors.Is(err, ErrSheddable) {
						t.Fatalf("push %+v: %v, want ErrSheddable", r, err)
					}
				case fits:
					if err != nil || len(gone) != 0 {
						t.Fatalf("push %+v fits: %v, displaced %v", r, err, gone)
					}
				case wantOK:
					if err != nil || len(gone) != 1 || gone[0] != want.v {
						t.Fatalf("push %+v: %v, displaced %v; the rule displaces %+v", r, err, gone, want)
					}
					if answered[want.v] != want.q {
						t.Fatalf("%d, held by queue %d, answered by queue %d's function", want.v, want.q, answered[want.v])
					}
				default:
					var fe *FullError
					if !errors.As(err, &fe) || fe.Scope != "global" || len(gone) != 0 {
						t.Fatalf("push %+v: %v, displaced %v; want a global FullError", r, err, gone)
					}
					for i, q := range qs {
						if s := q.Stats(); !statsEqual(s, before[i]) {
							t.Fatalf("refused push %+v changed queue %d: %+v, was %+v", r, i, s, before[i])
						}
					}
				}
				if err == nil {
					r.h = h
					m.add(r)
				}
				if wantOK {
					// After r is added: a queue whose only request r
					// displaces keeps its place among the members.
					m.drop(want.v)
				}
			case 2: // a queue dispatches
				qi := rapid.IntRange(0, nq-1).Draw(t, "q")
				v, ok := qs[qi].Next(func(int) bool { return true })
				held := slices.ContainsFunc(m.held, func(r breq) bool { return r.q == qi })
				if ok != held {
					t.Fatalf("queue %d: next %v, model holds %v", qi, ok, held)
				}
				if ok {
					if r := m.drop(v); r.q != qi {
						t.Fatalf("queue %d dispatched %d, held by %d", qi, v, r.q)
					}
				}
			case 3: // a client goes away
				if len(m.held) == 0 {
					continue
				}
				r := m.held[rapid.IntRange(0, len(m.held)-1).Draw(t, "which")]
				if !qs[r.q].Remove(r.h) {
					t.Fatalf("remove %+v: not held", r)
				}
				m.drop(r.v)
			}
			n, bytes := b.Held()
			var sn int
			var sb int64
			for i, q := range qs {
				s := q.Stats()
				mn := 0
				for _, r := range m.held {
					if r.q == i {
						mn++
						sb += r.bytes
					}
				}
				if s.Requests != mn {
					t.Fatalf("queue %d holds %d, model %d", i, s.Requests, mn)
				}
				sn += s.Requests
			}
			if n != sn || bytes != sb || n > lim.MaxRequests || bytes > lim.MaxBytes {
				t.Fatalf("budget %d requests %d bytes; queues %d, %d; limits %+v", n, bytes, sn, sb, lim)
			}
			b.mu.Lock()
			members := len(b.members)
			b.mu.Unlock()
			if members != len(m.join) {
				t.Fatalf("budget has %d members, %d queues hold requests", members, len(m.join))
			}
		}
	})
}

func statsEqual(a, b Stats) bool {
	return a.Requests == b.Requests && a.Bytes == b.Bytes && slices.Equal(a.Bands, b.Bands)
}

// Controllers of several models sharing a budget, under concurrent
// clients that flood, wait, go away and are displaced across models:
// every request is answered, and the budget is empty at the end (run
// with -race).
func TestBudgetControllersConcurrent(t *testing.T) {
	b, err := NewBudget(Limits{MaxRequests: 6})
	require.NoError(t, err)
	var ctls []*Controller[int]
	var ss []*slots
	for i := 0; i < 3; i++ {
		s := &slots{}
		ctl, _ := startController(t, Config{Budget: b}, s)
		ctls, ss = append(ctls, ctl), append(ss, s)
	}
	// Each model frees a slot at a time, as fast as the scheduler lets
	// this loop run, while the clients flood.
	stop := make(chan struct{})
	released := make(chan struct{})
	go func() {
		defer close(released)
		for {
			select {
			case <-stop:
				return
			default:
			}
			for m, s := range ss {
				s.mu.Lock()
				s.free = 1
				s.mu.Unlock()
				ctls[m].Kick()
			}
			runtime.Gosched()
		}
	}()
	var bound, displaced, full, gone atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < 300; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := i % 3
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if i%7 == 0 {
				cancel() // a client that goes away at once
			}
			err := ctls[m].Hold(ctx, Request[int]{Value: i, Flow: string(rune('a' + i%4)), Priority: i % 2})
			switch {
			case err == nil:
				bound.Add(1)
			case errors.Is(err, ErrDisplaced):
				displaced.Add(1)
			case errors.Is(err, ErrFull):
				full.Add(1)
			case errors.Is(err, context.Canceled):
				gone.Add(1)
			default:
				t.Errorf("request %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-released
	assert.Equal(t, int64(300), bound.Load()+displaced.Load()+full.Load()+gone.Load())
	n, bytes := b.Held()
	assert.Equal(t, []any{0, int64(0)}, []any{n, bytes})
	b.mu.Lock()
	assert.Empty(t, b.members)
	b.mu.Unlock()
	t.Logf("bound %d, displaced %d, refused %d, gone %d", bound.Load(), displaced.Load(), full.Load(), gone.Load())
}

// hookMember is a member whose evict calls before and after around the
// queue's own, once each: an interleaving of other pushes with a reclaim.
type hookMember struct {
	*Queue[string]
	before, after func()
}

func (h *hookMember) evict(prio int, o offer, b *Budget, bytes int64) (func(), bool, bool) {
	if f := h.before; f != nil {
		h.before = nil
		f()
	}
	answer, ok, stale := h.Queue.evict(prio, o, b, bytes)
	if f := h.after; f != nil {
		h.after = nil
		f()
	}
	return answer, ok, stale
}

// hook puts h in q's place among b's members.
func hook(t *testing.T, b *Budget, q *Queue[string], h *hookMember) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, m := range b.members {
		if m == member(q) {
			b.members[i] = h
			return
		}
	}
	t.Fatal("not a member")
}

// A request reclaiming room past the budget keeps its room in its own
// queue meanwhile: another push there cannot take it, so the request
// displaced is never displaced for a request then refused.
func TestReclaimKeepsItsRoom(t *testing.T) {
	b, err := NewBudget(Limits{MaxRequests: 2})
	require.NoError(t, err)
	q := mustNew[string](t, Config{Budget: b, Total: Limits{MaxRequests: 1}})
	x := mustNew[string](t, Config{Budget: b})
	z := mustNew[string](t, Config{Budget: b})
	var gone []string
	out := func(v string) { gone = append(gone, v) }
	_, err = x.Push(Request[string]{Value: "x1"}, t0, out)
	require.NoError(t, err)
	_, err = z.Push(Request[string]{Value: "z1"}, t0, out)
	require.NoError(t, err)
	var q2 error
	hook(t, b, x, &hookMember{Queue: x, after: func() {
		_, ok := z.Next(func(string) bool { return true }) // another model dispatches
		require.True(t, ok)
		_, q2 = q.Push(Request[string]{Value: "q2"}, t0, out) // another client of q's model
	}})
	_, err = q.Push(Request[string]{Value: "r", Priority: 1}, t0, out)
	require.NoError(t, err, "r, which displaced x1, is held")
	var fe *FullError
	require.ErrorAs(t, q2, &fe, "q2 finds r's room kept")
	assert.Equal(t, "total", fe.Scope)
	assert.Equal(t, []string{"x1"}, gone)
	assert.Equal(t, []string{"r"}, drainStr(q))
}

// Two pushes that choose the same request: the second, finding it gone,
// looks again and displaces the next the rule names.
func TestReclaimLooksAgain(t *testing.T) {
	b, err := NewBudget(Limits{MaxRequests: 6})
	require.NoError(t, err)
	x := mustNew[string](t, Config{Budget: b})
	y := mustNew[string](t, Config{Budget: b})
	p1 := mustNew[string](t, Config{Budget: b})
	p2 := mustNew[string](t, Config{Budget: b})
	var gone []string
	out := func(v string) { gone = append(gone, v) }
	for i := 1; i <= 3; i++ {
		_, err = x.Push(Request[string]{Value: fmt.Sprint("f", i), Flow: "f"}, t0, out)
		require.NoError(t, err)
		_, err = y.Push(Request[string]{Value: fmt.Sprint("g", i), Flow: "g"}, t0, out)
		require.NoError(t, err)
	}
	var err1 error
	hook(t, b, x, &hookMember{Queue: x, before: func() {
		_, err1 = p1.Push(Request[string]{Value: "a", Flow: "a"}, t0, out)
	}})
	_, err2 := p2.Push(Request[string]{Value: "b", Flow: "b"}, t0, out)
	require.NoError(t, err1)
	require.NoError(t, err2, "g is still two longer than b's flow")
	assert.Equal(t, []string{"f3", "g3"}, gone)
}

// A queue that swaps its only held request for another of its own, by its
// own bound (a local swap) or past the budget (Budget.reclaim choosing
// it), never empties, and keeps its place among the budget's members: of
// equal candidates, the queue that started holding first gives one up.
func TestSwapKeepsMembership(t *testing.T) {
	for _, tc := range []struct {
		name   string
		aTotal Limits // queue a's own bound
	}{
		{"local swap, a's own bound", Limits{MaxRequests: 1}},
		{"reclaim past the budget", Limits{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := NewBudget(Limits{MaxRequests: 2})
			require.NoError(t, err)
			a := mustNew[string](t, Config{Budget: b, Total: tc.aTotal})
			bq := mustNew[string](t, Config{Budget: b})
			c := mustNew[string](t, Config{Budget: b})
			var gone []string
			out := func(v string) { gone = append(gone, v) }
			push := func(q *Queue[string], v string, prio int) {
				_, err := q.Push(Request[string]{Value: v, Priority: prio}, t0, out)
				require.NoError(t, err, v)
			}
			push(a, "a1", 0)
			push(bq, "b1", 1)
			push(a, "a2", 1) // a1, the lowest band's, gives way to a2
			n, _ := b.Held()
			assert.Equal(t, 2, n)
			assert.Equal(t, []string{"a1"}, gone)
			push(c, "c1", 2) // a2 and b1 are equal candidates: a started holding first
			assert.Equal(t, []string{"a1", "a2"}, gone)
		})
	}
}

// TestNewBudgetNamesField: a negative limit is refused naming the field
// and its value, not the whole struct.
func TestNewBudgetNamesField(t *testing.T) {
	for _, tc := range []struct {
		l    Limits
		want string
	}{
		{Limits{MaxBytes: -1}, "MaxBytes -1"},
		{Limits{MaxRequests: -2}, "MaxRequests -2"},
		{Limits{MaxBytes: -3, MaxRequests: 5}, "MaxBytes -3"},
	} {
		_, err := NewBudget(tc.l)
		require.ErrorIs(t, err, ErrInvalid)
		require.Contains(t, err.Error(), tc.want)
	}
}

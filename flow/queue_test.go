package flow

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

var t0 = time.Unix(1_000_000, 0)

func mustNew[T any](t testing.TB, c Config) *Queue[T] {
	t.Helper()
	q, err := New[T](c)
	require.NoError(t, err)
	return q
}

func always(int) bool { return true }

func drain(q *Queue[int], room func(int) bool) []int {
	var out []int
	for {
		v, ok := q.Next(room)
		if !ok {
			return out
		}
		out = append(out, v)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, tc := range []struct {
		c    Config
		want string
	}{
		{Config{Total: Limits{MaxBytes: -1}}, "Total.MaxBytes -1"},
		{Config{Total: Limits{MaxRequests: -2}}, "Total.MaxRequests -2"},
		{Config{Band: Limits{MaxBytes: -3}}, "Band.MaxBytes -3"},
		{Config{Band: Limits{MaxRequests: -4}}, "Band.MaxRequests -4"},
		{Config{TTL: -time.Second}, "TTL -1s"},
		{Config{MaxFlows: -5}, "MaxFlows -5"},
		{Config{Order: 7}, "Order 7"},
		{Config{Fairness: 9}, "Fairness 9"},
	} {
		_, err := New[int](tc.c)
		require.ErrorIs(t, err, ErrInvalid)
		assert.Contains(t, err.Error(), tc.want)
	}
	q := mustNew[int](t, Config{})
	c := q.Config()
	assert.Equal(t, Config{Total: Limits{DefaultMaxBytes, DefaultMaxRequests}, Band: Limits{DefaultMaxBytes, DefaultMaxRequests}, TTL: DefaultTTL, MaxFlows: DefaultMaxFlows}, c)
}

func TestPushRefusals(t *testing.T) {
	q := mustNew[int](t, Config{Total: Limits{MaxBytes: 100, MaxRequests: 3}, Band: Limits{MaxBytes: 60, MaxRequests: 2}})
	_, err := q.Push(Request[int]{Bytes: -1}, t0, nil)
	require.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), "Bytes -1")
	_, err = q.Push(Request[int]{Flow: string(make([]byte, MaxFlowID+1))}, t0, nil)
	require.ErrorIs(t, err, ErrInvalid)
	_, err = q.Push(Request[int]{Priority: -1}, t0, nil)
	require.ErrorIs(t, err, ErrSheddable)
	assert.Equal(t, 0, q.Len(), "refusals hold nothing")

	_, err = q.Push(Request[int]{Value: 1, Bytes: 50}, t0, nil)
	require.NoError(t, err)
	var fe *FullError
	_, err = q.Push(Request[int]{Value: 2, Bytes: 11}, t0, nil)
	require.ErrorAs(t, err, &fe)
	require.ErrorIs(t, err, ErrFull)
	assert.Equal(t, FullError{Scope: "band", Resource: "bytes", Priority: 0, Held: 50, Max: 60, Bytes: 11}, *fe)
	_, err = q.Push(Request[int]{Value: 2, Bytes: 10}, t0, nil)
	require.NoError(t, err)
	_, err = q.Push(Request[int]{Value: 3}, t0, nil)
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, "band", fe.Scope)
	assert.Equal(t, "requests", fe.Resource)
	_, err = q.Push(Request[int]{Value: 3, Priority: 1, Bytes: 41}, t0, nil)
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, FullError{Scope: "total", Resource: "bytes", Priority: 1, Held: 60, Max: 100, Bytes: 41}, *fe)
	_, err = q.Push(Request[int]{Value: 3, Priority: 1}, t0, nil)
	require.NoError(t, err)
	_, err = q.Push(Request[int]{Value: 4, Priority: 2}, t0, nil)
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, "total", fe.Scope)
	assert.Equal(t, "requests", fe.Resource)
	assert.Equal(t, Stats{Requests: 3, Bytes: 60, Bands: []BandStats{{Priority: 1, Requests: 1, Flows: 1}, {Priority: 0, Requests: 2, Flows: 1, Bytes: 60}}}, q.Stats())
}

func TestStrictPriorityAndOrder(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Config
		want []int
	}{
		// Values: priority*100 + arrival. Flow a: 1, 3; flow b: 2, 4 (band 0);
		// band 5: 501 (flow a), 502 (flow b).
		{"fcfs round-robin", Config{}, []int{501, 502, 1, 2, 3, 4}},
		{"global strict", Config{Fairness: GlobalStrict}, []int{501, 502, 1, 2, 3, 4}},
		// EDF: deadlines 4, 3, 2, 1 s for 1..4.
		{"edf round-robin", Config{Order: EDF}, []int{501, 502, 3, 4, 1, 2}},
		{"edf global strict", Config{Order: EDF, Fairness: GlobalStrict}, []int{502, 501, 4, 3, 2, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := mustNew[int](t, tc.c)
			push := func(v int, flow string, prio int, dl time.Duration) {
				_, err := q.Push(Request[int]{Value: v, Flow: flow, Priority: prio, Deadline: t0.Add(dl)}, t0, nil)
				require.NoError(t, err)
			}
			push(1, "a", 0, 4*time.Second)
			push(2, "b", 0, 3*time.Second)
			push(3, "a", 0, 2*time.Second)
			push(4, "b", 0, 1*time.Second)
			push(501, "a", 5, 9*time.Second)
			push(502, "b", 5, 8*time.Second)
			assert.Equal(t, tc.want, drain(q, always))
			assert.Equal(t, Stats{Bands: []BandStats{}}, q.Stats())
		})
	}
}

// EDF orders deadlines past UnixNano's range too: a request whose
// deadline is the year 9999 (a "never") goes after one due in a second,
// and one due in the year 1000 before it (UnixNano wrapped: the year 9999
// went first).
func TestEDFFarDeadlines(t *testing.T) {
	for _, f := range []Fairness{RoundRobin, GlobalStrict} {
		q := mustNew[string](t, Config{Order: EDF, Fairness: f})
		for _, r := range []Request[string]{
			{Value: "9999", Flow: "a", Deadline: time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)},
			{Value: "soon", Flow: "a", Deadline: t0.Add(time.Second)},
			{Value: "1000", Flow: "a", Deadline: time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC)},
		} {
			_, err := q.Push(r, t0, nil)
			require.NoError(t, err)
		}
		var got []string
		for {
			v, ok := q.Next(func(string) bool { return true })
			if !ok {
				break
			}
			got = append(got, v)
		}
		assert.Equal(t, []string{"1000", "soon", "9999"}, got, "fairness %d", f)
	}
}

// A request without room does not hold the others: a lower band's request
// with room goes while the higher one waits, and a flow's head without
// room passes the turn.
func TestWorkConserving(t *testing.T) {
	q := mustNew[int](t, Config{})
	for _, r := range []Request[int]{{Value: 10, Priority: 1, Flow: "x"}, {Value: 1, Flow: "a"}, {Value: 2, Flow: "b"}, {Value: 3, Flow: "a"}} {
		_, err := q.Push(r, t0, nil)
		require.NoError(t, err)
	}
	noTen := func(v int) bool { return v != 10 }
	notA := func(v int) bool { return v != 1 && v != 3 }
	v, ok := q.Next(notA)
	require.True(t, ok)
	assert.Equal(t, 10, v, "the higher band first")
	v, ok = q.Next(notA)
	require.True(t, ok)
	assert.Equal(t, 2, v, "flow a's head has no room: b goes")
	_, ok = q.Next(notA)
	assert.False(t, ok, "only a's requests are left, without room")
	assert.Equal(t, []int{1, 3}, drain(q, noTen))
}

// Next calls room, which binds the request it has room for (the fronts
// route it), with true at most once, for the request it returns. With
// GlobalStrict, flow a comes first in turn order but, once its first
// request has gone, b's head is older: asking a's head first must not
// bind it.
func TestNextBindsOnlyWhatItReturns(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want []int
	}{
		{"round robin", Config{}, []int{1, 2, 3}},
		{"global strict", Config{Fairness: GlobalStrict}, []int{1, 2, 3}},
		{"edf global strict", Config{Order: EDF, Fairness: GlobalStrict}, []int{1, 2, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := mustNew[int](t, tc.cfg)
			for i, f := range []string{"a", "b", "a"} {
				_, err := q.Push(Request[int]{Value: i + 1, Flow: f, Deadline: t0.Add(time.Duration(i+1) * time.Second)}, t0, nil)
				require.NoError(t, err)
			}
			var got []int
			for {
				var bound []int
				v, ok := q.Next(func(v int) bool { bound = append(bound, v); return true })
				if !ok {
					break
				}
				got = append(got, v)
				assert.Equal(t, []int{v}, bound, "room was asked about (and so bound) only the request dispatched")
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestExpireAndRemove(t *testing.T) {
	q := mustNew[int](t, Config{TTL: 5 * time.Second})
	h1, err := q.Push(Request[int]{Value: 1}, t0, nil) // deadline t0+5s
	require.NoError(t, err)
	_, err = q.Push(Request[int]{Value: 2, Deadline: t0.Add(2 * time.Second)}, t0, nil)
	require.NoError(t, err)
	h3, err := q.Push(Request[int]{Value: 3, Flow: "z", Deadline: t0.Add(time.Second)}, t0, nil)
	require.NoError(t, err)
	dl, ok := q.NextDeadline()
	require.True(t, ok)
	assert.Equal(t, t0.Add(time.Second), dl)

	assert.True(t, q.Remove(h3))
	assert.False(t, q.Remove(h3), "removed once")
	assert.False(t, q.Remove(Handle[int]{}))
	var got []int
	assert.Equal(t, 1, q.Expire(t0.Add(2*time.Second), func(v int) { got = append(got, v) }))
	assert.Equal(t, []int{2}, got)
	v, ok := q.Next(always)
	require.True(t, ok)
	assert.Equal(t, 1, v)
	assert.False(t, q.Remove(h1), "dispatched requests are not held")
	assert.Equal(t, 0, q.Expire(t0.Add(time.Hour), nil))
	_, ok = q.NextDeadline()
	assert.False(t, ok)
}

func TestFlowsBounded(t *testing.T) {
	q := mustNew[int](t, Config{MaxFlows: 3})
	for i := 0; i < 100; i++ {
		_, err := q.Push(Request[int]{Value: i, Flow: fmt.Sprint("tenant-", i)}, t0, nil)
		require.NoError(t, err)
	}
	s := q.Stats()
	assert.Equal(t, 4, s.Bands[0].Flows, "three named flows and the overflow")
	assert.Equal(t, 100, s.Requests)
	assert.Len(t, drain(q, always), 100)
}

// TestPropRoundRobinFair: flows of one band, always with room, take turns:
// while they all stay backlogged, their dispatch counts differ by at most
// one, whatever the order and sizes of their backlogs.
func TestPropRoundRobinFair(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		q, _ := New[string](Config{})
		flows := rapid.IntRange(1, 6).Draw(t, "flows")
		backlog := make([]int, flows)
		for i := range backlog {
			backlog[i] = rapid.IntRange(1, 12).Draw(t, "backlog")
		}
		// Interleave the pushes in a drawn order.
		left := append([]int(nil), backlog...)
		for total := sum(left); total > 0; total-- {
			f := rapid.IntRange(0, flows-1).Draw(t, "flow")
			for left[f] == 0 {
				f = (f + 1) % flows
			}
			left[f]--
			_, err := q.Push(Request[string]{Value: fmt.Sprint(f), Flow: fmt.Sprint(f)}, t0, nil)
			if err != nil {
				t.Fatal(err)
			}
		}
		count := make(map[string]int)
		for {
			v, ok := q.Next(func(string) bool { return true })
			if !ok {
				break
			}
			count[v]++
			// Among flows still backlogged before this dispatch, counts
			// differ by at most one.
			min, max := -1, -1
			for f := 0; f < flows; f++ {
				k := fmt.Sprint(f)
				if count[k] > backlog[f] {
					t.Fatalf("flow %s dispatched %d of %d", k, count[k], backlog[f])
				}
				if count[k] == backlog[f] && v != k {
					continue // drained earlier
				}
				if min < 0 || count[k] < min {
					min = count[k]
				}
				if count[k] > max {
					max = count[k]
				}
			}
			if max-min > 1 {
				t.Fatalf("counts %v over backlogs %v: spread %d", count, backlog, max-min)
			}
		}
		for f := 0; f < flows; f++ {
			if count[fmt.Sprint(f)] != backlog[f] {
				t.Fatalf("flow %d: %d of %d dispatched", f, count[fmt.Sprint(f)], backlog[f])
			}
		}
	})
}

func sum(s []int) int {
	n := 0
	for _, v := range s {
		n += v
	}
	return n
}

// model is the plain reference the queue is checked against: every held
// request in a list, each rule a scan.
type model struct {
	held []mreq
}

type mreq struct {
	v, prio  int
	flow     string
	bytes    int64
	deadline time.Time
	seq      int
	h        Handle[int]
}

// before reports whether r comes before c in their flow's order.
func (m *model) before(r, c mreq, order Order) bool {
	if order == EDF && !r.deadline.Equal(c.deadline) {
		return r.deadline.Before(c.deadline)
	}
	return r.seq < c.seq
}

// heads returns, per (band, flow), the request that comes first in it.
func (m *model) heads(order Order, flowOf func(mreq) string) map[[2]string]mreq {
	h := make(map[[2]string]mreq)
	for _, r := range m.held {
		k := [2]string{fmt.Sprint(r.prio), flowOf(r)}
		c, ok := h[k]
		if !ok || m.before(r, c, order) {
			h[k] = r
		}
	}
	return h
}

// flows returns the flows of band prio holding requests.
func (m *model) flows(prio int, assigned map[int]string) map[string]bool {
	f := map[string]bool{}
	for _, o := range m.held {
		if o.prio == prio {
			f[assigned[o.v]] = true
		}
	}
	return f
}

// fits reports whether r fits every limit with request without (0: none)
// taken out.
func (m *model) fits(cfg Config, r mreq, without int) bool {
	var tb, bb int64
	tn, bn := 0, 0
	for _, o := range m.held {
		if o.v == without {
			continue
		}
		tn++
		tb += o.bytes
		if o.prio == r.prio {
			bn++
			bb += o.bytes
		}
	}
	return tn+1 <= cfg.Total.MaxRequests && tb+r.bytes <= cfg.Total.MaxBytes && bn+1 <= cfg.Band.MaxRequests && bb+r.bytes <= cfg.Band.MaxBytes
}

// victims returns the requests Push's rule lets r displace: the last of a
// longest flow of the lowest band below r's when only the total is
// broken and such a band exists; else the last of a longest flow of r's
// band holding two more than r's flow.
func (m *model) victims(cfg Config, r mreq, own string, assigned map[int]string) map[int]bool {
	length := map[[2]string]int{}
	last := map[[2]string]mreq{}
	lowest := r.prio
	var bb int64
	bn := 0
	for _, o := range m.held {
		k := [2]string{fmt.Sprint(o.prio), assigned[o.v]}
		length[k]++
		l, ok := last[k]
		if !ok || m.before(l, o, cfg.Order) {
			last[k] = o
		}
		if o.prio < lowest {
			lowest = o.prio
		}
		if o.prio == r.prio {
			bn++
			bb += o.bytes
		}
	}
	bandOK := bn+1 <= cfg.Band.MaxRequests && bb+r.bytes <= cfg.Band.MaxBytes
	pick := func(prio, atLeast int) map[int]bool {
		max := 0
		for k, n := range length {
			if k[0] == fmt.Sprint(prio) && n > max {
				max = n
			}
		}
		out := map[int]bool{}
		if max < atLeast || max == 0 {
			return out
		}
		for k, n := range length {
			if k[0] == fmt.Sprint(prio) && n == max {
				out[last[k].v] = true
			}
		}
		return out
	}
	if bandOK && lowest < r.prio {
		return pick(lowest, 1)
	}
	return pick(r.prio, length[[2]string{fmt.Sprint(r.prio), own}]+2)
}

func (m *model) drop(v int) {
	for i, r := range m.held {
		if r.v == v {
			m.held = append(m.held[:i], m.held[i+1:]...)
			return
		}
	}
}

// TestPropQueueMatchesModel drives a queue and the model with the same
// random operations and checks every answer: refusals exactly at the
// bounds; Next returns a flow's head with room, from the highest band that
// has one, and returns nothing only when no head has room (work-conserving);
// GlobalStrict's pick is the first such head by the order; Expire returns
// exactly the requests past their deadline; Remove reports whether the
// request was held; Stats agrees with the model.
func TestPropQueueMatchesModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := Config{
			Total:    Limits{MaxBytes: rapid.Int64Range(1, 400).Draw(t, "totalBytes"), MaxRequests: rapid.IntRange(1, 30).Draw(t, "totalReqs")},
			Band:     Limits{MaxBytes: rapid.Int64Range(1, 400).Draw(t, "bandBytes"), MaxRequests: rapid.IntRange(1, 30).Draw(t, "bandReqs")},
			MaxFlows: rapid.IntRange(1, 4).Draw(t, "maxFlows"),
			Order:    Order(rapid.IntRange(0, 1).Draw(t, "order")),
			Fairness: Fairness(rapid.IntRange(0, 1).Draw(t, "fairness")),
			TTL:      time.Duration(rapid.IntRange(1, 20).Draw(t, "ttl")) * time.Second,
		}
		displace := rapid.Bool().Draw(t, "displace")
		q, err := New[int](cfg)
		if err != nil {
			t.Fatal(err)
		}
		var m model
		now := t0
		seq := 0
		// flowOf maps a request to the flow the queue put it in: its own
		// id, or the overflow when its band had MaxFlows others when it
		// arrived. The model records it at push time.
		assigned := map[int]string{}
		flowOf := func(r mreq) string { return assigned[r.v] }
		var handles []mreq
		for step := 0; step < 60; step++ {
			switch rapid.IntRange(0, 4).Draw(t, "op") {
			case 0, 1: // push
				seq++
				r := mreq{v: seq, prio: rapid.IntRange(-1, 2).Draw(t, "prio"), flow: rapid.SampledFrom([]string{"a", "b", "c", "d", "e", ""}).Draw(t, "flow"),
					bytes: rapid.Int64Range(0, 120).Draw(t, "bytes"), seq: seq}
				var dl time.Time
				switch rapid.IntRange(0, 5).Draw(t, "deadline") {
				case 0, 1, 2:
					dl = now.Add(time.Duration(rapid.IntRange(0, 20).Draw(t, "dl")) * time.Second)
				case 3: // past UnixNano's range
					dl = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
				}
				var gone []int
				var onDisplace func(int)
				if displace {
					onDisplace = func(v int) { gone = append(gone, v) }
				}
				h, err := q.Push(Request[int]{Value: r.v, Flow: r.flow, Priority: r.prio, Bytes: r.bytes, Deadline: dl}, now, onDisplace)
				if dl.IsZero() {
					dl = now.Add(cfg.TTL)
				}
				r.deadline = dl
				own := r.flow
				if !m.flows(r.prio, assigned)[own] && len(m.flows(r.prio, assigned)) >= cfg.MaxFlows {
					own = OverflowFlow
				}
				fitsWithout := func(v int) bool { return m.fits(cfg, r, v) }
				switch {
				case r.prio < 0:
					if !errors.Is(err, ErrSheddable) {
						t.Fatalf("push %+v: got %v, want ErrSheddable", r, err)
					}
				case fitsWithout(0):
					if err != nil || len(gone) != 0 {
						t.Fatalf("push %+v fits: got %v, displaced %v", r, err, gone)
					}
				case err == nil:
					// It displaced one request, by the rule, and then fits.
					cands := m.victims(cfg, r, own, assigned)
					if len(gone) != 1 || !cands[gone[0]] || !fitsWithout(gone[0]) {
						t.Fatalf("push %+v displaced %v; the rule allows %v", r, gone, cands)
					}
					m.drop(gone[0])
				default:
					if !errors.Is(err, ErrFull) || len(gone) != 0 {
						t.Fatalf("push %+v: got %v, displaced %v", r, err, gone)
					}
					if displace {
						for v := range m.victims(cfg, r, own, assigned) {
							if fitsWithout(v) && len(m.victims(cfg, r, own, assigned)) == 1 {
								t.Fatalf("push %+v refused though displacing %d makes room", r, v)
							}
						}
					}
				}
				if err == nil {
					r.h = h
					assigned[r.v] = own
					m.held = append(m.held, r)
					handles = append(handles, r)
				}
			case 2: // next, with room for a drawn subset
				mask := rapid.IntRange(0, 15).Draw(t, "roomMask")
				room := func(v int) bool { return mask&(1<<(v%4)) != 0 }
				heads := m.heads(cfg.Order, flowOf)
				bestPrio := -1
				for _, h := range heads {
					if room(h.v) && h.prio > bestPrio {
						bestPrio = h.prio
					}
				}
				// room binds what it says has room (the fronts route the
				// request): Next says yes at most once, for what it returns.
				var yes []int
				v, ok := q.Next(func(v int) bool {
					r := room(v)
					if r {
						yes = append(yes, v)
					}
					return r
				})
				if len(yes) > 1 || (len(yes) == 1 && (!ok || yes[0] != v)) {
					t.Fatalf("next had room from %v and gave %d (%v): it bound requests it did not dispatch", yes, v, ok)
				}
				if bestPrio < 0 {
					if ok {
						t.Fatalf("next gave %d though no head has room", v)
					}
					continue
				}
				if !ok {
					t.Fatalf("next gave nothing though a head of band %d has room", bestPrio)
				}
				var got mreq
				found := false
				for _, h := range heads {
					if h.v == v {
						got, found = h, true
					}
				}
				if !found || !room(v) || got.prio != bestPrio {
					t.Fatalf("next gave %d (head %v, band %d), want a head with room of band %d", v, found, got.prio, bestPrio)
				}
				if cfg.Fairness == GlobalStrict {
					for _, h := range heads {
						if h.prio == bestPrio && room(h.v) && m.before(h, got, cfg.Order) {
							t.Fatalf("global strict gave %d before %d", v, h.v)
						}
					}
				}
				m.drop(v)
			case 3: // time passes, expire
				now = now.Add(time.Duration(rapid.IntRange(0, 8).Draw(t, "advance")) * time.Second)
				want := map[int]bool{}
				for _, r := range m.held {
					if !r.deadline.After(now) {
						want[r.v] = true
					}
				}
				var last time.Time
				n := q.Expire(now, func(v int) {
					if !want[v] {
						t.Fatalf("expired %d before its deadline", v)
					}
					for _, r := range m.held {
						if r.v == v {
							if r.deadline.Before(last) {
								t.Fatalf("expired out of deadline order")
							}
							last = r.deadline
						}
					}
					delete(want, v)
					m.drop(v)
				})
				if len(want) > 0 || n < 0 {
					t.Fatalf("not expired: %v", want)
				}
			case 4: // a client goes away
				if len(handles) == 0 {
					continue
				}
				r := handles[rapid.IntRange(0, len(handles)-1).Draw(t, "which")]
				held := false
				for _, o := range m.held {
					held = held || o.v == r.v
				}
				if got := q.Remove(r.h); got != held {
					t.Fatalf("remove %d: %v, held %v", r.v, got, held)
				}
				m.drop(r.v)
			}
			// The counts agree, and no bound is passed.
			s := q.Stats()
			var tb int64
			for _, r := range m.held {
				tb += r.bytes
			}
			if s.Requests != len(m.held) || s.Bytes != tb || q.Len() != len(m.held) {
				t.Fatalf("stats %+v, model %d requests %d bytes", s, len(m.held), tb)
			}
			if s.Requests > cfg.Total.MaxRequests || s.Bytes > cfg.Total.MaxBytes {
				t.Fatalf("over the total: %+v", s)
			}
			for i, b := range s.Bands {
				if b.Requests > cfg.Band.MaxRequests || b.Bytes > cfg.Band.MaxBytes || b.Flows > cfg.MaxFlows+1 || b.Requests == 0 {
					t.Fatalf("band %+v out of bounds", b)
				}
				if i > 0 && s.Bands[i-1].Priority <= b.Priority {
					t.Fatalf("bands out of order: %+v", s.Bands)
				}
			}
		}
	})
}

// A flood fills the queue only until another flow arrives: the quiet
// flow's requests displace the flood's newest, and a higher band's
// displace a lower band's.
func TestDisplacement(t *testing.T) {
	q := mustNew[int](t, Config{Total: Limits{MaxRequests: 4}})
	var gone []int
	out := func(v int) { gone = append(gone, v) }
	for v := 1; v <= 4; v++ {
		_, err := q.Push(Request[int]{Value: v, Flow: "noisy"}, t0, out)
		require.NoError(t, err)
	}
	_, err := q.Push(Request[int]{Value: 5, Flow: "noisy"}, t0, out)
	require.ErrorIs(t, err, ErrFull, "the longest flow displaces no one")
	_, err = q.Push(Request[int]{Value: 10, Flow: "quiet"}, t0, out)
	require.NoError(t, err)
	_, err = q.Push(Request[int]{Value: 11, Flow: "quiet"}, t0, out)
	require.NoError(t, err)
	_, err = q.Push(Request[int]{Value: 12, Flow: "quiet"}, t0, out)
	require.ErrorIs(t, err, ErrFull, "two each: displacing would not even them")
	assert.Equal(t, []int{4, 3}, gone)
	_, err = q.Push(Request[int]{Value: 100, Flow: "noisy", Priority: 1}, t0, out)
	require.NoError(t, err)
	assert.Equal(t, []int{4, 3, 2}, gone, "the higher band displaces the lower band's longest flow")
	_, err = q.Push(Request[int]{Value: 13, Flow: "quiet"}, t0, nil)
	require.ErrorIs(t, err, ErrFull, "no displacement without a callback")
	assert.Equal(t, []int{100, 1, 10, 11}, drain(q, always))
}

// A request whose own flow is idle while MaxFlows are backlogged joins the
// overflow flow, and displacement weighs that flow, the one it joins: with
// one flow allowed, "a" idle and the overflow flow holding b1 and a2 (the
// queue full), a3 would join the overflow flow too and displaces no one
// (it displaced a2 when the rule weighed the idle "a").
func TestDisplacementWeighsTheFlowJoined(t *testing.T) {
	q := mustNew[string](t, Config{MaxFlows: 1, Total: Limits{MaxRequests: 2}})
	var gone []string
	out := func(v string) { gone = append(gone, v) }
	for _, r := range []Request[string]{{Value: "a1", Flow: "a"}, {Value: "b1", Flow: "b"}} {
		_, err := q.Push(r, t0, out)
		require.NoError(t, err)
	}
	v, ok := q.Next(func(v string) bool { return v == "a1" })
	require.True(t, ok)
	require.Equal(t, "a1", v, "a empties: idle")
	_, err := q.Push(Request[string]{Value: "a2", Flow: "a"}, t0, out)
	require.NoError(t, err)
	_, err = q.Push(Request[string]{Value: "a3", Flow: "a"}, t0, out)
	require.ErrorIs(t, err, ErrFull)
	assert.Empty(t, gone)
}

// Queues sharing a Budget hold no more together than it allows; a request
// past it gets a global FullError, and what leaves gives its share back.
func TestBudgetShared(t *testing.T) {
	_, err := NewBudget(Limits{MaxBytes: -1})
	require.ErrorIs(t, err, ErrInvalid)
	b, err := NewBudget(Limits{MaxRequests: 3, MaxBytes: 100})
	require.NoError(t, err)
	qa := mustNew[int](t, Config{Budget: b})
	qb := mustNew[int](t, Config{Budget: b})
	_, err = qa.Push(Request[int]{Value: 1, Bytes: 40}, t0, nil)
	require.NoError(t, err)
	hb, err := qb.Push(Request[int]{Value: 2, Bytes: 40}, t0, nil)
	require.NoError(t, err)
	var fe *FullError
	_, err = qb.Push(Request[int]{Value: 3, Bytes: 30}, t0, nil)
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, FullError{Scope: "global", Resource: "bytes", Held: 80, Max: 100, Bytes: 30}, *fe)
	_, err = qa.Push(Request[int]{Value: 4, Bytes: 20}, t0, nil)
	require.NoError(t, err)
	_, err = qa.Push(Request[int]{Value: 5}, t0, nil)
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, "requests", fe.Resource)
	assert.True(t, qb.Remove(hb))
	n, bytes := b.Held()
	assert.Equal(t, []any{2, int64(60)}, []any{n, bytes})
	assert.Equal(t, []int{1, 4}, drain(qa, always))
	qa.Expire(t0.Add(time.Hour), nil)
	n, bytes = b.Held()
	assert.Equal(t, []any{0, int64(0)}, []any{n, bytes})
	// Displacement within a queue counts the displaced one's share.
	qc := mustNew[int](t, Config{Budget: b, Total: Limits{MaxRequests: 2}})
	for v := 10; v < 12; v++ {
		_, err = qc.Push(Request[int]{Value: v, Flow: "noisy", Bytes: 50}, t0, nil)
		require.NoError(t, err)
	}
	var gone []int
	_, err = qc.Push(Request[int]{Value: 20, Flow: "quiet", Bytes: 50}, t0, func(v int) { gone = append(gone, v) })
	require.NoError(t, err)
	assert.Equal(t, []int{11}, gone)
	n, bytes = b.Held()
	assert.Equal(t, []any{2, int64(100)}, []any{n, bytes})
}

package gateway

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// drawCands draws n CacheAware candidates with small random signals, so
// that ties and the load guard both happen.
func drawCands(t *rapid.T, n, keyLen int) []Candidate {
	cs := make([]Candidate, n)
	for i := range cs {
		cs[i] = Candidate{
			Name:            fmt.Sprintf("r%d", i),
			Matched:         rapid.IntRange(0, keyLen).Draw(t, "matched"),
			InFlight:        rapid.IntRange(0, 6).Draw(t, "inflight"),
			PendingPrefill:  rapid.IntRange(0, 60).Draw(t, "pending"),
			AssignedPrefill: rapid.IntRange(0, 3).Draw(t, "assigned"),
			LastPicked:      rapid.Uint64Range(0, 3).Draw(t, "last"),
			Load: Load{
				QueueDepth: rapid.IntRange(0, 4).Draw(t, "queue"),
				Running:    rapid.IntRange(0, 4).Draw(t, "running"),
			},
		}
	}
	return cs
}

func drawCacheAware(t *rapid.T) *CacheAware {
	return &CacheAware{
		Externality:  rapid.SampledFrom([]float64{0, -1, 0.5}).Draw(t, "ext"),
		DecodeWeight: rapid.SampledFrom([]float64{0, -1, 8}).Draw(t, "dw"),
		LoadFactor:   rapid.SampledFrom([]float64{0, 1.25}).Draw(t, "lf"),
	}
}

func caReqDemand(t *rapid.T, n int, cands []Candidate) *Request {
	r := caReq(n, cands)
	if r.MaxMatched > 0 {
		r.Demand = rapid.Float64Range(0, 1).Draw(t, "demand")
	}
	return r
}

// Load.PeerPrefill is priced exactly as the gateway's own PendingPrefill:
// moving a candidate's peer prefill into its PendingPrefill never changes
// the decision. With PeerPrefill all zero this is the decision without
// peers (the sim goldens check that routing is byte-identical too).
func TestCacheAwarePeerPrefillIsPending(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 6).Draw(t, "n")
		keyLen := rapid.IntRange(1, 16).Draw(t, "keyLen")
		cs := drawCands(t, n, keyLen)
		noPeers := rapid.Bool().Draw(t, "noPeers")
		for i := range cs {
			if !noPeers {
				cs[i].Load.PeerPrefill = rapid.IntRange(0, 80).Draw(t, "peer")
			}
		}
		merged := make([]Candidate, n)
		for i, c := range cs {
			c.PendingPrefill += c.Load.PeerPrefill
			c.Load.PeerPrefill = 0
			merged[i] = c
		}
		p := drawCacheAware(t)
		req := caReqDemand(t, keyLen, cs)
		got, want := p.Pick(req, cs), p.Pick(req, merged)
		if got != want {
			t.Fatalf("with PeerPrefill: %d, as PendingPrefill: %d", got, want)
		}
	})
}

// A replica with more peer prefill is never preferred over one that is
// otherwise identical, wherever the two stand among the candidates.
func TestCacheAwarePeerPrefillNeverPreferred(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 5).Draw(t, "n")
		keyLen := rapid.IntRange(1, 16).Draw(t, "keyLen")
		cs := drawCands(t, n, keyLen)
		for i := range cs {
			cs[i].Load.PeerPrefill = rapid.IntRange(0, 40).Draw(t, "peer")
		}
		// Twin of candidate src, with more peer prefill, inserted at pos.
		src := rapid.IntRange(0, n-1).Draw(t, "src")
		twin := cs[src]
		twin.Name = "twin"
		twin.Load.PeerPrefill += rapid.IntRange(1, 80).Draw(t, "more")
		pos := rapid.IntRange(0, n).Draw(t, "pos")
		cs = append(cs[:pos], append([]Candidate{twin}, cs[pos:]...)...)
		got := drawCacheAware(t).Pick(caReqDemand(t, keyLen, cs), cs)
		if cs[got].Name == "twin" {
			t.Fatalf("picked the twin with more peer prefill (%d) over %s (%d)", twin.Load.PeerPrefill, cs[(src+boolInt(pos <= src))].Name, cs[(src+boolInt(pos <= src))].Load.PeerPrefill)
		}
	})
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// UpdateLoad carries PeerPrefill to the candidates and to Replicas, and
// rejects an out-of-range value without changing anything.
func TestUpdateLoadPeerPrefill(t *testing.T) {
	g, err := New([]Replica{{Name: "a"}, {Name: "b"}}, WithMode(ModeCacheAware))
	require.NoError(t, err)
	require.NoError(t, g.UpdateLoad("a", Load{PeerPrefill: 500}))
	// Both idle and empty: without peers "a" would win the first tie.
	d, err := g.Route(Key{1, 2, 3})
	require.NoError(t, err)
	assert.Equal(t, "b", d.Replica)
	d.Done(DoneInfo{})
	assert.Equal(t, 500, g.Replicas()[0].Load.PeerPrefill)
	for _, bad := range []int{-1, 1 << 31} {
		err := g.UpdateLoad("a", Load{PeerPrefill: bad, QueueDepth: 7})
		require.True(t, errors.Is(err, ErrInvalid), "%d: %v", bad, err)
		assert.Contains(t, err.Error(), fmt.Sprintf("PeerPrefill %d", bad))
		assert.Equal(t, Load{PeerPrefill: 500}, g.Replicas()[0].Load)
	}
}

// A load passed on with the time it was observed (Load.At) keeps that
// age: a front forwarding its peers' counts between two scrapes of the
// engine does not make a replica whose scrapes stopped look fresh to
// Admission.Staleness. Zero means now.
func TestUpdateLoadAt(t *testing.T) {
	now := time.Unix(1000, 0)
	g, err := New([]Replica{{Name: "a"}, {Name: "b"}}, WithMode(ModeCacheAware), WithClock(func() time.Time { return now }))
	require.NoError(t, err)
	scraped := now
	require.NoError(t, g.UpdateLoad("a", Load{QueueDepth: 1, Running: 2}))
	require.NoError(t, g.UpdateLoad("b", Load{QueueDepth: 9}))
	now = now.Add(time.Second)
	// a's peers' counts arrive a second later, with a's load as scraped.
	require.NoError(t, g.UpdateLoad("a", Load{QueueDepth: 1, Running: 2, PeerPrefill: 500, At: scraped}))
	assert.Equal(t, Load{QueueDepth: 1, Running: 2, PeerPrefill: 500}, g.Replicas()[0].Load)
	d, err := g.Route(Key{1, 2, 3})
	require.NoError(t, err)
	assert.Equal(t, "b", d.Replica, "a's peers' prefill counts")
	d.Done(DoneInfo{})
	// Both loads are a second old: with a 200 ms bound both are stale and
	// the rule fails open; had the push made a's fresh, a would have room
	// (queue 1 < 5) and the pool would not be saturated either way, so
	// make b fresh and full: a stale leaves no room.
	a := Admission{QueueDepth: 5, Staleness: 200 * time.Millisecond}
	assert.False(t, g.Saturated(Target{}, a), "all stale: fail open")
	require.NoError(t, g.UpdateLoad("b", Load{QueueDepth: 9}))
	assert.True(t, g.Saturated(Target{}, a), "b fresh and full, a a second old")
	require.NoError(t, g.UpdateLoad("a", Load{QueueDepth: 1, PeerPrefill: 500}))
	assert.False(t, g.Saturated(Target{}, a), "a reported now (At zero): room")
	// A time ahead of the gateway's clock counts as now: the load still
	// ages from here.
	require.NoError(t, g.UpdateLoad("a", Load{QueueDepth: 1, At: now.Add(time.Hour)}))
	now = now.Add(time.Second)
	require.NoError(t, g.UpdateLoad("b", Load{QueueDepth: 9}))
	assert.True(t, g.Saturated(Target{}, a), "a's load, reported an hour ahead, is a second old")
}

// TestUpdateLoadAtRange: a Load.At whose Unix nanoseconds overflow an
// int64 (before 1677, after 2262) is refused naming it, and changes
// nothing: before, a date before 1677 wrapped to a time far ahead, which
// counted as now, so a load of 1600 was fresh.
func TestUpdateLoadAtRange(t *testing.T) {
	now := time.Unix(1000, 0)
	g, err := New([]Replica{{Name: "a"}}, WithMode(ModeCacheAware), WithClock(func() time.Time { return now }))
	require.NoError(t, err)
	require.NoError(t, g.UpdateLoad("a", Load{QueueDepth: 1}))
	for _, at := range []time.Time{time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)} {
		err := g.UpdateLoad("a", Load{QueueDepth: 7, At: at})
		require.ErrorIs(t, err, ErrInvalid, "%v", at)
		require.Contains(t, err.Error(), "At "+at.String())
		require.Equal(t, 1, g.Replicas()[0].Load.QueueDepth, "a refused load changes nothing")
	}
	require.NoError(t, g.UpdateLoad("a", Load{QueueDepth: 2, At: time.Unix(0, 0)}))
}

package gateway

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/examlops/gateway/keys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func mustNew(t testing.TB, reps []Replica, opts ...Option) *Gateway {
	t.Helper()
	g, err := New(reps, opts...)
	require.NoError(t, err)
	return g
}

func status(t testing.TB, g *Gateway, name string) ReplicaStatus {
	t.Helper()
	for _, st := range g.Replicas() {
		if st.Name == name {
			return st
		}
	}
	t.Fatalf("no replica %q", name)
	return ReplicaStatus{}
}

// TestCacheAwareIdleAffinity: on an idle cache-aware gateway a key held
// by one replica goes to that replica. Regression test for BUG 1, fixed in 09e6776 (the load bound
// excluded every candidate when nothing was in flight, so r0 was chosen).
func TestCacheAwareIdleAffinity(t *testing.T) {
	g := mustNew(t, replicaNames(4), WithMode(ModeCacheAware), withIndex(indexExact))
	k := keys.PrefixKey("You are a helpful assistant.", "sess-42", "doc-hash")
	require.NoError(t, g.ApplyEvent("r2", CacheEvent{Kind: BlocksStored, Blocks: k}))
	d, err := g.Route(k)
	require.NoError(t, err)
	assert.Equal(t, "r2", d.Replica)
	assert.Equal(t, KindAffinity, d.Kind)
	assert.True(t, d.Hit)
	assert.Equal(t, 3, d.Matched)
	assert.Equal(t, 3, d.Blocks)
	assert.Zero(t, d.Fallback)
}

// TestRouteWarmEvictsMatchedPrefix: warming a full replica with a key
// whose matched prefix is its least recently used must not panic and must
// leave the key's first CacheBlocks blocks cached. Regression test for BUG 3, fixed in 09e6776
// (storeMatched refreshed blocks it had just evicted, and panicked).
func TestRouteWarmEvictsMatchedPrefix(t *testing.T) {
	tests := []struct {
		name  string
		reps  []Replica
		steps [][]uint64
	}{
		{"one replica", []Replica{{Name: "r0", CacheBlocks: 2}}, [][]uint64{{1, 2}, {1, 2, 3}}},
		{"prefix also held elsewhere", []Replica{{Name: "r0", CacheBlocks: 2}, {Name: "r1", CacheBlocks: 2}}, [][]uint64{{1, 2}, {1, 2}, {1, 2, 3}, {1, 2, 3}}},
		{"prefix not recently used", []Replica{{Name: "r0", CacheBlocks: 4}}, [][]uint64{{1, 2}, {7, 8}, {1, 2, 3, 4, 5}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := mustNew(t, tt.reps)
			for _, ids := range tt.steps {
				require.NotPanics(t, func() {
					d, err := g.Route(keys.AppendHashes(nil, ids))
					require.NoError(t, err)
					d.Done(DoneInfo{})
				})
			}
			for _, st := range g.Replicas() {
				assert.LessOrEqual(t, st.CachedBlocks, st.CacheBlocks)
			}
			g.mu.Lock()
			checkIndex(t, g.idx)
			g.mu.Unlock()
		})
	}
}

// TestDecisionReporting: Done frees in-flight load once, FirstToken frees
// pending prefill once, and Done after FirstToken does not free it again.
func TestDecisionReporting(t *testing.T) {
	g := mustNew(t, []Replica{{Name: "r0", Address: "http://10.0.0.7:8000"}}, withIndex(indexExact))
	k4 := keys.AppendHashes(nil, []uint64{1, 2, 3, 4})
	d1, err := g.Route(k4)
	require.NoError(t, err)
	assert.Equal(t, "http://10.0.0.7:8000", d1.Address)
	d2, err := g.Route(k4)
	require.NoError(t, err)
	st := status(t, g, "r0")
	require.Equal(t, 2, st.InFlight)
	require.Equal(t, 8, st.PendingPrefill, "two uncached 4-block prefixes")

	d1.FirstToken()
	d1.FirstToken()
	st = status(t, g, "r0")
	assert.Equal(t, 4, st.PendingPrefill, "FirstToken frees its prefill once")
	assert.Equal(t, 2, st.InFlight, "FirstToken does not end the request")

	d1.Done(DoneInfo{})
	st = status(t, g, "r0")
	assert.Equal(t, 1, st.InFlight)
	assert.Equal(t, 4, st.PendingPrefill, "Done after FirstToken frees no prefill again")

	d1.Done(DoneInfo{})
	d1.FirstToken()
	st = status(t, g, "r0")
	assert.Equal(t, 1, st.InFlight, "double Done is a no-op")
	assert.Equal(t, 4, st.PendingPrefill)

	d2.Done(DoneInfo{})
	st = status(t, g, "r0")
	assert.Zero(t, st.InFlight)
	assert.Zero(t, st.PendingPrefill, "Done without FirstToken frees the prefill")

	var zero Decision
	assert.NotPanics(t, func() { zero.Done(DoneInfo{}); zero.FirstToken() })
}

// TestStaleDecisionAfterTicketReuse: once a decision is done its ticket may
// serve a new decision; reporting on the stale copy changes nothing.
func TestStaleDecisionAfterTicketReuse(t *testing.T) {
	g := mustNew(t, replicaNames(1), withIndex(indexExact))
	k := keys.AppendHashes(nil, []uint64{1, 2, 3})
	var stale, fresh Decision
	reused := false
	for range 1000 { // the pool may drop tickets (always under -race sometimes); try until one is reused
		d, err := g.Route(k)
		require.NoError(t, err)
		d.Done(DoneInfo{})
		n, err := g.Route(k)
		require.NoError(t, err)
		if n.t == d.t {
			stale, fresh, reused = d, n, true
			break
		}
		n.Done(DoneInfo{})
	}
	require.True(t, reused, "no ticket was reused in 1000 tries")
	require.Equal(t, 1, status(t, g, "r0").InFlight)
	require.Equal(t, 3, status(t, g, "r0").PendingPrefill)

	stale.FirstToken()
	stale.Done(DoneInfo{Latency: time.Hour})
	st := status(t, g, "r0")
	assert.Equal(t, 1, st.InFlight, "stale Done freed the new decision's load")
	assert.Equal(t, 3, st.PendingPrefill, "stale FirstToken freed the new decision's prefill")
	assert.Zero(t, st.Load.Latency, "stale Done fed a latency sample")

	fresh.Done(DoneInfo{})
	st = status(t, g, "r0")
	assert.Zero(t, st.InFlight)
	assert.Zero(t, st.PendingPrefill)
}

// TestLatencySmoothing: Done feeds an exponentially weighted moving
// average (new sample weight 0.3); failed requests and zero latencies feed
// nothing; UpdateLoad with a latency replaces it, without one keeps it.
func TestLatencySmoothing(t *testing.T) {
	g := mustNew(t, replicaNames(1))
	k := keys.PrefixKey("s", "", "")
	steps := []struct {
		info DoneInfo
		want time.Duration
	}{
		{DoneInfo{Latency: 100 * time.Millisecond}, 100 * time.Millisecond},
		{DoneInfo{Latency: 200 * time.Millisecond}, 130 * time.Millisecond},
		{DoneInfo{Latency: time.Hour, Err: errors.New("reset")}, 130 * time.Millisecond},
		{DoneInfo{}, 130 * time.Millisecond},
		{DoneInfo{Latency: 30 * time.Millisecond}, 100 * time.Millisecond},
	}
	for i, s := range steps {
		d, err := g.Route(k)
		require.NoError(t, err)
		d.Done(s.info)
		assert.Equal(t, s.want, status(t, g, "r0").Load.Latency, "step %d", i)
	}
	require.NoError(t, g.UpdateLoad("r0", Load{QueueDepth: 3, Running: 2, KVUtilization: 0.5}))
	st := status(t, g, "r0")
	assert.Equal(t, Load{QueueDepth: 3, Running: 2, KVUtilization: 0.5, Latency: 100 * time.Millisecond}, st.Load)
	require.NoError(t, g.UpdateLoad("r0", Load{Latency: 7 * time.Second}))
	assert.Equal(t, Load{Latency: 7 * time.Second}, status(t, g, "r0").Load)
}

// TestSLOExclusionAndTTL: a replica over the SLO is excluded while its
// sample is fresh, eligible again once the sample is older than the TTL,
// and excluded forever with a TTL of zero.
func TestSLOExclusionAndTTL(t *testing.T) {
	for _, ttl := range []time.Duration{time.Minute, 0} {
		t.Run(fmt.Sprint(ttl), func(t *testing.T) {
			clk := newFakeClock()
			g := mustNew(t, replicaNames(2), WithSLOLatency(time.Second), withLatencyTTL(ttl), WithClock(clk.Now))
			require.NoError(t, g.UpdateLoad("r0", Load{Latency: 2 * time.Second}))
			for range 4 {
				d, err := g.Route(keys.PrefixKey("x", "", ""))
				require.NoError(t, err)
				assert.Equal(t, "r1", d.Replica)
				assert.Zero(t, d.Fallback)
				d.Done(DoneInfo{})
			}
			assert.Equal(t, uint64(4), g.Stats().SLOExcluded)
			clk.Advance(2 * time.Minute)
			seen := map[string]bool{}
			for range 4 {
				d, err := g.Route(keys.PrefixKey("x", "", ""))
				require.NoError(t, err)
				seen[d.Replica] = true
				d.Done(DoneInfo{})
			}
			assert.Equal(t, ttl != 0, seen["r0"], "r0 eligible again after the TTL: %v", seen)
		})
	}
}

// TestSLOExpiredSampleMeasuredAfresh: once a replica's last latency
// sample is older than the TTL it is eligible again and its next requests
// measure it afresh (withLatencyTTL): a good sample then puts it back
// within the SLO, rather than being blended with the expired bad one.
func TestSLOExpiredSampleMeasuredAfresh(t *testing.T) {
	clk := newFakeClock()
	g := mustNew(t, replicaNames(2), WithSLOLatency(100*time.Millisecond), WithClock(clk.Now))
	k := keys.PrefixKey("x", "", "")
	only0 := Target{Allow: func(name string) bool { return name == "r0" }}
	d, err := g.RouteWith(k, only0)
	require.NoError(t, err)
	d.Done(DoneInfo{Latency: time.Second})
	for range 4 {
		d, err := g.Route(k)
		require.NoError(t, err)
		require.Equal(t, "r1", d.Replica, "r0 breaches the SLO")
		d.Done(DoneInfo{Latency: 10 * time.Millisecond})
	}
	clk.Advance(defaultLatencyTTL + time.Second) // r0's sample no longer counts
	d, err = g.RouteWith(k, only0)
	require.NoError(t, err)
	d.Done(DoneInfo{Latency: 50 * time.Millisecond})
	assert.Equal(t, 50*time.Millisecond, status(t, g, "r0").Load.Latency, "measured afresh")
	seen := map[string]bool{}
	for range 4 {
		d, err := g.Route(k)
		require.NoError(t, err)
		seen[d.Replica] = true
		d.Done(DoneInfo{Latency: 50 * time.Millisecond})
	}
	assert.True(t, seen["r0"], "r0 is within the SLO again: %v", seen)
}

// TestSLOFallbackStats: when every healthy replica breaches, decisions fall
// back within the healthy set, are counted, and never pick the unhealthy.
func TestSLOFallbackStats(t *testing.T) {
	clk := newFakeClock()
	g := mustNew(t, replicaNames(3), WithSLOLatency(time.Second), WithClock(clk.Now))
	require.NoError(t, g.UpdateLoad("r0", Load{Latency: 2 * time.Second}))
	require.NoError(t, g.UpdateLoad("r1", Load{Latency: 3 * time.Second}))
	require.NoError(t, g.SetHealthy("r2", false))
	for range 6 {
		d, err := g.Route(keys.PrefixKey("x", "", ""))
		require.NoError(t, err)
		assert.NotEqual(t, "r2", d.Replica)
		assert.Equal(t, FallbackSLO, d.Fallback)
		d.Done(DoneInfo{})
	}
	s := g.Stats()
	assert.Equal(t, uint64(6), s.SLOFallbacks)
	assert.Zero(t, s.SLOExcluded, "a fallback excludes nobody")
	require.NoError(t, g.SetHealthy("r0", false))
	require.NoError(t, g.SetHealthy("r1", false))
	_, err := g.Route(keys.PrefixKey("x", "", ""))
	require.ErrorIs(t, err, ErrNoHealthyReplica)
	assert.Equal(t, uint64(1), g.Stats().NoHealthy)
}

// TestLoadGuard: a replica holding the whole prefix loses to an idle one
// when its queue outweighs the prefill it saves; the decision says so.
func TestLoadGuard(t *testing.T) {
	g := mustNew(t, replicaNames(2), WithMode(ModeCacheAware), withIndex(indexExact))
	k := keys.AppendHashes(nil, []uint64{1, 2, 3, 4})
	require.NoError(t, g.ApplyEvent("r0", CacheEvent{Kind: BlocksStored, Blocks: k}))
	require.NoError(t, g.UpdateLoad("r0", Load{QueueDepth: 100}))
	d, err := g.Route(k)
	require.NoError(t, err)
	assert.Equal(t, "r1", d.Replica)
	assert.Equal(t, KindLoadAware, d.Kind)
	assert.Equal(t, FallbackLoadGuard, d.Fallback)
	assert.Equal(t, uint64(1), g.Stats().LoadGuard)
}

func TestStats(t *testing.T) {
	g := mustNew(t, replicaNames(2), WithMode(ModeCacheAware))
	assert.Zero(t, g.Stats().Routed)
	k := keys.AppendHashes(nil, []uint64{1, 2})
	for range 4 {
		d, err := g.Route(k)
		require.NoError(t, err)
		d.Done(DoneInfo{})
	}
	s := g.Stats()
	assert.Equal(t, uint64(4), s.Routed)
	assert.Equal(t, uint64(3), s.Hits)
	assert.InDelta(t, 0.75, float64(s.Hits)/float64(s.Routed), 1e-9)
	assert.Equal(t, map[string]uint64{"round_robin": 0, "affinity": 3, "load_aware": 1}, s.ByKind)
	assert.Equal(t, uint64(1), s.NoMatch)
	assert.Equal(t, uint64(8), s.Blocks)
	assert.Equal(t, uint64(6), s.MatchedBlocks)
	var routed, hits uint64
	for _, st := range g.Replicas() {
		routed += st.Routed
		hits += st.Hits
	}
	assert.Equal(t, uint64(4), routed)
	assert.Equal(t, uint64(3), hits)
}

// TestMeasureHitRate checks the figures MeasureHitRate's doc and the README
// promise: one prefix repeated 100 times on 4 replicas.
func TestMeasureHitRate(t *testing.T) {
	k := keys.PrefixKey("You are…", "sess-42", "doc-hash")
	keys := make([]Key, 100)
	for i := range keys {
		keys[i] = k
	}
	for _, tt := range []struct {
		mode Mode
		want float64
	}{{ModeCacheAware, 0.99}, {ModeRoundRobin, 0.96}} {
		t.Run(tt.mode.String(), func(t *testing.T) {
			rate, err := MeasureHitRate(mustNew(t, replicaNames(4), WithMode(tt.mode)), keys)
			require.NoError(t, err)
			assert.InDelta(t, tt.want, rate, 1e-9)
		})
	}
	rate, err := MeasureHitRate(mustNew(t, replicaNames(1)), nil)
	assert.NoError(t, err)
	assert.Zero(t, rate)
	_, err = MeasureHitRate(mustNew(t, replicaNames(1)), []Key{k, nil})
	assert.ErrorIs(t, err, ErrInvalid)
}

// TestRemoveReplicaDropsIndex: removing a replica drops its cached blocks;
// its outstanding decisions still complete; a new replica of the same name
// starts cold.
func TestRemoveReplicaDropsIndex(t *testing.T) {
	g := mustNew(t, replicaNames(2), withIndex(indexExact)) // round robin: r0, then r1
	k := keys.AppendHashes(nil, []uint64{1, 2, 3})
	require.NoError(t, g.ApplyEvent("r1", CacheEvent{Kind: BlocksStored, Blocks: k}))
	d0, err := g.Route(k)
	require.NoError(t, err)
	d1, err := g.Route(k)
	require.NoError(t, err)
	require.Equal(t, "r1", d1.Replica)
	require.Equal(t, 3, d1.Matched)
	require.NoError(t, g.RemoveReplica("r1"))
	assert.NotPanics(t, func() { d1.FirstToken(); d1.Done(DoneInfo{Latency: time.Second}) })
	d0.Done(DoneInfo{})
	require.NoError(t, g.AddReplica(Replica{Name: "r1"}))
	st := status(t, g, "r1")
	assert.Zero(t, st.CachedBlocks)
	assert.Zero(t, st.InFlight)
	assert.Zero(t, st.Load.Latency)
	for range 2 {
		d, err := g.Route(k)
		require.NoError(t, err)
		assert.Zero(t, d.Matched, "removed replica's index must be gone (%s)", d.Replica)
		d.Done(DoneInfo{})
	}
	g.mu.Lock()
	checkIndex(t, g.idx)
	g.mu.Unlock()
}

// TestIndexModes: approximate mode warms the chosen replica on Route; exact
// mode changes only through ApplyEvent.
func TestIndexModes(t *testing.T) {
	k := keys.AppendHashes(nil, []uint64{1, 2, 3})
	for _, tt := range []struct {
		mode indexMode
		want int
	}{{indexApproximate, 3}, {indexExact, 0}} {
		g := mustNew(t, replicaNames(1), withIndex(tt.mode))
		d, err := g.Route(k)
		require.NoError(t, err)
		d.Done(DoneInfo{})
		assert.Equal(t, tt.want, status(t, g, "r0").CachedBlocks, "mode %d", tt.mode)
	}
	g := mustNew(t, replicaNames(1), withIndex(indexExact))
	for _, ev := range []struct {
		ev   CacheEvent
		want int
	}{
		{CacheEvent{Kind: BlocksStored, Blocks: k}, 3},
		{CacheEvent{Kind: BlocksRemoved, Blocks: k[2:]}, 2},
		{CacheEvent{Kind: BlocksStored, Blocks: nil}, 2},
		{CacheEvent{Kind: AllCleared}, 0},
	} {
		require.NoError(t, g.ApplyEvent("r0", ev.ev))
		d, err := g.Route(k)
		require.NoError(t, err)
		assert.Equal(t, ev.want, d.Matched)
		d.Done(DoneInfo{})
	}
}

func TestReplicaStatusDefaults(t *testing.T) {
	g := mustNew(t, []Replica{{Name: "a", Address: "http://a"}, {Name: "b", Unhealthy: true, CacheBlocks: 7}})
	st := g.Replicas()
	require.Len(t, st, 2)
	assert.Equal(t, ReplicaStatus{Name: "a", Address: "http://a", Healthy: true, CacheBlocks: defaultCacheBlocks}, st[0])
	assert.Equal(t, ReplicaStatus{Name: "b", CacheBlocks: 7}, st[1])
}

// recordingPolicy records what the gateway hands a Policy and picks a set
// index.
type recordingPolicy struct {
	pick  int
	names []string
	max   int
}

func (p *recordingPolicy) Pick(req *Request, cands []Candidate) int {
	p.names = p.names[:0]
	for _, c := range cands {
		p.names = append(p.names, c.Name)
	}
	p.max = req.MaxMatched
	return p.pick
}

// TestCustomPolicy: a Policy sees only eligible candidates, in the order
// replicas were added, with MaxMatched set; a choice outside the slice is
// an error wrapping ErrInvalid, not a panic.
func TestCustomPolicy(t *testing.T) {
	clk := newFakeClock()
	p := &recordingPolicy{pick: 1}
	g := mustNew(t, replicaNames(5), WithPolicy(p), withIndex(indexExact), WithSLOLatency(time.Second), WithClock(clk.Now))
	require.NoError(t, g.SetHealthy("r1", false))
	require.NoError(t, g.UpdateLoad("r3", Load{Latency: time.Minute}))
	k := keys.AppendHashes(nil, []uint64{5, 6})
	require.NoError(t, g.ApplyEvent("r4", CacheEvent{Kind: BlocksStored, Blocks: k[:1]}))
	d, err := g.Route(k)
	require.NoError(t, err)
	assert.Equal(t, []string{"r0", "r2", "r4"}, p.names)
	assert.Equal(t, 1, p.max)
	assert.Equal(t, "r2", d.Replica)
	for _, bad := range []int{-1, 3, 100} {
		p.pick = bad
		_, err := g.Route(k)
		require.ErrorIs(t, err, ErrInvalid)
		assert.True(t, strings.HasPrefix(err.Error(), "gateway:"), err.Error())
		assert.Contains(t, err.Error(), fmt.Sprint(bad))
	}
}

func TestNames(t *testing.T) {
	for m, s := range map[Mode]string{ModeRoundRobin: "round_robin", ModeCacheAware: "cache_aware", ModeLoadAware: "load_aware", Mode(9): "Mode(9)"} {
		assert.Equal(t, s, m.String())
		if m != 9 {
			got, err := parseMode(s)
			require.NoError(t, err)
			assert.Equal(t, m, got)
			got, err = parseMode(strings.ReplaceAll(s, "_", "-"))
			require.NoError(t, err)
			assert.Equal(t, m, got)
		}
	}
	for k, s := range map[Kind]string{KindRoundRobin: "round_robin", KindAffinity: "affinity", KindLoadAware: "load_aware", Kind(-1): "Kind(-1)"} {
		assert.Equal(t, s, k.String())
	}
	for f, s := range map[Fallback]string{0: "none", FallbackNoMatch: "no_match", FallbackLoadGuard | FallbackSLO: "load_guard,slo"} {
		assert.Equal(t, s, f.String())
	}
}

// warmGateway builds a cache-aware gateway of n replicas in which every
// replica holds a shared system prompt and others prefixes, and each of
// the returned prompts is held in full by one or two replicas (by every
// replica if allHold). opts follow WithMode(ModeCacheAware).
func warmGateway(t testing.TB, n, others int, allHold bool, opts ...Option) (*Gateway, []string) {
	g := mustNew(t, replicaNames(n), append([]Option{WithMode(ModeCacheAware)}, opts...)...)
	system := strings.Repeat("You are a careful assistant. Answer briefly and cite sources. ", 17)[:1024]
	doc := func(i int) string {
		return fmt.Sprintf("%08d", i) + strings.Repeat(fmt.Sprintf(" document %d line of retrieved context;", i), 100)
	}
	prompt := func(i int) string { return (system + fmt.Sprintf("session-%06d|", i) + doc(i))[:4096] }
	var buf Key
	for r := range n {
		name := fmt.Sprintf("r%d", r)
		for j := range others {
			buf = appendPrefix(buf[:0], prompt(1_000_000 + r*others + j)[:1024], prompt(1_000_000 + r*others + j)[1024:], "")
			require.NoError(t, g.ApplyEvent(name, CacheEvent{Kind: BlocksStored, Blocks: buf}))
		}
	}
	prompts := make([]string, 64)
	for i := range prompts {
		prompts[i] = prompt(i)
		buf = appendPrefix(buf[:0], prompts[i][:1024], prompts[i][1024:], "")
		holders := []int{i % n, (i + 1 + i/n) % n}
		if allHold {
			holders = holders[:0]
			for r := range n {
				holders = append(holders, r)
			}
		} else if i%2 == 0 {
			holders = holders[:1]
		}
		for _, r := range holders {
			require.NoError(t, g.ApplyEvent(fmt.Sprintf("r%d", r), CacheEvent{Kind: BlocksStored, Blocks: buf}))
		}
	}
	return g, prompts
}

// TestRouteAllocatesNothing: Route + Done on a warm 16-replica cache-aware
// gateway, hashing a 4 KiB prompt into a reused buffer, allocates nothing.
func TestRouteAllocatesNothing(t *testing.T) {
	g, prompts := warmGateway(t, 16, 8, false)
	buf := make(Key, 0, 128)
	i := 0
	op := func() {
		p := prompts[i%len(prompts)]
		i++
		buf = appendPrefix(buf[:0], p[:1024], p[1024:], "")
		d, err := g.Route(buf)
		if err != nil {
			panic(err)
		}
		d.Done(DoneInfo{Latency: time.Millisecond})
	}
	for range 2 * len(prompts) { // warm-up
		op()
	}
	assert.Zero(t, testing.AllocsPerRun(1000, op))
	d, err := g.Route(buf)
	require.NoError(t, err)
	assert.True(t, d.Hit, "warm prompts must hit")
	d.Done(DoneInfo{})
}

// TestZeroLoadWeightsAreDefaults: the zero LoadWeights stands for the
// defaults, as LoadAware.Weights.
func TestZeroLoadWeightsAreDefaults(t *testing.T) {
	assert.Equal(t, LoadWeights{Queue: 1, KV: 0.5, Latency: 0.25}, DefaultLoadWeights())
	route := func(opts ...Option) []string {
		g := mustNew(t, replicaNames(4), opts...)
		var got []string
		for i := range 40 {
			name := fmt.Sprintf("r%d", i%4)
			require.NoError(t, g.UpdateLoad(name, Load{QueueDepth: i % 5, KVUtilization: float64(i%7) / 7, Latency: time.Duration(i%3) * time.Millisecond}))
			d, err := g.Route(keys.AppendHashes(nil, []uint64{uint64(i)}))
			require.NoError(t, err)
			got = append(got, d.Replica)
			if i%3 == 0 {
				d.Done(DoneInfo{})
			}
		}
		return got
	}
	want := route(WithPolicy(&LoadAware{Weights: DefaultLoadWeights()}))
	assert.Equal(t, want, route(WithPolicy(&LoadAware{Weights: LoadWeights{}})))
	assert.Equal(t, want, route(WithPolicy(&LoadAware{})))
	assert.NotEqual(t, want, route(WithPolicy(&LoadAware{Weights: LoadWeights{Latency: 1}})), "the weights matter")
}

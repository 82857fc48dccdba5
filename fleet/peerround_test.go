package fleet

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
)

// peerRoundFleet returns a Fleet whose model has r replicas, each with a
// scraped load, and p peers whose last counts report every replica.
func peerRoundFleet(tb testing.TB, r, p int, count func(peer, replica int) int) *Fleet {
	tb.Helper()
	s, err := New(Options{Logger: quietLogger(), ScrapeInterval: time.Hour, ProbeInterval: time.Hour, DiscoverInterval: time.Hour})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = s.Close() })
	var reps []config.Replica
	for i := range r {
		reps = append(reps, config.Replica{Name: fmt.Sprint("r", i), Address: fmt.Sprintf("http://127.0.0.1:%d", 20000+i), CacheBlocks: 1000})
	}
	var peers, entries []string // past 64, by dns+ entries of 64 addresses
	for i := range p {
		peers = append(peers, fmt.Sprintf("http://10.0.%d.%d:8080", i/200, i%200+1))
	}
	if p <= 64 {
		entries = peers
	} else {
		for k := 0; k*64 < p; k++ {
			entries = append(entries, fmt.Sprintf("dns+http://peers-%d.example:8080", k))
		}
	}
	require.NoError(tb, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {Mode: gateway.ModeCacheAware, Replicas: reps, Peers: entries}}}))
	m := s.state.Load().Models[testModel]
	for i := range 4 * r { // some pending prefill of its own
		_, err := m.Gateway.Route(gateway.Key{uint64(i + 1), uint64(i + 2), uint64(i + 3)})
		require.NoError(tb, err)
	}
	for _, ep := range m.ByName {
		ep.setLoad(gateway.Load{}, nil)
	}
	s.peers.mu.Lock()
	if p > 64 {
		s.peers.dns = map[string]*dnsEntry{}
		for k, e := range entries {
			e, _ := peerEntry(e)
			s.peers.dns[e] = &dnsEntry{bases: peers[k*64 : min(k*64+64, p)]}
		}
	}
	s.peers.peers = map[string]*peerState{}
	for i, b := range peers {
		c := map[string]int{}
		for j := range r {
			c[fmt.Sprint("r", j)] = count(i, j)
		}
		s.peers.peers[b] = &peerState{counts: map[string]map[string]int{testModel: c}, at: s.opts.Clock(), up: true, id: fmt.Sprint("peer", i)}
	}
	s.peers.mu.Unlock()
	return s
}

// BenchmarkPeerRound is the work of passing the peers' counts on after a
// peer round (pushPeerPrefill), every --peer-scrape-interval: a model of
// R replicas and P peers.
func BenchmarkPeerRound(b *testing.B) {
	for _, tc := range []struct{ r, p int }{{16, 2}, {64, 16}, {64, 256}} {
		b.Run(fmt.Sprintf("R%d-P%d", tc.r, tc.p), func(b *testing.B) {
			s := peerRoundFleet(b, tc.r, tc.p, func(p, r int) int { return (p*7 + r*3) % 50 })
			b.ReportAllocs()
			for b.Loop() {
				s.pushPeerPrefill()
			}
		})
	}
}

// refPeerPrefill is peerPrefill as it was, one replica at a time (at
// 0047e03; its cap now by the pool's mean): the reference the one-pass
// version is checked against.
func refPeerPrefill(s *Fleet, m *Model, name string) int {
	if len(m.Cfg.Peers) == 0 {
		return 0
	}
	ownAndLeast := func(name string, report map[string]int) (own, least int) {
		g := m.gatewayOf(name)
		n := 0
		for _, r := range g.Replicas() {
			own += r.PendingPrefill
			n++
		}
		own = (own + n - 1) / n // the pool's mean, rounded up
		least = MaxLoadCount
		for rep := range m.ByName {
			if m.gatewayOf(rep) == g {
				least = min(least, report[rep])
			}
		}
		return own, least
	}
	oldest := s.opts.Clock().Add(-peerTTL * s.opts.PeerScrapeInterval)
	s.peers.mu.Lock()
	defer s.peers.mu.Unlock()
	sum := 0
	ids := map[string]bool{}
	for _, b := range s.modelPeers(m) {
		p := s.peers.peers[b]
		if p == nil || p.self || p.counts == nil || p.at.Before(oldest) || ids[p.id] {
			continue
		}
		if p.id != "" {
			ids[p.id] = true
		}
		report := p.counts[m.Name]
		own, least := ownAndLeast(name, report)
		sum = min(sum+PeerCap(own, report[name], least), MaxLoadCount)
	}
	return sum
}

// The one-pass peerPrefill gives every replica what the reference gives
// it, whatever the peers report, however old, whoever they are.
func TestPropPeerPrefillMatchesReference(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		r := rapid.IntRange(1, 8).Draw(rt, "replicas")
		p := rapid.IntRange(0, 5).Draw(rt, "peers")
		counts := rapid.SliceOfN(rapid.IntRange(-1, 60), r*max(p, 1), r*max(p, 1)).Draw(rt, "counts")
		s := peerRoundFleet(t, r, p, func(i, j int) int { return max(counts[i*r+j], 0) })
		m := s.state.Load().Models[testModel]
		s.peers.mu.Lock()
		i := 0
		for _, b := range s.modelPeers(m) {
			ps := s.peers.peers[b]
			for j := range r {
				if counts[i*r+j] < 0 {
					delete(ps.counts[testModel], fmt.Sprint("r", j))
				}
			}
			switch rapid.IntRange(0, 5).Draw(rt, "kind") {
			case 1:
				ps.at = ps.at.Add(-time.Hour) // stale
			case 2:
				ps.self = true
			case 3:
				ps.id = "peer0" // the same gateway as peer 0
			case 4:
				ps.id = ""
			}
			i++
		}
		s.peers.mu.Unlock()
		for k := range rapid.IntRange(0, 4*r).Draw(rt, "routed") {
			_, err := m.Gateway.Route(gateway.Key{uint64(k + 100), uint64(k)})
			require.NoError(rt, err)
		}
		got := s.peerPrefill(m)
		for name := range m.ByName {
			if want := refPeerPrefill(s, m, name); got[name] != want {
				rt.Fatalf("%s: %d, the reference %d", name, got[name], want)
			}
		}
	})
}

// TestPeerCapByPoolMean: a disaggregated model's prefill and decode pools
// cap a peer's report each by this gateway's own mean pending prefill over
// that pool, and the least it reports in that pool (found untested in
// review).
func TestPeerCapByPoolMean(t *testing.T) {
	s, err := New(Options{Logger: quietLogger(), ScrapeInterval: time.Hour, ProbeInterval: time.Hour, DiscoverInterval: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	rep := func(name string, port int) config.Replica {
		return config.Replica{Name: name, Address: fmt.Sprintf("http://127.0.0.1:%d", port), CacheBlocks: 1000}
	}
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {
		Mode: gateway.ModeCacheAware, Disaggregate: true, PrefillPool: "prefill", DecodePool: "decode", Peers: []string{"http://10.0.0.9:8080"},
		Pools: map[string][]config.Replica{"prefill": {rep("p0", 21000), rep("p1", 21001)}, "decode": {rep("d0", 21002), rep("d1", 21003), rep("d2", 21004)}},
	}}}))
	m := s.state.Load().Models[testModel]
	require.NotNil(t, m.PD)
	pre, dec := m.PD.Plan.Prefill, m.Gateway
	require.NotSame(t, pre, dec)
	// Own pending prefill: 40 blocks at one prefill replica (mean 20 over
	// two), 9 at one decode replica (mean 3 over three).
	_, err = pre.Route(make(gateway.Key, 40))
	require.NoError(t, err)
	key := make(gateway.Key, 9)
	for i := range key {
		key[i] = uint64(i + 100)
	}
	_, err = dec.Route(key)
	require.NoError(t, err)
	s.peers.mu.Lock()
	s.peers.peers = map[string]*peerState{"http://10.0.0.9:8080": {at: s.opts.Clock(), up: true, id: "peer",
		counts: map[string]map[string]int{testModel: {"prefill/p0": 1000, "prefill/p1": 5, "decode/d0": 1000, "decode/d1": 1000, "decode/d2": 2}}}}
	s.peers.mu.Unlock()
	got := s.peerPrefill(m)
	// Prefill pool: least 5, cap (20+1)/2 = 10; decode: least 2, cap (3+1)/2 = 2.
	assert.Equal(t, map[string]int{"prefill/p0": 10, "prefill/p1": 0, "decode/d0": 2, "decode/d1": 2, "decode/d2": 0}, got)
	for name := range m.ByName {
		assert.Equal(t, refPeerPrefill(s, m, name), got[name], name)
	}
}

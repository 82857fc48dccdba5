package sim

import (
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// What several gateways could learn of the prefill the others queued, and
// what it would buy (docs/multi-gateway.md, "What was tried"). Each mode
// wraps cache_aware and changes only what it sees as a candidate's
// PendingPrefill (or, for sharedHash, its tie-break), from a signal
// modelled at every load refresh, as a scrape would bring it.
type sharedMode int

const (
	// sharedNone: cache_aware as it is, through the wrapper.
	sharedNone sharedMode = iota
	// sharedCount: the engine's waiting + running requests beyond this
	// gateway's own in flight there at the scrape, each priced at this
	// gateway's pending prefill per request in flight (over all replicas,
	// now): an estimate from the counts every engine exports.
	sharedCount
	// sharedGauge: a gauge no engine exports (vLLM, SGLang and
	// llm-d-inference-sim have none): the prefill blocks queued or running
	// at the engine at the scrape, plus what this gateway sent there since.
	sharedGauge
	// sharedPeers: the other gateways' own PendingPrefill at the scrape,
	// each capped as the HTTP gateway caps a peer's report (beyond the
	// least it reports at any replica, at most half this gateway's own
	// mean per replica, rounded up), added to this gateway's (gateways sharing their
	// counts, as Dynamo's router replica sync does).
	sharedPeers
	// sharedCountMean: sharedCount's estimates averaged over the replicas
	// and added to every one: the same for all, so they change only λ,
	// cache_aware's price of the busy cluster.
	sharedCountMean
	// sharedCountHalf: half of sharedCount's estimate.
	sharedCountHalf
	// sharedHash: prompts no replica holds break ties by a hash of their
	// first block and the replica's name, the same in every gateway,
	// instead of the least prefill sent and this gateway's rotation.
	sharedHash
)

var sharedModeNames = [...]string{"cache_aware", "+count", "+gauge", "+peers", "+count mean", "+count half", "+hash"}

// sharedStats compares sharedCount's estimate with the truth (the other
// gateways' PendingPrefill at the decision) over every candidate of every
// decision.
type sharedStats struct {
	n, x, y, xx, yy, xy float64
}

func (s *sharedStats) add(est, truth float64) {
	s.n++
	s.x += est
	s.y += truth
	s.xx += est * est
	s.yy += truth * truth
	s.xy += est * truth
}

func (s *sharedStats) String() string {
	mx, my := s.x/s.n, s.y/s.n
	cov := s.xy/s.n - mx*my
	r := cov / math.Sqrt((s.xx/s.n-mx*mx)*(s.yy/s.n-my*my))
	rmse := math.Sqrt((s.xx - 2*s.xy + s.yy) / s.n)
	return fmt.Sprintf("estimate mean %.1f blocks, truth mean %.1f (rms %.1f), correlation %.2f, rms error %.1f",
		mx, my, math.Sqrt(s.yy/s.n), r, rmse)
}

type sharedLoad struct {
	inner gateway.CacheAware
	mode  sharedMode
	stats *sharedStats

	e  *engine
	gw int
	// Per replica of e, at the last refresh: the signal's blocks, and this
	// gateway's own in-flight count and prefill sent.
	extra            []float64
	inflight, assign []int
	scratch          []gateway.Candidate
	slots            []int32
}

var (
	_ gateway.Policy = (*sharedLoad)(nil)
	_ refresher      = (*sharedLoad)(nil)
)

func (p *sharedLoad) refreshed(e *engine, gw int) {
	p.e, p.gw = e, gw
	n := len(e.reps)
	p.extra = make([]float64, n)
	p.inflight, p.assign = make([]int, n), make([]int, n)
	for i, st := range e.gws[gw].g.Replicas() {
		p.inflight[i], p.assign[i] = st.InFlight, st.AssignedPrefill
	}
	switch p.mode {
	case sharedGauge:
		for i, r := range e.reps {
			v := 0
			for k := range r.waiting.len() {
				s := r.waiting.buf[(r.waiting.head+k)%len(r.waiting.buf)]
				if cap(p.slots) < len(s.key) {
					p.slots = make([]int32, len(s.key))
				}
				m := r.cache.match(s.key, p.slots[:len(s.key)])
				v += len(s.key) - m
			}
			for _, s := range r.prefill {
				v += (s.left + e.bt - 1) / e.bt
			}
			p.extra[i] = float64(v)
		}
	case sharedPeers:
		p.extra = p.peers(p.extra, true)
	}
}

// peers writes the other gateways' PendingPrefill per replica to dst,
// each gateway's report capped as the HTTP gateway's peer round caps it
// when capped is true (written here from its rule, not with fleet.PeerCap,
// so that TestSharePendingIsPeers checks the product's path against it).
func (p *sharedLoad) peers(dst []float64, capped bool) []float64 {
	clear(dst)
	mean := 0
	if capped { // only then: uncapped, it is called from Pick, under this gateway's lock
		for _, st := range p.e.gws[p.gw].g.Replicas() {
			mean += st.PendingPrefill
		}
		mean = (mean + len(p.e.reps) - 1) / len(p.e.reps)
	}
	for j := range p.e.gws {
		if j == p.gw {
			continue
		}
		reps := p.e.gws[j].g.Replicas()
		least := reps[0].PendingPrefill
		for _, st := range reps {
			least = min(least, st.PendingPrefill)
		}
		for i, st := range reps {
			v := st.PendingPrefill
			if capped {
				v = min(max(v-least, 0), (mean+1)/2)
			}
			dst[i] += float64(v)
		}
	}
	return dst
}

func (p *sharedLoad) Pick(req *gateway.Request, cands []gateway.Candidate) int {
	if p.mode == sharedNone || p.e == nil {
		return p.inner.Pick(req, cands)
	}
	p.scratch = append(p.scratch[:0], cands...)
	cs := p.scratch
	var truth []float64
	if p.stats != nil && len(p.e.gws) > 1 {
		truth = p.peers(make([]float64, len(p.e.reps)), false)
	}
	pending, inflight := 0, 0
	for i := range cs {
		pending += cs[i].PendingPrefill
		inflight += cs[i].InFlight
	}
	estMean := 0.0
	for i := range cs {
		c := &cs[i]
		r := int(p.e.byNm[c.Name])
		est := 0.0
		if inflight > 0 {
			foreign := max(0, c.Load.QueueDepth+c.Load.Running-p.inflight[r])
			est = float64(foreign) * float64(pending) / float64(inflight)
		}
		estMean += est / float64(len(cs))
		switch p.mode {
		case sharedCount:
			if truth != nil {
				p.stats.add(est, truth[r])
			}
			c.PendingPrefill += int(math.Round(est))
		case sharedCountHalf:
			c.PendingPrefill += int(math.Round(est / 2))
		case sharedGauge:
			c.PendingPrefill = int(p.extra[r]) + c.AssignedPrefill - p.assign[r]
		case sharedPeers:
			c.PendingPrefill += int(p.extra[r])
		case sharedHash:
			if req.MaxMatched == 0 {
				c.AssignedPrefill = 0
				c.LastPicked = rendezvous(req.Key[0], c.Name)
			}
		}
	}
	if p.mode == sharedCountMean {
		for i := range cs {
			cs[i].PendingPrefill += int(math.Round(estMean))
		}
	}
	return p.inner.Pick(req, cs)
}

// rendezvous ranks name for the hash h: the same in every gateway.
func rendezvous(h uint64, name string) uint64 {
	x := h ^ 0x9e3779b97f4a7c15
	for i := 0; i < len(name); i++ {
		x = (x ^ uint64(name[i])) * 0x100000001b3
	}
	return mix64(x, 0)
}

// sharedPolicies returns cache_aware and each wrapper mode but
// sharedPeers, which Config.SharePending now models with the product code
// (TestSharePendingIsPeers).
func sharedPolicies(stats *sharedStats) []Policy {
	ps := []Policy{{Name: sharedModeNames[0], Mode: gateway.ModeCacheAware}}
	for m := sharedCount; m <= sharedHash; m++ {
		if m == sharedPeers {
			continue
		}
		var st *sharedStats
		if m == sharedCount {
			st = stats
		}
		ps = append(ps, Policy{Name: sharedModeNames[m], New: func(uint64) gateway.Policy { return &sharedLoad{mode: m, stats: st} }})
	}
	return ps
}

// Config.SharePending, the product code (gateway.Load.PeerPrefill fed at
// every refresh), routes exactly as the wrapper's +peers, which added the
// other gateways' PendingPrefill at the refresh to each candidate's own;
// and it does change the routing of a loaded cluster, and nothing with
// one gateway.
func TestSharePendingIsPeers(t *testing.T) {
	w := fixture(t, TraceOptions{Speed: 4})
	for _, idx := range []IndexMode{IndexExact, IndexApproximate} {
		for _, g := range []int{2, 3} {
			base := Config{Workload: w, Replicas: 3, Preset: smallPreset(), Seed: 5, Gateways: g, Index: idx}
			plain := base
			plain.Policies = []Policy{{Name: "a", Mode: gateway.ModeCacheAware}, {Name: "b", New: func(uint64) gateway.Policy { return &sharedLoad{mode: sharedPeers} }}}
			shared := base
			shared.SharePending = true
			shared.Policies = []Policy{{Name: "a", Mode: gateway.ModeCacheAware}}
			rp, err := Run(plain)
			require.NoError(t, err)
			rs, err := Run(shared)
			require.NoError(t, err)
			rs2, err := Run(shared)
			require.NoError(t, err)
			name := fmt.Sprintf("%s G=%d", indexName(idx), g)
			assert.Equal(t, rs, rs2, "%s: not deterministic", name)
			assert.True(t, rs.SharePending, name)
			assert.Equal(t, rp.Results[1].TTFT, rs.Results[0].TTFT, name)
			assert.Equal(t, rp.Results[1].PrefillTokens, rs.Results[0].PrefillTokens, name)
			assert.NotEqual(t, rp.Results[0].TTFT, rs.Results[0].TTFT, "%s: sharing changed nothing", name)
		}
	}
	one := Config{Workload: w, Replicas: 3, Preset: smallPreset(), Seed: 5}
	def, err := Run(one)
	require.NoError(t, err)
	one.SharePending = true
	got, err := Run(one)
	require.NoError(t, err)
	assert.Equal(t, def, got, "SharePending with one gateway")
}

// The wrapper with nothing shared routes as cache_aware, so the modes
// differ from it only by what they model.
func TestSharedLoadNoneIsCacheAware(t *testing.T) {
	cfg := Config{Workload: fixture(t, TraceOptions{}), Replicas: 3, Preset: smallPreset(), Seed: 5, Gateways: 2, Index: IndexExact,
		Policies: []Policy{{Name: "a", Mode: gateway.ModeCacheAware}, {Name: "b", New: func(uint64) gateway.Policy { return &sharedLoad{} }}}}
	rep, err := Run(cfg)
	require.NoError(t, err)
	a, b := rep.Results[0], rep.Results[1]
	assert.Equal(t, a.TTFT, b.TTFT)
	assert.Equal(t, a.PrefillTokens, b.PrefillTokens)
}

// TestSharedLoad runs cache_aware and each shared-signal mode on the
// Mooncake trace at 8 and 16 replicas and on the default workload, G = 1,
// 2 and 4 gateways, both indexes, seeds 1–4 (one seed at G=1, where the
// seed changes nothing on the trace), and logs mean TTFT, p99 and token
// hit rate averaged over the seeds. Slow: it runs only when EXA_SHARED is
// set.
//
//	EXA_SHARED=1 go test ./sim -run TestSharedLoad -v -timeout 1h
func TestSharedLoad(t *testing.T) {
	if os.Getenv("EXA_SHARED") == "" {
		t.Skip("set EXA_SHARED=1 to run")
	}
	old := checkInvariants
	checkInvariants = false
	defer func() { checkInvariants = old }()
	trace, err := TraceFile(mooncakePath, TraceOptions{})
	require.NoError(t, err)
	cases := []struct {
		name string
		w    Workload
		n    int
	}{{"trace, 8 replicas", trace, 8}, {"trace, 16 replicas", trace, 16}, {"default", DefaultWorkload(), 8}}
	// The columns: the wrapper's modes, then cache_aware with
	// Config.SharePending (the product's peer sharing, formerly the
	// wrapper's +peers).
	var names []string
	for _, p := range sharedPolicies(nil) {
		names = append(names, p.Name)
	}
	names = append(names, "+peers")
	var b strings.Builder
	b.WriteString("| workload | index | G |")
	for _, n := range names {
		fmt.Fprintf(&b, " %s |", n)
	}
	b.WriteString("\n|---|---|--:|" + strings.Repeat("--:|", len(names)) + "\n")
	var notes strings.Builder
	for _, c := range cases {
		for _, idx := range []IndexMode{IndexExact, IndexApproximate} {
			for _, g := range []int{1, 2, 4} {
				seeds := 4
				if g == 1 {
					seeds = 1
				}
				k := len(names)
				mean, p99, hit := make([]float64, k), make([]float64, k), make([]float64, k)
				stats := &sharedStats{}
				for s := 1; s <= seeds; s++ {
					cfg := Config{Workload: c.w, Replicas: c.n, Seed: uint64(s), Gateways: g, Index: idx, Policies: sharedPolicies(stats)}
					rep, err := Run(cfg)
					require.NoError(t, err)
					cfg.SharePending, cfg.Policies = true, []Policy{{Name: "+peers", Mode: gateway.ModeCacheAware}}
					peers, err := Run(cfg)
					require.NoError(t, err)
					for i, r := range append(rep.Results, peers.Results...) {
						mean[i] += r.TTFT.Mean / float64(seeds)
						p99[i] += r.TTFT.P99 / float64(seeds)
						hit[i] += r.TokenHitRate / float64(seeds)
					}
				}
				fmt.Fprintf(&b, "| %s | %s | %d |", c.name, indexName(idx), g)
				for i := range k {
					fmt.Fprintf(&b, " %s / %s, %.1f%% |", msInt(mean[i]), msInt(p99[i]), 100*hit[i])
				}
				b.WriteString("\n")
				if stats.n > 0 {
					fmt.Fprintf(&notes, "%s, %s, G=%d: +count's %s\n", c.name, indexName(idx), g, stats)
				}
			}
		}
	}
	t.Logf("mean / p99 TTFT (ms), token hit rate; seeds 1–4 averaged (G=1: seed 1)\n%s\n%s", b.String(), notes.String())
}

// msInt formats seconds as whole milliseconds with thousands separators.
func msInt(s float64) string {
	v := int(math.Round(1000 * s))
	if v < 1000 {
		return fmt.Sprint(v)
	}
	return fmt.Sprintf("%d,%03d", v/1000, v%1000)
}

// TestSharedLoadWide runs cache_aware and +count on every setting of the
// issue 9 checklist (both presets) with 2 and 4 gateways on the exact
// index, seeds 1–2, and logs the mean and p99 TTFT of each. Slow: it runs
// only when EXA_SHARED is set.
func TestSharedLoadWide(t *testing.T) {
	if os.Getenv("EXA_SHARED") == "" {
		t.Skip("set EXA_SHARED=1 to run")
	}
	old := checkInvariants
	checkInvariants = false
	defer func() { checkInvariants = old }()
	pols := sharedPolicies(nil)
	pols = []Policy{pols[0], pols[1], pols[3], pols[4]} // cache_aware, +count, +count mean, +count half
	var b strings.Builder
	b.WriteString("| workload | replicas | preset | G |")
	for _, p := range pols {
		fmt.Fprintf(&b, " %s mean / p99 |", p.Name)
	}
	b.WriteString("\n|---|--:|---|--:|" + strings.Repeat("--:|", len(pols)) + "\n")
	logSum, n := make([]float64, len(pols)), 0
	for _, c := range targetCases(t) {
		for _, g := range []int{2, 4} {
			m, p := make([]float64, len(pols)), make([]float64, len(pols))
			for s := 1; s <= 2; s++ {
				rep, err := Run(Config{Workload: c.w, Replicas: c.replicas, Preset: MustPreset(c.preset), Seed: uint64(s), Gateways: g, Index: IndexExact, Policies: pols})
				require.NoError(t, err)
				for i, r := range rep.Results {
					m[i] += r.TTFT.Mean / 2
					p[i] += r.TTFT.P99 / 2
				}
			}
			n++
			fmt.Fprintf(&b, "| %s | %d | %s | %d | %s / %s |", c.name, c.replicas, c.preset, g, ms(m[0]), sec(p[0]))
			for i := 1; i < len(pols); i++ {
				logSum[i] += math.Log(m[i] / m[0])
				fmt.Fprintf(&b, " %s / %s (%.3f) |", ms(m[i]), sec(p[i]), m[i]/m[0])
			}
			b.WriteString("\n")
		}
	}
	b.WriteString("geometric mean of the ratios to cache_aware:")
	for i := 1; i < len(pols); i++ {
		fmt.Fprintf(&b, " %s %.4f", pols[i].Name, math.Exp(logSum[i]/float64(n)))
	}
	t.Logf("exact index, seeds 1–2 averaged\n%s", b.String())
}

// The gateways' pending prefill shared on a clock of its own
// (PeerRefreshInterval): with the engines' load every second, four
// gateways sharing every 100 ms wait less than sharing with the engines'
// load (the default workload's 256 groups, 4,000 requests, exact index);
// without SharePending the clock changes nothing.
func TestPeerRefreshInterval(t *testing.T) {
	w, err := SharedPrefix(SharedPrefixConfig{Requests: 4000, Rate: 40, Groups: 256, SystemTokens: 4096, QuestionTokens: 128, OutputTokens: 256})
	require.NoError(t, err)
	ca, err := PolicyByName("cache_aware")
	require.NoError(t, err)
	run := func(share bool, peers time.Duration) Result {
		rep, err := Run(Config{Workload: w, Replicas: 8, Seed: 1, Gateways: 4, Index: IndexExact, Policies: []Policy{ca},
			RefreshInterval: time.Second, SharePending: share, PeerRefreshInterval: peers})
		require.NoError(t, err)
		return rep.Results[0]
	}
	withLoad, apart := run(true, 0), run(true, 100*time.Millisecond)
	t.Logf("mean TTFT: shared with the load every 1s %.1f ms, every 100ms %.1f ms", 1000*withLoad.TTFT.Mean, 1000*apart.TTFT.Mean)
	assert.Less(t, apart.TTFT.Mean, withLoad.TTFT.Mean)
	assert.Equal(t, run(false, 0), run(false, 100*time.Millisecond), "not shared: the peers' clock changes nothing")
}

// TestSharePeersCapped: on the peers' own clock (PeerRefreshInterval) each
// gateway is pushed its peers' pending prefill capped as the HTTP
// gateway's peer round caps it: beyond the least each peer reports, at
// most half this gateway's own mean per replica, rounded up (written here
// from that rule; the review found this path untested).
func TestSharePeersCapped(t *testing.T) {
	w, err := SharedPrefix(SharedPrefixConfig{Requests: 10, Rate: 10, Groups: 4, SystemTokens: 4096, QuestionTokens: 128, OutputTokens: 16})
	require.NoError(t, err)
	e, st := openEngine(t, Config{Workload: w, Replicas: 4, Seed: 1, Gateways: 3, Index: IndexExact, SharePending: true,
		RefreshInterval: time.Second, PeerRefreshInterval: 100 * time.Millisecond}, cacheAware)
	defer st.Close()
	e.refresh() // the engines' load, which the peers' pushes carry
	// Uneven pending prefill: gateway g routes g+1 prompts of 10·(k+1) blocks.
	for g := range e.gws {
		for k := range g + 1 {
			key := make(gateway.Key, 10*(k+1))
			for j := range key {
				key[j] = uint64(1000*g + 100*k + j + 1)
			}
			_, err := e.gws[g].g.Route(key)
			require.NoError(t, err)
		}
	}
	own := make([][]int, len(e.gws))
	for g := range e.gws {
		for _, r := range e.gws[g].g.Replicas() {
			own[g] = append(own[g], r.PendingPrefill)
		}
	}
	e.sharePeers()
	heard := 0
	for g := range e.gws {
		mean := 0
		for _, p := range own[g] {
			mean += p
		}
		mean = (mean + len(own[g]) - 1) / len(own[g])
		for ri, r := range e.gws[g].g.Replicas() {
			want := 0
			for j := range e.gws {
				if j == g {
					continue
				}
				least := own[j][0]
				for _, p := range own[j] {
					least = min(least, p)
				}
				want += min(max(own[j][ri]-least, 0), (mean+1)/2)
			}
			assert.Equal(t, want, r.Load.PeerPrefill, "gateway %d, replica %s", g, r.Name)
			heard += want
		}
	}
	assert.Positive(t, heard, "some peers' prefill is heard")
}

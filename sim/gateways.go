package sim

import (
	"maps"
	"slices"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/flow"
	"github.com/examlops/gateway/internal/hashtab"
	"github.com/examlops/gateway/reference"
)

// MaxGateways is the largest Config.Gateways Run accepts.
const MaxGateways = 64

// router is one gateway of a simulated deployment: its own
// gateway.Gateway (index, in-flight and pending counts, demand sketch) and
// the hooks of its own instance of a reference policy.
//
// With Config.Gateways = G > 1, G routers share the traffic as replicas of
// the gateway behind a load balancer: request n goes to gatewayOf(seed, n,
// G). Every router is pushed the engines' scraped load at each refresh, as
// every replica of a gateway scrapes the same engines; only the router
// that placed a request hears of its first token and completion (its
// Decision, its Tracker), so in-flight and pending counts are each its own;
// and in exact-index mode every router's index is fed every engine's KV
// events, as every gateway subscribes to every engine. In approximate mode
// a router's index learns only from its own routing decisions.
type router struct {
	g *gateway.Gateway
	// policy is the router's own policy instance, when made by Policy.New.
	policy gateway.Policy
	// fq holds the requests of this gateway under flow control; nil
	// without.
	fq *flow.Queue[*seq]
	// rate is this gateway's rate limiter (Config.RateLimit); nil
	// without.
	rate *flow.RateLimiter

	// Hooks of a reference policy that follows requests, reads KV events
	// or predicts hits with an index of its own; nil otherwise.
	tracker reference.Tracker
	kv      reference.KVListener
	pred    reference.Predictor
	// blind: the router's front hears no first token of a client that
	// does not stream, only its end (set per run in newEngine).
	blind bool
}

// refresher is implemented by test policies that model a signal the
// simulated engines or gateways would share (sharedload_test.go): after
// every load refresh, each router's policy that implements it is told,
// with the engine and the router's index in it.
type refresher interface {
	refreshed(e *engine, gw int)
}

// afterRefresh tells every router's policy that implements refresher that
// the load was refreshed.
func (e *engine) afterRefresh() {
	for i := range e.gws {
		if r, ok := e.gws[i].policy.(refresher); ok {
			r.refreshed(e, i)
		}
	}
}

// sharePending, with Config.SharePending and more than one gateway,
// takes every gateway's PendingPrefill per replica, as each would expose
// it to its peers at this refresh, into e.peerOwn (gateway-major), the
// least each reports at any replica into e.peerLeast and its mean per
// replica, rounded up, into e.peerMean, and reports true; else false.
func (e *engine) sharePending() bool {
	if !e.cfg.SharePending || len(e.gws) < 2 {
		return false
	}
	n := len(e.reps)
	if len(e.peerOwn) != n*len(e.gws) {
		e.peerOwn, e.peerLeast, e.peerMean = make([]int, n*len(e.gws)), make([]int, len(e.gws)), make([]int, len(e.gws))
	}
	for i := range e.gws {
		sum := 0
		for _, st := range e.gws[i].g.Replicas() {
			e.peerOwn[i*n+int(e.byNm[st.Name])] = st.PendingPrefill
			sum += st.PendingPrefill
		}
		e.peerLeast[i] = slices.Min(e.peerOwn[i*n : (i+1)*n])
		e.peerMean[i] = (sum + n - 1) / n
	}
	return true
}

// peerPrefill is what gateway i takes of its peers' pending prefill at
// replica ri, as the HTTP gateway's peer round does: each peer's report
// capped by fleet.PeerCap (beyond the least it reports in the pool, at
// most half of gateway i's own mean per replica), summed over the peers.
func (e *engine) peerPrefill(i, ri int) int {
	n := len(e.reps)
	own, sum := e.peerMean[i], 0
	for j := range e.gws {
		if j != i {
			sum += fleet.PeerCap(own, e.peerOwn[j*n+ri], e.peerLeast[j])
		}
	}
	return sum
}

// peerApart reports whether the gateways share their pending prefill on
// a clock of its own (Config.PeerRefreshInterval) rather than at every
// load refresh.
func (e *engine) peerApart() bool {
	return e.cfg.PeerRefreshInterval > 0 && e.cfg.SharePending && len(e.gws) >= 2
}

// sharePeers pushes every gateway the others' pending prefill as of now,
// with each replica's load as last scraped, and the time it was (as the
// HTTP gateway feeds its peers' counts between the engines' scrapes).
func (e *engine) sharePeers() {
	if !e.sharePending() || len(e.lastLoad) != len(e.reps) {
		return // before the first load refresh
	}
	n := len(e.reps)
	for ri, r := range e.reps {
		for i := range e.gws {
			l := e.lastLoad[ri]
			l.PeerPrefill = e.peerPrefill(i, ri)
			e.peerShared[i*n+ri] = l.PeerPrefill
			_ = e.gws[i].g.UpdateLoad(r.name, l)
		}
	}
}

// gatewayOf returns the gateway, in 0..n-1, that request id (counted from
// 1 in arrival order) reaches: a uniform draw seeded by seed and id alone,
// so every policy's run sends each request through the same gateway, as a
// load balancer spreading connections at random would.
func gatewayOf(seed, id uint64, n int) int {
	if n <= 1 {
		return 0
	}
	return int(mix64(seed^0x6a09e667f3bcc908, id) % uint64(n))
}

// policySeed is the seed of gateway i's policy instance: Config.Seed for
// the first, so that one gateway runs as before, and a distinct stream for
// each other, so that randomised tie-breaks are not in lockstep.
func policySeed(seed uint64, i int) uint64 {
	if i == 0 {
		return seed
	}
	return mix64(seed, 0x9e3779b97f4a7c15*uint64(i))
}

// mix64 hashes two words with SplitMix64's finaliser (hashtab.Mix64).
func mix64(a, b uint64) uint64 { return hashtab.Mix64(a, b) }

// routerStats sums the Stats of every gateway.
func routerStats(rs []router) gateway.Stats {
	st := rs[0].g.Stats()
	if len(rs) == 1 {
		return st
	}
	st.ByKind = maps.Clone(st.ByKind)
	for _, r := range rs[1:] {
		o := r.g.Stats()
		st.Routed += o.Routed
		st.Hits += o.Hits
		st.SLOExcluded += o.SLOExcluded
		st.SLOFallbacks += o.SLOFallbacks
		st.NoMatch += o.NoMatch
		st.LoadGuard += o.LoadGuard
		st.NoHealthy += o.NoHealthy
		st.Blocks += o.Blocks
		st.MatchedBlocks += o.MatchedBlocks
		st.ObjectiveRequests += o.ObjectiveRequests
		st.ObjectiveBestEffort += o.ObjectiveBestEffort
		st.TTFTMet += o.TTFTMet
		st.TTFTMissed += o.TTFTMissed
		st.TPOTMet += o.TPOTMet
		st.TPOTMissed += o.TPOTMissed
		for k, v := range o.ByKind {
			if st.ByKind == nil {
				st.ByKind = map[string]uint64{}
			}
			st.ByKind[k] += v
		}
	}
	return st
}

// routerReplicas returns the replicas as the gateways see them together:
// the first gateway's view (load, latency, health, its index's cached
// blocks), with the counts each gateway keeps of its own traffic (in
// flight, pending and assigned prefill, routed, hits) summed over all.
func routerReplicas(rs []router) []gateway.ReplicaStatus {
	out := rs[0].g.Replicas()
	for _, r := range rs[1:] {
		for i, o := range r.g.Replicas() {
			if i >= len(out) || out[i].Name != o.Name {
				continue
			}
			x := &out[i]
			x.InFlight += o.InFlight
			x.PendingPrefill += o.PendingPrefill
			x.AssignedPrefill += o.AssignedPrefill
			x.Routed += o.Routed
			x.Hits += o.Hits
		}
	}
	return out
}

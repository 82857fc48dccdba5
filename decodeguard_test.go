package gateway

import (
	"testing"
	"time"

	"github.com/examlops/gateway/keys"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// drawTimedCands draws candidates for the decode guard priced in time
// (CacheAware): known speeds, all equal (no speed classes, where the
// pricing applies) or drawn apart, some unknown, and times per output
// token, with distinct LastPicked so that no two tie in every respect
// (the tie order, not a draw, settles equal costs).
func drawTimedCands(t *rapid.T, n, keyLen int) []Candidate {
	cands := drawCands(t, n, keyLen)
	equal := rapid.Bool().Draw(t, "equalSpeeds")
	base := time.Duration(rapid.Int64Range(int64(time.Millisecond), int64(20*time.Millisecond)).Draw(t, "blockTime"))
	last := make([]int, n)
	for i := range last {
		last[i] = i
	}
	last = rapid.Permutation(last).Draw(t, "lastPicked")
	for i := range cands {
		c := &cands[i]
		c.LastPicked = uint64(last[i]) + 1
		c.CacheBlocks = rapid.IntRange(1, 2*keyLen).Draw(t, "cacheBlocks")
		switch {
		case rapid.IntRange(0, 5).Draw(t, "unknown") == 0:
		case equal:
			c.BlockTime = base
		default:
			c.BlockTime = time.Duration(rapid.Int64Range(int64(time.Millisecond), int64(40*time.Millisecond)).Draw(t, "ownBlockTime"))
		}
	}
	return cands
}

// drawTimedCase draws 2 to 8 candidates (drawTimedCands), a CacheAware
// and a request for them, over either index.
func drawTimedCase(t *rapid.T) ([]Candidate, *CacheAware, *Request) {
	n := rapid.IntRange(2, 8).Draw(t, "candidates")
	keyLen := rapid.IntRange(1, 16).Draw(t, "keyLen")
	cands := drawTimedCands(t, n, keyLen)
	p := drawCacheAware(t)
	req := caReqDemand(t, keyLen, cands)
	req.exact = rapid.Bool().Draw(t, "exact")
	return cands, p, req
}

// TestPropTimedGuardKeepsHolders: the decode guard priced in time at a
// holder of the longest prefix only ever lowers a holder's cost, never
// another candidate's: learning the replicas' times per output token
// (TokenTime) never moves a request from a holder of the longest prefix
// to a replica lacking it, whatever the load, weights, cap, demand,
// speeds and index.
func TestPropTimedGuardKeepsHolders(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cands, p, req := drawTimedCase(t)
		blind := p.Pick(req, cands)
		for i := range cands {
			if rapid.IntRange(0, 4).Draw(t, "tokenUnknown") > 0 {
				cands[i].TokenTime = time.Duration(rapid.Int64Range(1, int64(100*time.Millisecond)).Draw(t, "tokenTime"))
			}
		}
		timed := p.Pick(req, cands)
		if req.MaxMatched > 0 && cands[blind].Matched == req.MaxMatched {
			require.Equal(t, req.MaxMatched, cands[timed].Matched,
				"without token times %s (a holder) won, with them %s, holding %d of %d", cands[blind].Name, cands[timed].Name, cands[timed].Matched, req.MaxMatched)
		}
	})
}

// TestPropTimedGuardMonotone: at a holder of the longest prefix, priced in
// time or not, more requests outstanding never make it win a request it
// lost: the guard's cost, min(DecodeWeight, TokenTime/(Outstanding·
// BlockTime)) per request beyond the spread, grows with Outstanding.
func TestPropTimedGuardMonotone(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cands, p, req := drawTimedCase(t)
		for i := range cands {
			cands[i].TokenTime = time.Duration(rapid.Int64Range(0, int64(100*time.Millisecond)).Draw(t, "tokenTime"))
		}
		if req.MaxMatched == 0 {
			return
		}
		h := -1
		for i, c := range cands {
			if c.Matched == req.MaxMatched {
				h = i
				break
			}
		}
		if p.Pick(req, cands) == h {
			return
		}
		busier := cands[h]
		busier.InFlight = busier.Outstanding() + rapid.IntRange(1, 20).Draw(t, "more")
		cands[h] = busier
		require.NotEqual(t, h, p.Pick(req, cands), "%s, holding the prefix, lost the request, and won it with %d requests outstanding", busier.Name, busier.InFlight)
	})
}

// TestRouteAllocsTimedGuard: routing where the decode guard is priced in
// time (equal learned speeds, a key held by one replica with requests
// decoding there beyond the spread) allocates nothing; and it keeps the
// request at the holder, as priced in blocks it would not.
func TestRouteAllocsTimedGuard(t *testing.T) {
	g := mustNew(t, replicaNames(8), WithMode(ModeCacheAware))
	perBlock := map[string]time.Duration{}
	for _, n := range replicaNames(8) {
		perBlock[n.Name] = 2 * time.Millisecond
	}
	learnGateway(t, g, perBlock)
	k := keys.AppendHashes(nil, []uint64{7, 8, 9})
	holder, open := decodingAtHolder(t, g, k)
	// 50 routes of the key keep its share of the traffic (Request.Demand)
	// under an eighth: no replication, the holder alone holds it.
	require.Zero(t, testing.AllocsPerRun(50, func() {
		d, err := g.Route(k)
		if err != nil {
			panic(err)
		}
		if d.Replica != holder {
			panic("routed to " + d.Replica + ", away from the holder " + holder)
		}
		d.Done(DoneInfo{TTFT: 2 * time.Millisecond, Elapsed: 22 * time.Millisecond, OutputTokens: 11})
	}))
	for _, d := range open {
		d.Done(DoneInfo{})
	}
	// Priced in blocks (times per output token unknown: no speed learned),
	// the 10 requests decoding at the holder send the request away.
	g = mustNew(t, replicaNames(8), WithMode(ModeCacheAware))
	holder, _ = decodingAtHolder(t, g, k)
	d, err := g.Route(k)
	require.NoError(t, err)
	require.NotEqual(t, holder, d.Replica, "in blocks the guard sends it away: the case above is the timed one")
}

// decodingAtHolder routes k on g once, then 9 more times to the replica
// it went to, each past its first token (decoding there): that replica
// and the 10 open decisions.
func decodingAtHolder(t *testing.T, g *Gateway, k Key) (string, []Decision) {
	t.Helper()
	d, err := g.Route(k)
	require.NoError(t, err)
	holder := d.Replica
	d.FirstToken()
	only := Target{Allow: func(name string) bool { return name == holder }}
	open := []Decision{d}
	for range 9 {
		d, err := g.RouteWith(k, only)
		require.NoError(t, err)
		d.FirstToken() // decoding there
		open = append(open, d)
	}
	return holder, open
}

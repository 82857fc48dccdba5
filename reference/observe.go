package reference

import (
	"math/rand/v2"
	"time"

	"github.com/examlops/gateway"
)

// Arrival describes a request about to be routed beyond its prefix key:
// what a router from the field reads from the request itself (its length,
// its first user message) and the time it reads it at.
type Arrival struct {
	// ID identifies the request until Done; unique among requests in
	// flight.
	ID uint64
	// Time is when the request reaches the router.
	Time time.Time
	// Tokens is the prompt length in tokens.
	Tokens int
	// BlockTokens is the number of tokens per block of the request's Key.
	BlockTokens int
	// UserContent identifies the leading characters of the request's
	// first user message (KubeAI's CHWBL hashes its first 100 characters);
	// requests whose first user message starts alike share it.
	UserContent uint64
	// BaseKey, for a request naming a LoRA adapter, is its prompt's key
	// without the adapter's salt (the request's Key is salted), for
	// routers that match the prompt's text alone whatever the adapter;
	// nil otherwise. Valid until the Pick that follows.
	BaseKey gateway.Key
}

// Tracker is implemented by the policies that follow each request's life
// themselves, as the routers they reproduce do: SGLang's counts and radix
// tree, Dynamo's active sequences, GIE's prefix index, KubeAI's prefix.
//
// A request's progress reaches the policy through the gateway, as any
// observing policy's does (gateway.Observer): Routed right after the Pick
// that placed it, then FirstToken and Done from the request's Decision,
// under the gateway's request id. Arrive is what the gateway cannot give:
// what a router reads of the request beyond its key (its length, its first
// user message, when it arrived), announced just before the Route (and so
// the Pick) that places it; Arrive and that Route must not interleave with
// another request's, which the simulator, routing one request at a time,
// guarantees. A Tracker not told of a request routes it as one of zero
// tokens arriving at the time of the last Arrive.
type Tracker interface {
	gateway.Observer
	// Arrive announces the request the next Pick places.
	Arrive(a Arrival)
}

// KVListener is implemented by the policies that keep their own view of
// the engines' caches from their KV events, as Dynamo's indexer does.
type KVListener interface {
	// KVEvent reports a change in replica's prefix cache.
	KVEvent(replica string, ev gateway.CacheEvent)
}

// Predictor is implemented by the policies that match prefixes against an
// index of their own rather than the gateway's: Predicted is how many
// leading blocks of the last request their index matched on the replica
// they chose, what they expected to find cached.
type Predictor interface {
	// Predicted returns the blocks matched on the last pick's replica.
	Predicted() int
}

// pending holds the Arrival of the request being routed.
type pending struct {
	a   Arrival
	set bool
}

// take returns the announced arrival, or one of zero tokens at the last
// arrival's time when none was announced, and clears it.
func (p *pending) take() Arrival {
	a := p.a
	if !p.set {
		a = Arrival{Time: p.a.Time}
	}
	p.set = false
	return a
}

// seeded is a random source for tie-breaks, seeded so that a run is
// reproducible: the same seed gives the same draws. Not safe for
// concurrent use; the policies hold their own lock while drawing.
type seeded struct{ rng *rand.Rand }

func newSeeded(seed, stream uint64) seeded {
	return seeded{rng: rand.New(rand.NewPCG(seed, stream))}
}

// intN returns a uniform draw in [0, n).
func (s seeded) intN(n int) int { return s.rng.IntN(n) }

// ties collects the candidates tied for best so that one is drawn
// uniformly at random; its scratch slice is reused across picks.
type ties struct{ idx []int }

func (t *ties) reset()    { t.idx = t.idx[:0] }
func (t *ties) add(i int) { t.idx = append(t.idx, i) }
func (t *ties) n() int    { return len(t.idx) }

// draw returns one of the collected candidates, uniformly at random.
func (t *ties) draw(r seeded) int {
	if len(t.idx) == 1 {
		return t.idx[0]
	}
	return t.idx[r.intN(len(t.idx))]
}

package sim

import (
	"math"
	"time"

	"testing"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/reference"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNonStreamed: clients that do not stream change only what the
// gateway's own Decision hears: round_robin and the peers (which keep
// their own signals) route exactly as when every client streams, while
// cache_aware, whose pending prefill is now freed at completion, routes
// differently; the draw is the seed's, so runs repeat.
func TestNonStreamed(t *testing.T) {
	w, err := Chat(ChatConfig{Requests: 1500, Rate: 30, Sessions: 60})
	require.NoError(t, err)
	var pols []Policy
	for _, n := range []string{"round_robin", "cache_aware", "dynamo", "sglang"} {
		p, err := PolicyByName(n)
		require.NoError(t, err)
		pols = append(pols, p)
	}
	run := func(f float64) *Report {
		rep, err := Run(Config{Workload: w, Replicas: 4, Seed: 3, Policies: pols, NonStreamed: f, Parallel: 1})
		require.NoError(t, err)
		return rep
	}
	all, none, half := run(0), run(1), run(0.5)
	for _, i := range []int{0, 2, 3} {
		assert.Equal(t, all.Results[i].RequestsPerReplica, none.Results[i].RequestsPerReplica, all.Results[i].Policy)
		assert.Equal(t, all.Results[i].TTFT, none.Results[i].TTFT, all.Results[i].Policy)
	}
	assert.NotEqual(t, all.Results[1].RequestsPerReplica, none.Results[1].RequestsPerReplica)
	assert.NotEqual(t, half.Results[1].RequestsPerReplica, none.Results[1].RequestsPerReplica)
	assert.Equal(t, half.Results, run(0.5).Results)
	assert.Equal(t, 0.5, half.NonStreamed)

	for _, bad := range []float64{-0.1, 1.5, math.NaN()} {
		_, err := Run(Config{Workload: w, NonStreamed: bad, Policies: pols[:1]})
		assert.ErrorIs(t, err, ErrInvalidConfig)
		assert.ErrorContains(t, err, "NonStreamed")
	}
}

// blindPeer is a peer that follows its requests behind a front blind to
// a non-streamed answer's first token (Policy.BlindToUnstreamed): it
// notes, per request, when it heard the first token and when the end.
type blindPeer struct {
	gateway.RoundRobin
	now         func() time.Time
	first       map[uint64]time.Time
	early, done int
}

func (p *blindPeer) SetClock(now func() time.Time) { p.now = now }
func (p *blindPeer) Arrive(reference.Arrival)      {}
func (p *blindPeer) Routed(uint64, string)         {}
func (p *blindPeer) FirstToken(id uint64)          { p.first[id] = p.now() }
func (p *blindPeer) Done(id uint64, info gateway.DoneInfo) {
	// The front saw no first token (TTFT 0): the peer must have heard it
	// at the answer's first byte, its end, now.
	if at, ok := p.first[id]; ok && info.TTFT == 0 {
		p.done++
		if at.Before(p.now()) {
			p.early++
		}
	}
	delete(p.first, id)
}

// TestPredictedReleaseIsTheGatewaysFront: Config.PredictedRelease is the
// gateway's own fronts' rule. A peer behind a front blind to non-streamed
// first tokens hears them at the answer's end, as without it; it used to
// be told of them at the gateway's predicted TTFT (the release timer's
// FirstToken reached its Decision's observer), which changed llm-d's
// predicted-latency rows with --streamed 0.5 (trace ×2 on 4 replicas:
// TTFT mean 134 → 105 s with --predicted-release).
func TestPredictedReleaseIsTheGatewaysFront(t *testing.T) {
	var peers []*blindPeer
	pol := Policy{Name: "blind_peer", Source: "a test peer", BlindToUnstreamed: true, New: func(uint64) gateway.Policy {
		p := &blindPeer{first: map[uint64]time.Time{}}
		peers = append(peers, p)
		return p
	}}
	for _, up := range []bool{true, false} {
		peers = nil
		cfg := Config{Workload: fixture(t, TraceOptions{Speed: 2}), Replicas: 4, Seed: 1, Policies: []Policy{pol},
			NonStreamed: 0.5, UpstreamStream: up, PredictedRelease: true}
		_, err := Run(cfg)
		require.NoError(t, err)
		require.Len(t, peers, 1)
		require.Positive(t, peers[0].done, "the test needs non-streamed requests")
		assert.Zero(t, peers[0].early, "upstream stream %v: non-streamed first tokens heard before the end, of %d", up, peers[0].done)
	}
}

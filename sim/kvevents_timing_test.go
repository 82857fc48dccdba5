package sim

import (
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// kvRecorder is a peer that picks the first candidate and records the KV
// events it hears, with the simulated time.
type kvRecorder struct {
	now    func() time.Time
	events *[]kvAt
}

type kvAt struct {
	at   time.Duration
	kind gateway.CacheEventKind
}

func (p *kvRecorder) Pick(*gateway.Request, []gateway.Candidate) int { return 0 }
func (p *kvRecorder) SetClock(now func() time.Time)                  { p.now = now }
func (p *kvRecorder) KVEvent(_ string, ev gateway.CacheEvent) {
	*p.events = append(*p.events, kvAt{time.Duration(p.now().UnixNano()), ev.Kind})
}

// TestEvictionEventsAtStepEnd: the blocks a step's admission evicts are
// told of when that step ends, with the blocks it stores, as vLLM v1
// publishes a step's KV events (Scheduler.update_from_output): a router
// does not learn of an eviction before the step that made it has run.
func TestEvictionEventsAtStepEnd(t *testing.T) {
	p := smallPreset()
	p.KVTokens = 8 * 16 // 8 blocks of 16 tokens
	reqs := []Request{
		{InputTokens: 64, OutputTokens: 1, Blocks: []uint64{1, 2, 3, 4}},
		{Arrival: time.Second, InputTokens: 96, OutputTokens: 1, Blocks: []uint64{11, 12, 13, 14, 15, 16}},
	}
	var events []kvAt
	pol := Policy{Name: "recorder", Source: "test", New: func(uint64) gateway.Policy { return &kvRecorder{events: &events} }}
	rep, err := Run(Config{Workload: &listWorkload{bt: 16, reqs: reqs}, Replicas: 1, Preset: p, Seed: 1, Policies: []Policy{pol}})
	require.NoError(t, err)
	require.Equal(t, 2, rep.Results[0].Completed)
	var removed, stored []time.Duration
	for _, ev := range events {
		switch {
		case ev.kind == gateway.BlocksRemoved:
			removed = append(removed, ev.at)
		case ev.at >= time.Second:
			stored = append(stored, ev.at)
		}
	}
	require.NotEmpty(t, removed, "the second request evicts the first's blocks")
	require.NotEmpty(t, stored)
	assert.Greater(t, removed[0], time.Second, "not told at admission, before the step ran")
	assert.Equal(t, stored[0], removed[0], "told at the end of the step that admitted it, with its blocks stored")
}

package sim

import (
	"errors"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// endless is a workload of one 4-block prompt (of adapter, "" the base
// model) every gap, a fresh one each time, with no end: its stream fails
// with errEndless after limit requests, so that a run which would never
// stop ends there instead.
type endless struct {
	gap     time.Duration
	limit   int
	adapter string
}

var errEndless = errors.New("endless: the run did not stop")

func (w endless) Name() string                { return "endless" }
func (w endless) BlockTokens() int            { return 512 }
func (w endless) Open(uint64) (Stream, error) { return &endlessStream{w: w}, nil }
func (s *endlessStream) Len() int             { return -1 }
func (s *endlessStream) Close() error         { return nil }
func (s *endlessStream) Next(r *Request) error {
	if s.n == s.w.limit {
		return errEndless
	}
	s.n++
	id := uint64(s.n) << 8
	*r = Request{Arrival: time.Duration(s.n) * s.w.gap, InputTokens: 4 * 512, OutputTokens: 8,
		Blocks: []uint64{id, id + 1, id + 2, id + 3}, Adapter: s.w.adapter}
	return nil
}

type endlessStream struct {
	w endless
	n int
}

// TestStall: an engine whose state leaked (blocks left pinned or
// reserved, an adapter slot left held, a request counted in flight that
// no replica has, a front holding requests on a replica's leaked KV use)
// ends its run with ErrStalled, naming what is stuck, soon after the
// stall (a few requests of the endless stream), instead of ticking load
// refreshes forever. The leaks are injected in the engine's state before
// the run; on a simulator without the checks the run would never end,
// and here it stops at the stream's limit with errEndless instead.
func TestStall(t *testing.T) {
	leakPins := func(e *engine) { // a request's blocks never released
		c := e.reps[0].cache
		key, slots := make([]uint64, c.cap), make([]int32, c.cap)
		for i := range key {
			key[i] = uint64(i) + 1
		}
		c.admit(key, slots, 0, 0)
		c.commit(key, slots, 0)
	}
	tests := []struct {
		name    string
		pol     Policy
		adapter string
		leak    func(*engine)
		want    []string // in the error
	}{
		{"pinned blocks", cacheAware, "", leakPins,
			[]string{`policy "cache_aware", replica r0`, "1 waiting, 0 running, 64 of 64 blocks pinned and 0 reserved", "needs 5 blocks, 0 are free"}},
		{"reserved blocks", cacheAware, "", func(e *engine) { e.reps[0].cache.reserved = e.cap },
			[]string{"replica r0", "0 of 64 blocks pinned and 64 reserved"}},
		{"adapter slot", cacheAware, "a", func(e *engine) { e.reps[0].lora.active = e.lora.max },
			[]string{"replica r0", "0 running, 0 of 64 blocks pinned and 0 reserved, 1 of 1 adapter slots held"}},
		{"in flight on no replica", cacheAware, "", func(e *engine) { e.inflight++ },
			[]string{`policy "cache_aware" at t=`, "1 requests in flight (0 waiting on the replicas, none running), 0 held, no replica stepping"}},
		{"held on leaked KV use", GIEFlowPolicy(), "", func(e *engine) { e.reps[0].cache.reserved = e.cap },
			[]string{`policy "gie_flow" at t=`, "0 requests in flight (0 waiting on the replicas, none running), 1 held"}},
		{"prefill without end", cacheAware, "", func(e *engine) {
			// A request the engine lost count of: more tokens left to
			// prefill than any prompt has; its steps never end.
			e.reps[0].prefill = append(e.reps[0].prefill, &seq{in: 1, out: 1, left: math.MaxInt32})
		}, []string{"replica r0 at t=", "1 steps for 0 tokens admitted, 1 waiting, 1 prefilling, 0 decoding"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const limit = 1000
			cfg := Config{Workload: endless{gap: time.Second, limit: limit, adapter: tt.adapter}, Replicas: 1, Preset: smallPreset(), Seed: 1}
			e, st := openEngine(t, cfg, tt.pol)
			tt.leak(e)
			err := e.run(st, func() {})
			require.ErrorIs(t, err, ErrStalled)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
			// Found within the first requests (one a second), not at the
			// stream's end.
			assert.LessOrEqual(t, st.(*endlessStream).n, 3, "requests read before the stall was found")
		})
	}
}

// TestStallNotOnIdle: an engine idle between requests far apart (nothing
// in flight for minutes of refreshes) is not stalled, nor is one whose
// requests wait for their adapter's slot behind running ones.
func TestStallNotOnIdle(t *testing.T) {
	for _, adapters := range []int{0, 3} {
		t.Run(strconv.Itoa(adapters), func(t *testing.T) {
			w := endless{gap: 5 * time.Minute, limit: 20}
			cfg := Config{Workload: w, Replicas: 1, Preset: smallPreset(), Seed: 1}
			if adapters > 0 {
				lw, err := LoRAWorkload(LoRAConfig{Requests: 200, Rate: 200, Adapters: adapters})
				require.NoError(t, err)
				cfg.Workload = lw
			}
			e, st := openEngine(t, cfg, cacheAware)
			err := e.run(st, func() {})
			if adapters == 0 {
				require.ErrorIs(t, err, errEndless) // every request of the endless stream ran
				return
			}
			require.NoError(t, err)
			res := e.result()
			assert.Equal(t, 200, res.Completed)
			require.NotNil(t, res.LoRA)
			assert.Positive(t, res.LoRA.SlotWaits, "requests waited for an adapter slot")
		})
	}
}

// TestStallNotOnGIETick: GIE's flow controller holding requests behind a
// saturation its last scrape reported, when the replica drains between
// two scrapes a millisecond apart, dispatches at the tick its next scrape
// schedules, a millisecond on: at the same instant as the scrape after
// it. The run is not stalled. It used to end with ErrStalled there: the
// rule counted the two scrapes as quiet, blind to the tick pending.
func TestStallNotOnGIETick(t *testing.T) {
	reqs := []Request{{InputTokens: 56 * 512, OutputTokens: 4, Blocks: make([]uint64, 56)}} // 56 of the 64 blocks: saturated
	for i := range reqs[0].Blocks {
		reqs[0].Blocks[i] = uint64(i + 1)
	}
	for i := range 3 {
		reqs = append(reqs, Request{Arrival: time.Duration(1500+i*1000) * time.Microsecond, InputTokens: 512, OutputTokens: 4,
			Blocks: []uint64{uint64(100 + i)}})
	}
	rep, err := Run(Config{Workload: &listWorkload{bt: 512, reqs: reqs}, Replicas: 1, Preset: smallPreset(), Seed: 1,
		RefreshInterval: time.Millisecond, Policies: []Policy{GIEFlowPolicy()}})
	require.NoError(t, err)
	r := rep.Results[0]
	assert.Equal(t, len(reqs), r.Completed)
	assert.Positive(t, r.QueueTime.Max, "requests were held")
}

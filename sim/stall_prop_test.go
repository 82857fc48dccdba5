package sim

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/flow"
	fronts "github.com/examlops/gateway/internal/front"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestPropNoFalseStall: no correct run ends with ErrStalled, across the
// features the stall rules reason about (stall.go): prompts from one
// token to more than the cache holds, answers of 0 tokens up, shared
// prefixes, bursts and idle gaps, LoRA adapters competing for few
// slots, --cache-at-schedule, speed changes down to a thousandth, several
// gateways, streamed or not with the pending prefill released at
// completion or at its prediction, admission shedding, flow control with
// a TTL and GIE's without, a bounded engine queue, the exact index,
// shared pending prefill, objectives sent or not and refused or not, and
// one to three replicas of a 16-block cache, under cache-aware,
// round-robin, GIE's flow control and llm-d's precise scheduler. Every
// request gets an outcome.
func TestPropNoFalseStall(t *testing.T) {
	peer, err := PolicyByName("llmd_precise") // a peer with its own tracker
	require.NoError(t, err)
	rapid.Check(t, func(rt *rapid.T) {
		const bt = 16
		p := DefaultPreset()
		p.Name, p.KVTokens = "tiny", 16*bt
		adapters := rapid.IntRange(0, 4).Draw(rt, "adapters")
		n := rapid.IntRange(1, 40).Draw(rt, "requests")
		reqs := make([]Request, n)
		at := time.Duration(0)
		for i := range reqs {
			switch rapid.IntRange(0, 9).Draw(rt, "gap") {
			case 0: // a burst
			case 1:
				at += time.Duration(rapid.Int64Range(1, int64(20*time.Second)).Draw(rt, "idle")) // refreshes tick through it
			default:
				at += time.Duration(rapid.Int64Range(1, int64(50*time.Millisecond)).Draw(rt, "gapNs"))
			}
			in := rapid.IntRange(1, 20*bt).Draw(rt, "in") // past 16 blocks: fails at arrival
			blocks := make([]uint64, (in+bt-1)/bt)
			prefix := rapid.IntRange(0, len(blocks)).Draw(rt, "shared")
			for j := range blocks {
				if j < prefix {
					blocks[j] = uint64(j + 1) // one shared prompt
				} else {
					blocks[j] = uint64(i+1)<<16 | uint64(j)
				}
			}
			r := Request{Arrival: at, InputTokens: in, OutputTokens: rapid.IntRange(0, 40).Draw(rt, "out"), Blocks: blocks,
				Tenant: fmt.Sprintf("t%d", rapid.IntRange(0, 2).Draw(rt, "tenant")), Priority: rapid.IntRange(-1, 1).Draw(rt, "priority")}
			if rapid.Bool().Draw(rt, "objective") {
				r.SLO = time.Duration(rapid.Int64Range(1, int64(time.Second)).Draw(rt, "ttftSLO"))
				r.TPOTSLO = time.Duration(rapid.Int64Range(0, int64(50*time.Millisecond)).Draw(rt, "tpotSLO"))
			}
			if adapters > 0 {
				if a := rapid.IntRange(0, adapters).Draw(rt, "adapter"); a > 0 {
					r.Adapter = fmt.Sprintf("a%d", a)
				}
			}
			reqs[i] = r
		}
		replicas := rapid.IntRange(1, 3).Draw(rt, "replicas")
		cfg := Config{Workload: &listWorkload{bt: bt, reqs: reqs}, Preset: p, Replicas: replicas, Seed: rapid.Uint64Range(1, 9).Draw(rt, "seed"),
			Gateways: rapid.IntRange(1, 3).Draw(rt, "gateways"), CacheAtSchedule: rapid.Bool().Draw(rt, "cacheAtSchedule"),
			NonStreamed: rapid.SampledFrom([]float64{0, 0.5, 1}).Draw(rt, "nonStreamed"), UpstreamStream: rapid.Bool().Draw(rt, "upstream"),
			PredictedRelease: rapid.Bool().Draw(rt, "predictedRelease"), MaxLoras: rapid.IntRange(1, 2).Draw(rt, "maxLoras"),
			RefreshInterval: time.Duration(rapid.SampledFrom([]int{1, 50, 1000}).Draw(rt, "refreshMs")) * time.Millisecond,
			MaxQueue:        rapid.IntRange(0, 3).Draw(rt, "maxQueue"),
			Index:           rapid.SampledFrom([]IndexMode{IndexApproximate, IndexExact}).Draw(rt, "index"),
			SharePending:    rapid.Bool().Draw(rt, "sharePending"), ObjectiveHeaders: rapid.Bool().Draw(rt, "objectiveHeaders"),
			Unattainable: rapid.SampledFrom([]fronts.Unattainable{fronts.BestEffort, fronts.Reject}).Draw(rt, "unattainable"),
			Policies:     []Policy{cacheAware, {Name: "round_robin", Mode: gateway.ModeRoundRobin}, GIEFlowPolicy(), peer}}
		if rapid.Bool().Draw(rt, "admission") {
			cfg.Admission = gateway.Admission{QueueDepth: rapid.IntRange(0, 2).Draw(rt, "admitQueue"), Outstanding: rapid.IntRange(1, 4).Draw(rt, "admitOutstanding"),
				PendingPrefill: rapid.IntRange(0, 20).Draw(rt, "admitPending")}
			if rapid.Bool().Draw(rt, "flow") {
				cfg.FlowControl = FlowControl{Enabled: true, Queue: flow.Config{TTL: time.Duration(rapid.IntRange(1, 3600).Draw(rt, "ttlS")) * time.Second}}
			}
		}
		for range rapid.IntRange(0, 3).Draw(rt, "speedChanges") {
			cfg.SpeedChanges = append(cfg.SpeedChanges, SpeedChange{Replica: rapid.IntRange(0, replicas-1).Draw(rt, "changed"),
				At: time.Duration(rapid.Int64Range(0, int64(time.Second)).Draw(rt, "changeAt")), Speed: rapid.SampledFrom([]float64{0.001, 0.5, 2}).Draw(rt, "speed")})
		}
		rep, err := Run(cfg)
		if errors.Is(err, ErrInvalidConfig) {
			rt.Skip(err)
		}
		require.NoError(rt, err)
		for _, r := range rep.Results {
			require.Equal(rt, r.Requests, r.Completed+r.Dropped+r.Failed+r.Expired, "%s: every request has an outcome", r.Policy)
		}
	})
}

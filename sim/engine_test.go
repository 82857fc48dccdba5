package sim

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRouterHitRateCountsAdmittedOnly: with MaxQueue shedding most
// requests, the index's predicted hit rate ("index says") counts only the
// admitted requests, like its denominator, so it stays below 1. It used to
// count shed requests too and reached 614%.
func TestRouterHitRateCountsAdmittedOnly(t *testing.T) {
	w, err := SharedPrefix(SharedPrefixConfig{Requests: 4000, Rate: 400, Groups: 4})
	require.NoError(t, err)
	pols := make([]Policy, 0, 2)
	for _, n := range []string{"cache_aware", "round_robin"} {
		p, err := PolicyByName(n)
		require.NoError(t, err)
		pols = append(pols, p)
	}
	for _, idx := range []IndexMode{IndexApproximate, IndexExact} {
		rep, err := Run(Config{Workload: w, Replicas: 2, MaxQueue: 1, Seed: 1, Policies: pols, Index: idx})
		require.NoError(t, err)
		for _, r := range rep.Results {
			require.Positive(t, r.Dropped, "%s: the test needs shed requests", r.Policy)
			assert.Positive(t, r.RouterTokenHitRate, r.Policy)
			assert.Less(t, r.RouterTokenHitRate, 1.0, "%s %v: index says %.3f", r.Policy, idx, r.RouterTokenHitRate)
		}
	}
}

// TestQueuedRequestFindsPrefillInProgress: a second request with the same
// prompt arrives while the first is being prefilled, on the only replica.
// Each step's token budget (8,192) goes to the running prefill first, as
// in vLLM's scheduler, so the second request waits until some budget is
// left, and is then admitted finding the blocks the first one's chunks
// have filled. (The engine used to admit it at once, match nothing, and
// compute the whole prompt again: a token hit rate of 0.)
func TestQueuedRequestFindsPrefillInProgress(t *testing.T) {
	tests := []struct {
		name   string
		tokens int
		hit    float64 // prompt tokens found cached, of both prompts
	}{
		// Two full chunks: the second request is admitted after the first
		// one's prefill and finds all of it but the last token.
		{"two full chunks", 16384, 16383.0 / 32768},
		// 8,192 + 8,192 + 4,096: the third step has 4,096 tokens of budget
		// left, which admits the second request; it finds the 32 blocks
		// the first two chunks filled and computes the last 8 itself.
		{"two and a half chunks", 20480, 16384.0 / 40960},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ids := make([]string, tt.tokens/512)
			for i := range ids {
				ids[i] = fmt.Sprint(i)
			}
			line := func(ts int) string {
				return fmt.Sprintf(`{"timestamp": %d, "input_length": %d, "output_length": 1, "hash_ids": [%s]}`, ts, tt.tokens, strings.Join(ids, ","))
			}
			w, err := TraceBytes("two", []byte(line(0)+"\n"+line(1)+"\n"), TraceOptions{})
			require.NoError(t, err)
			p, err := PolicyByName("round_robin")
			require.NoError(t, err)
			for _, idx := range []IndexMode{IndexApproximate, IndexExact} {
				rep, err := Run(Config{Workload: w, Replicas: 1, Seed: 1, Policies: []Policy{p}, Index: idx})
				require.NoError(t, err)
				r := rep.Results[0]
				require.Equal(t, 2, r.Completed)
				assert.InDelta(t, tt.hit, r.TokenHitRate, 1e-9, "index %v", idx)
				assert.InDelta(t, 0.5, r.RequestHitRate, 1e-9, "index %v", idx)
			}
		})
	}
}

// TestCacheAtSchedule: two requests of one cold 4,096-token prompt wait
// behind a third request's prefill on the only replica, and are admitted
// in the same step (8,192 tokens of budget). With Config.CacheAtSchedule
// the first one's blocks are cached when that step is scheduled, as vLLM
// v1's allocate_slots does, so the second finds all of them but its last
// token; without it, both prefill the whole prompt.
func TestCacheAtSchedule(t *testing.T) {
	const tokens = 4096
	line := func(ts, first int) string {
		ids := make([]string, tokens/512)
		for i := range ids {
			ids[i] = fmt.Sprint(first + i)
		}
		return fmt.Sprintf(`{"timestamp": %d, "input_length": %d, "output_length": 1, "hash_ids": [%s]}`, ts, tokens, strings.Join(ids, ","))
	}
	// The first request's prefill of 4,096 tokens takes longer than 2 ms:
	// both others arrive during it.
	w, err := TraceBytes("burst", []byte(line(0, 100)+"\n"+line(1, 0)+"\n"+line(2, 0)+"\n"), TraceOptions{})
	require.NoError(t, err)
	p, err := PolicyByName("round_robin")
	require.NoError(t, err)
	tests := []struct {
		on      bool
		hit     float64 // prompt tokens found cached, of the three prompts
		reqHit  float64
		prefill int64 // prompt tokens the replica computed
	}{
		{false, 0, 0, 3 * tokens},
		{true, (tokens - 1.0) / (3 * tokens), 1.0 / 3, 2*tokens + 1},
	}
	for _, tt := range tests {
		for _, idx := range []IndexMode{IndexApproximate, IndexExact} {
			t.Run(fmt.Sprintf("on=%v/index=%v", tt.on, idx), func(t *testing.T) {
				rep, err := Run(Config{Workload: w, Replicas: 1, Seed: 1, Policies: []Policy{p}, Index: idx, CacheAtSchedule: tt.on})
				require.NoError(t, err)
				// The report says which rule the engines ran.
				assert.Equal(t, tt.on, rep.CacheAtSchedule)
				var b strings.Builder
				require.NoError(t, rep.WriteTable(&b))
				assert.Equal(t, tt.on, strings.Contains(b.String(), "engines cache blocks when their step is scheduled"))
				var j bytes.Buffer
				require.NoError(t, rep.WriteJSON(&j))
				assert.Equal(t, tt.on, strings.Contains(j.String(), `"cache_at_schedule"`), "in the JSON only when on")
				r := rep.Results[0]
				require.Equal(t, 3, r.Completed)
				assert.InDelta(t, tt.hit, r.TokenHitRate, 1e-9)
				assert.InDelta(t, tt.reqHit, r.RequestHitRate, 1e-9)
				assert.Equal(t, []int64{tt.prefill}, r.PrefillTokens)
			})
		}
	}
}

// TestCacheAtScheduleReleasesPins: whatever the engine rule, every block a
// request pinned (found at admission, or cached when its chunk was
// scheduled) and every block it reserved is released by the end of a
// run: on a cache small enough to evict (the fixture at 4× on 64 blocks),
// with LoRA adapters on one slot (requests skipped and requeued), and on
// either index. A block left pinned would shrink the replica's cache for
// good.
func TestCacheAtScheduleReleasesPins(t *testing.T) {
	lora, err := LoRAWorkload(LoRAConfig{Requests: 300, Rate: 60, Adapters: 4, BaseShare: 0.25})
	require.NoError(t, err)
	for name, w := range map[string]Workload{"fixture-x4": fixture(t, TraceOptions{Speed: 4}), "lora": lora} {
		for _, at := range []bool{false, true} {
			for _, idx := range []IndexMode{IndexApproximate, IndexExact} {
				t.Run(fmt.Sprintf("%s/at=%v/%s", name, at, indexName(idx)), func(t *testing.T) {
					e := flowEngine(t, Config{Workload: w, Replicas: 2, Preset: smallPreset(), Index: idx, Seed: 1, CacheAtSchedule: at}, cacheAware)
					res := e.result()
					require.Positive(t, res.Completed)
					require.Equal(t, res.Requests, res.Completed+res.Failed+res.Dropped)
					for _, r := range e.reps {
						r.cache.check()
						assert.Zero(t, r.cache.pinned, "%s: blocks left pinned", r.name)
						assert.Zero(t, r.cache.reserved, "%s: blocks left reserved", r.name)
					}
				})
			}
		}
	}
}

package sim

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// refreshCount is a round-robin policy counting the load refreshes its
// router is pushed.
type refreshCount struct {
	gateway.RoundRobin
	n *int
}

func (p *refreshCount) refreshed(*engine, int) { *p.n++ }

// gappy is a trace of bursts of requests sharing a prompt, the first at
// 0, the others gap ms apart and off ms later.
func gappy(t *testing.T, gap, off float64) Workload {
	t.Helper()
	var b strings.Builder
	for i := range 4 {
		for j := range 3 {
			ts := float64(i)*gap + float64(j)*3
			if i > 0 {
				ts += off
			}
			fmt.Fprintf(&b, `{"timestamp": %g, "input_length": 1500, "output_length": 40, "hash_ids": [%d, 2, %d]}`+"\n", ts, i%2, 10*i+j)
		}
	}
	w, err := TraceBytes("gappy", []byte(b.String()), TraceOptions{})
	require.NoError(t, err)
	return w
}

// TestIdleGapRefreshes: an idle cluster waiting for a trace's next
// arrival is not refreshed every interval. A gap of 10^5 s between bursts
// cost 2 million load refreshes per gap per policy (a far timestamp in a
// trace, which the decoder accepts up to 285 years, hung the run for
// days); now a handful.
func TestIdleGapRefreshes(t *testing.T) {
	n := 0
	cfg := Config{Workload: gappy(t, 1e8, 7), Replicas: 2, Seed: 1,
		Policies: []Policy{{Name: "count", New: func(uint64) gateway.Policy { return &refreshCount{n: &n} }}}}
	rep, err := Run(cfg)
	require.NoError(t, err)
	require.Equal(t, 12, rep.Results[0].Completed)
	assert.Less(t, n, 1000, "load refreshes for 4 bursts of 3 requests over 3·10^5 s")
}

// TestIdleGapSameReport: skipping the idle ticks changes nothing: the
// reports with and without are the same, with every front (flow control
// and GIE's, whose dispatch reads the scrape's age; peers sharing their
// pending prefill on a clock of their own) and speed changes inside the
// gaps.
func TestIdleGapSameReport(t *testing.T) {
	pols := append(DefaultPolicies(), GIEFlowPolicy())
	pols = append(pols, LLMDPredictedPolicies()...)
	cfgs := map[string]Config{
		"plain": {Workload: gappy(t, 2000, 7), Replicas: 3, Seed: 2, Policies: pols, NonStreamed: 0.5, PredictedRelease: true,
			SpeedChanges: []SpeedChange{{Replica: 1, At: 3 * time.Second, Speed: 0.5}}},
		"peers": {Workload: gappy(t, 2000, 7), Replicas: 3, Seed: 2, Policies: pols, Gateways: 2, SharePending: true,
			PeerRefreshInterval: 13 * time.Millisecond, RefreshInterval: 70 * time.Millisecond, Index: IndexExact},
		// Arrivals 230 ms after a scrape: GIE's controller holds them
		// until the next (its 200 ms staleness).
		"flow": {Workload: gappy(t, 1200, 230), Replicas: 2, Seed: 3, Policies: pols, Admission: gateway.Admission{QueueDepth: 1},
			FlowControl: FlowControl{Enabled: true}, RefreshInterval: 300 * time.Millisecond},
	}
	for name, cfg := range cfgs {
		t.Run(name, func(t *testing.T) {
			skipped, err := Run(cfg)
			require.NoError(t, err)
			noSkip = true
			defer func() { noSkip = false }()
			ticked, err := Run(cfg)
			require.NoError(t, err)
			assert.Equal(t, reportJSON(t, ticked), reportJSON(t, skipped))
		})
	}
}

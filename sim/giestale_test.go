package sim

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGIEStaleMetrics: GIE v1.5.0's utilization detector counts an
// endpoint whose metrics are older than 200 ms as saturated (1), so with
// scrapes 1 s apart its controller holds what arrives 500 ms after a
// scrape until the next one, whatever the last scrape said; with the
// default 50 ms scrapes it dispatches at once.
func TestGIEStaleMetrics(t *testing.T) {
	reqs := []Request{{InputTokens: 64, OutputTokens: 2, Blocks: []uint64{1, 2, 3, 4}}}
	for i := range uint64(5) {
		reqs = append(reqs, Request{Arrival: 500 * time.Millisecond, InputTokens: 64, OutputTokens: 2,
			Blocks: []uint64{10 * (i + 1), 10*(i+1) + 1, 10*(i+1) + 2, 10*(i+1) + 3}})
	}
	run := func(refresh time.Duration) Result {
		rep, err := Run(Config{Workload: &listWorkload{bt: 16, reqs: reqs}, Replicas: 1, Seed: 1,
			RefreshInterval: refresh, Policies: []Policy{GIEFlowPolicy()}})
		require.NoError(t, err)
		res := rep.Results[0]
		require.Equal(t, len(reqs), res.Completed)
		require.NotNil(t, res.QueueTime)
		return res
	}
	slow := run(time.Second)
	assert.GreaterOrEqual(t, slow.QueueTime.P90, 0.49, "held at 500 ms on a 500 ms old scrape, until the scrape at 1 s")
	assert.Less(t, slow.QueueTime.Max, 0.6)
	fast := run(50 * time.Millisecond)
	assert.Less(t, fast.QueueTime.Max, 0.01, "scraped 50 ms apart: never stale")
}

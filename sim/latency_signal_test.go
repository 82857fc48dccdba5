package sim

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUnstreamedLatencySample: the latency sample a front gives Done is
// the time to the answer's first byte, which for a client that does not
// stream is the answer's end: the gateway's smoothed latency (a routing
// signal of load_aware and of cache_aware's fallback) must then be the
// request's end-to-end time, not its true time to first token, which the
// front never saw. With the gateway streaming from the engine
// (UpstreamStream) it sees the first token, and the sample is its TTFT.
func TestUnstreamedLatencySample(t *testing.T) {
	reqs := []Request{{InputTokens: 64, OutputTokens: 200, Blocks: []uint64{1, 2, 3, 4}}}
	p, err := PolicyByName("load_aware")
	require.NoError(t, err)
	run := func(nonStreamed float64, upstream bool) (Result, time.Duration) {
		rep, err := Run(Config{Workload: &listWorkload{bt: 16, reqs: reqs}, Replicas: 1, Seed: 1,
			Policies: []Policy{p}, NonStreamed: nonStreamed, UpstreamStream: upstream})
		require.NoError(t, err)
		res := rep.Results[0]
		require.Equal(t, 1, res.Completed)
		return res, res.RouterReplicas[0].Load.Latency
	}
	res, lat := run(0, false)
	assert.InDelta(t, res.TTFT.Max, lat.Seconds(), 1e-9, "a streamed request's sample is its TTFT")
	res, lat = run(1, false)
	require.Greater(t, res.E2E.Max, 2*res.TTFT.Max)
	assert.InDelta(t, res.E2E.Max, lat.Seconds(), 1e-9, "an unstreamed request's sample is its end, the first byte the front sees")
	res, lat = run(1, true)
	assert.InDelta(t, res.TTFT.Max, lat.Seconds(), 1e-9, "streamed from the engine: its TTFT")
}

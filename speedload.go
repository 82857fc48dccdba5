package gateway

import "math"

// How a replica's step grows with its load, learned from what the front
// observes: each streamed answer's time per output token after its first
// (DoneInfo: Elapsed − TTFT over OutputTokens − 1) against the requests
// outstanding at the replica when it was routed there (Candidate.
// Outstanding, the request included). Its line's slope times the mean load,
// over the mean time per token, is the share of a step that the load adds
// (growth): near 0 where a step is mostly the weights read once (vLLM on an
// H100 as BLIS measured it: 6 µs a sequence on 5.75 ms), a third and more
// where every sequence's KV cache is read (the 8b-h100 preset: 0.15 ms a
// sequence on 6 ms). CacheAware's placement horizon (speedHorizon) grows
// where the pool's steps hardly grow with load (horizonFor): a hot prefix
// then gains from a fast replica without slowing the requests already there.

const (
	// loadDecay is the weight a sample keeps per later sample.
	loadDecay = 0.998
	// loadMinSamples is the decayed count of decode samples before a
	// replica's growth is published.
	loadMinSamples = 200
	// loadMinSpread is the least variance of the load samples (requests²)
	// that tells a slope: loads that hardly varied do not.
	loadMinSpread = 1
)

// loadFit is the decayed least-squares line of a replica's time per
// output token against its load; pure, as speedFit.
type loadFit struct {
	n, x, t, xx, xt float64 // decayed count and sums of x, t, x², x·t
}

// add returns f with the sample t seconds per token at load x. A sample
// that cannot be one leaves f as it is.
func (f loadFit) add(x, t float64) loadFit {
	if !(x >= 0 && t > 0) || math.IsInf(x+t, 0) {
		return f
	}
	d := loadDecay
	f.n = d*f.n + 1
	f.x = d*f.x + x
	f.t = d*f.t + t
	f.xx = d*f.xx + x*x
	f.xt = d*f.xt + x*t
	return f
}

// growth is the share of the time per token at the mean load that the load
// adds, within [0, 1], and whether it is known.
func (f loadFit) growth() (float64, bool) {
	if f.n < loadMinSamples {
		return 0, false
	}
	mx, mt := f.x/f.n, f.t/f.n
	vx := f.xx/f.n - mx*mx
	if vx < loadMinSpread || !(mt > 0) {
		return 0, false
	}
	slope := (f.xt/f.n - mx*mt) / vx
	return min(max(slope*mx/mt, 0), 1), true
}

// packed is the growth as the pool's sum holds it (speedLearner.shift):
// 1 + growth·10⁴, 0 unknown.
func (f loadFit) packed() uint64 {
	g, ok := f.growth()
	if !ok {
		return 0
	}
	return 1 + uint64(math.Round(g*1e4))
}

// poolGrowth is the mean growth of a pool sum of packed growths, and
// whether any is known.
func poolGrowth(v uint64) (float64, bool) {
	m := poolMean(v)
	if m == 0 {
		return 0, false
	}
	return (m - 1) / 1e4, true
}

// horizonFor is CacheAware's placement horizon for a pool sum of growths:
// speedHorizon while no growth is known or the mean one is at least
// growthHigh, up to horizonMax where it is at most growthLow, linear
// between.
func horizonFor(v uint64) float64 {
	g, ok := poolGrowth(v)
	if !ok || g >= growthHigh {
		return speedHorizon
	}
	if g <= growthLow {
		return horizonMax
	}
	return horizonMax + (speedHorizon-horizonMax)*(g-growthLow)/(growthHigh-growthLow)
}

const (
	horizonMax = 7500
	growthLow  = 0.1
	growthHigh = 0.3
)

package gateway

import "math"

// How a replica's steps grow with its load, learned from what the front
// observes: each streamed answer's time per output token after its first
// (DoneInfo: Elapsed − TTFT over OutputTokens − 1) against the requests
// outstanding at the replica while it decoded, taken as the mean of the
// count when it was routed (Candidate.Outstanding, itself included) and
// when it finished. The line's slope times the mean load, over the mean
// time per token, is the share of a step that the load adds (growth): the
// decode batch, and the prefills that more traffic interleaves with it.
// On the default workload of docs/results.md's mixed pools it is about
// 0.05 on 8b-h100-blis (a sequence adds 6 µs to a step of 5.75 ms) and
// 0.5 on 8b-h100 (0.15 ms per sequence, its KV cache read each step);
// 0.8–0.9 on the trace on 8b-h100. CacheAware's placement horizon
// (speedHorizon) grows where the pool's steps hardly grow with load
// (horizonFor): there a hot prefix gains from a fast replica without
// slowing the requests already on it. A front that sees no first token
// teaches no growth, and the horizon stays speedHorizon.

const (
	// loadDecay is the weight a sample keeps per later sample: the fit
	// remembers about 500 answers (the growth is the hardware's, slow to
	// change, and one replica's is noisy: with speedDecay's 100 and the
	// load at routing alone, the pool's mean on 8b-h100's default
	// workload ranged 0.04–0.2, overlapping blis's).
	loadDecay = 0.998
	// loadMinSamples is the decayed count of decode samples before a
	// replica's growth is published (about 250 answers): the first are
	// taken while the load ramps up, and at 100 the pool's mean on
	// 8b-h100's default workload started at 0.05–0.3 before settling
	// near 0.5.
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

// packed is the growth as the pool's sum holds it (shiftSum), 0 unknown.
func (f loadFit) packed() uint64 {
	g, ok := f.growth()
	if !ok {
		return 0
	}
	return packGrowth(g)
}

// packGrowth is a known growth g as the pool's sum holds it: 1 + g·10⁴
// (poolGrowth reads it back).
func packGrowth(g float64) uint64 { return 1 + uint64(math.Round(g*1e4)) }

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
	// horizonMax is the longest placement horizon, 3·speedHorizon. On
	// 8b-h100-blis's default workload at 1,0.5 and 1,0.7,0.4 (growth
	// about 0.05) it takes mean TTFT from 10–11% below speed-blind to
	// 15–17%; uniformly, 10,000 cost the trace at 16 replicas a point
	// and 40,000 sent the fast replicas more than they could take (mean
	// TTFT 3–7× speed-blind's; docs/results.md, Mixed pools).
	horizonMax = 3 * speedHorizon
	// growthLow and growthHigh bound the ramp from horizonMax down to
	// speedHorizon: 8b-h100's pools grow by about 0.5 (the default
	// workload) to 0.9 (the trace), 8b-h100-blis's by 0.05.
	growthLow  = 0.1
	growthHigh = 0.3
)

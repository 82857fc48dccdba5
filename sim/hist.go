package sim

import "math"

// hist is a log-bucketed histogram of durations in seconds with 1% relative
// precision from 1 µs up, so quantiles and CDFs need memory independent of
// the number of samples. Mean and max are exact.
type hist struct {
	counts []uint64
	n      uint64
	sum    float64
	max    float64
}

const (
	histMin    = 1e-6
	histGrowth = 1.01
	histBins   = 3000 // up to 1e-6·1.01^3000 ≈ 9.6e6 s
)

var histLogG = math.Log(histGrowth)

func (h *hist) add(x float64) {
	if h.counts == nil {
		h.counts = make([]uint64, histBins)
	}
	h.n++
	h.sum += x
	h.max = max(h.max, x)
	h.counts[binOf(x)]++
}

func binOf(x float64) int {
	if x <= histMin {
		return 0
	}
	return min(int(math.Log(x/histMin)/histLogG)+1, histBins-1)
}

// upper returns the upper edge of bin i.
func upper(i int) float64 { return histMin * math.Pow(histGrowth, float64(i)) }

func (h *hist) mean() float64 {
	if h.n == 0 {
		return 0
	}
	return h.sum / float64(h.n)
}

// quantile returns the q-quantile (0..1), accurate to 1%, never above max.
func (h *hist) quantile(q float64) float64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = max(rank, 1)
	var c uint64
	for i, k := range h.counts {
		c += k
		if c >= rank {
			if i == 0 {
				return min(histMin, h.max)
			}
			mid := math.Sqrt(upper(i-1) * upper(i))
			return min(mid, h.max)
		}
	}
	return h.max
}

// cdf returns up to points (x, F(x)) pairs describing the distribution.
func (h *hist) cdf() [][2]float64 {
	var out [][2]float64
	if h.n == 0 {
		return out
	}
	var c uint64
	for i, k := range h.counts {
		if k == 0 {
			continue
		}
		c += k
		out = append(out, [2]float64{min(upper(i), h.max), float64(c) / float64(h.n)})
	}
	return out
}

package gateway

import (
	"fmt"
	"math"
)

// LoadWeights weighs the signals LoadAware mixes. Each signal is
// normalised to 0..1 before weighing: queue depth and latency by their
// largest value among the candidates, KV utilisation as it is. The zero
// value stands for the defaults given on each field; otherwise a zero
// weight switches its signal off.
type LoadWeights struct {
	// Queue weighs queue depth, counted two ways and summed: outstanding
	// requests (Candidate.Outstanding), and prefill work queued
	// (Candidate.PendingPrefill), which tells a replica about to start
	// many prompts from one busy decoding. Default 1: outstanding work is
	// the best predictor of waiting time.
	Queue float64
	// KV weighs KV-cache utilisation. Default 0.5: KV pressure predicts
	// preemption.
	KV float64
	// Latency weighs the smoothed latency. Default 0.25: the slowest-moving
	// signal, it weighs least.
	Latency float64
}

// defaultLoadWeights are the weights a zero LoadWeights stands for.
var defaultLoadWeights = LoadWeights{Queue: 1, KV: 0.5, Latency: 0.25}

// DefaultLoadWeights returns the weights a zero LoadWeights stands for:
// queue 1, KV utilisation 0.5, latency 0.25.
func DefaultLoadWeights() LoadWeights { return defaultLoadWeights }

func (w LoadWeights) validate() error {
	for _, f := range []struct {
		name string
		v    float64
	}{{"Queue", w.Queue}, {"KV", w.KV}, {"Latency", w.Latency}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 {
			return fmt.Errorf("%w: load weight %s %v, want a finite value >= 0", ErrInvalid, f.name, f.v)
		}
	}
	return nil
}

// LoadAware picks the least loaded replica by a weighted, normalised mix
// of queue depth (outstanding requests and queued prefill), KV-cache
// utilisation and latency. Ties go to the replica sent the least prefill
// work so far (AssignedPrefill), then to fewer in-flight requests, then to
// one drawn from Request.Tie among those still equal (deterministic for a
// given sequence of calls). Its decisions are of kind load_aware. The zero
// value uses the default weights and is safe for concurrent use.
type LoadAware struct {
	// Weights of the signals; the zero value means the defaults.
	Weights LoadWeights
}

var _ Policy = (*LoadAware)(nil)

// Pick returns the least loaded candidate. Given no candidates (which a
// Gateway never does) it returns -1, which Route rejects with an error
// wrapping ErrInvalid.
func (p *LoadAware) Pick(req *Request, cands []Candidate) int {
	if len(cands) == 0 {
		return -1
	}
	return leastLoaded(cands, p.Weights, req.Tie)
}

// lessLoadedTie breaks a load-score tie: less prefill work sent so far,
// then fewer in flight; when both are equal, one drawn from Request.Tie
// (see leastLoaded), so that idle replicas share the work instead of the
// first taking it all.
func lessLoadedTie(a, b *Candidate) bool {
	if a.AssignedPrefill != b.AssignedPrefill {
		return a.AssignedPrefill < b.AssignedPrefill
	}
	return a.InFlight < b.InFlight
}

// leastLoaded returns the index of the candidate with the lowest load
// score; of candidates tied in every respect, one drawn from tie.
func leastLoaded(cands []Candidate, w LoadWeights, tie uint64) int {
	if w == (LoadWeights{}) {
		w = defaultLoadWeights
	}
	qmax, pmax, lmax := 0, 0, int64(0)
	for i := range cands {
		qmax = max(qmax, cands[i].Outstanding())
		pmax = max(pmax, cands[i].PendingPrefill)
		lmax = max(lmax, int64(cands[i].Load.Latency))
	}
	best, bestScore, ties := 0, math.Inf(1), 0
	for i := range cands {
		c := &cands[i]
		s := w.KV * c.Load.KVUtilization
		if qmax > 0 {
			s += w.Queue * float64(c.Outstanding()) / float64(qmax)
		}
		if pmax > 0 {
			s += w.Queue * float64(c.PendingPrefill) / float64(pmax)
		}
		if lmax > 0 {
			s += w.Latency * float64(c.Load.Latency) / float64(lmax)
		}
		switch {
		case s < bestScore:
			best, bestScore, ties = i, s, 1
		case s > bestScore:
		case lessLoadedTie(c, &cands[best]):
			best, ties = i, 1
		case !lessLoadedTie(&cands[best], c):
			ties++
			if drawTie(tie, ties) {
				best = i
			}
		}
	}
	return best
}

package gateway

import (
	"fmt"
	"math"
)

// LoadWeights weighs the signals LoadAware mixes. Each signal is
// normalised to 0..1 before weighing: queue depth and latency by their
// largest value among the candidates, KV utilisation as it is.
// The zero value is not valid; DefaultLoadWeights are the defaults.
type LoadWeights struct {
	// Queue weighs queue depth, counted two ways and summed: outstanding
	// requests (Candidate.Outstanding), and prefill work queued
	// (Candidate.PendingPrefill), which tells a replica about to start
	// many prompts from one busy decoding.
	Queue float64
	// KV weighs KV-cache utilisation.
	KV float64
	// Latency weighs the smoothed latency.
	Latency float64
}

// DefaultLoadWeights are the weights LoadAware uses unless told otherwise:
// queue 1, KV utilisation 0.5, latency 0.25. Outstanding work is the best
// predictor of waiting time; KV pressure predicts preemption; latency is
// the slowest-moving signal, so it weighs least.
var DefaultLoadWeights = LoadWeights{Queue: 1, KV: 0.5, Latency: 0.25}

func (w LoadWeights) validate() error {
	for _, f := range []struct {
		name string
		v    float64
	}{{"Queue", w.Queue}, {"KV", w.KV}, {"Latency", w.Latency}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 {
			return fmt.Errorf("%w: load weight %s %v, want a finite value >= 0", ErrInvalidOption, f.name, f.v)
		}
	}
	if w.Queue+w.KV+w.Latency == 0 {
		return fmt.Errorf("%w: load weights are all zero", ErrInvalidOption)
	}
	return nil
}

// LoadAware picks the least loaded replica by a weighted, normalised mix
// of queue depth (outstanding requests and queued prefill), KV-cache
// utilisation and latency. Ties go
// to the replica sent the least prefill work so far (AssignedPrefill),
// then to fewer in-flight requests, then to the earlier candidate.
// The zero value uses DefaultLoadWeights. Safe for concurrent use.
type LoadAware struct {
	// Weights of the signals; the zero value means DefaultLoadWeights.
	Weights LoadWeights
}

var _ Policy = (*LoadAware)(nil)

// Pick returns the least loaded candidate.
func (p *LoadAware) Pick(_ *Request, cands []Candidate) Choice {
	return Choice{Index: leastLoaded(cands, p.Weights), Kind: KindLoadAware}
}

// lessLoadedTie breaks a load-score tie: less prefill work sent so far,
// then fewer in flight; the earlier candidate only when both are equal, so
// that idle replicas share the work instead of the first taking it all.
func lessLoadedTie(a, b *Candidate) bool {
	if a.AssignedPrefill != b.AssignedPrefill {
		return a.AssignedPrefill < b.AssignedPrefill
	}
	return a.InFlight < b.InFlight
}

// leastLoaded returns the index of the candidate with the lowest load score.
func leastLoaded(cands []Candidate, w LoadWeights) int {
	if w == (LoadWeights{}) {
		w = DefaultLoadWeights
	}
	qmax, pmax, lmax := 0, 0, int64(0)
	for i := range cands {
		qmax = max(qmax, cands[i].Outstanding())
		pmax = max(pmax, cands[i].PendingPrefill)
		lmax = max(lmax, int64(cands[i].Load.Latency))
	}
	best, bestScore := 0, math.Inf(1)
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
		if s < bestScore || (s == bestScore && lessLoadedTie(c, &cands[best])) {
			best, bestScore = i, s
		}
	}
	return best
}

package gateway

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// A replica's speed is learned online from what the front observes of the
// requests routed there (DoneInfo): the time to first token of a streamed
// answer, the time from there to its end, or, for an answer whose first
// token the front does not see, only its end. Each is a sample of
//
//	y ≈ a·w + b·o
//
// where w is the prefill work the request found ahead of its first token
// (blocks pending there when routed, its own uncached blocks, and one for
// the step that yields the token), o the tokens it decoded after the
// first, a the replica's time per block of prefill and b its time per
// output token (TPOT). A streamed answer gives two samples, (w, 0) and
// (0, o); an answer seen only at its end gives one, (w, o), and the fit
// separates a from b over requests of different shapes.
//
// The fit is exponentially weighted least squares of relative errors
// (each sample weighs one over its predicted length squared); each
// sample's weight
// decays by speedDecay per later sample, so the fit follows a replica
// whose speed drifts or steps, and its state is twelve numbers whatever
// the traffic (speedFit: five sums, three decayed counts, the fit, and
// how far off it was from the first tokens, speedMaxResidual). A sample beyond speedClip times the fit's prediction (or
// below its inverse) counts as that bound, so one stalled request moves
// the fit by a bounded step. Until speedMinSamples samples have weight,
// the replica's speed is unknown, and the router prices it as it would
// with no speed learned.

const (
	// speedDecay is the weight a sample keeps per later sample: the fit
	// remembers about 1/(1−0.99) = 100 samples. With 20 (0.95) the fits of
	// equal replicas on the Mooncake trace spread by ±45% and routing by
	// them cost 3–10% of mean TTFT (docs/results.md).
	speedDecay = 0.99
	// speedClip bounds a sample to [prediction/2, prediction·2] once the
	// fit is in use.
	speedClip = 2.0
	// speedMinSamples is the sample weight before the fit is published.
	speedMinSamples = 4
	// speedMinTTFT is the decayed count of first-token samples the time
	// per block needs to be published (see packed): 36 first tokens seen,
	// so that a fit on a few samples does not steer routing.
	speedMinTTFT = 30
	// speedDeadband: CacheAware prices a replica at its own speed only
	// when it differs from the mean (CacheAware's ref) by more than this factor
	// (see slowness), so that noise in the fits of equal replicas does not
	// break the exact ties the tie order settles.
	speedDeadband = 1.3
	// speedMaxResidual: the time per block is published only while it
	// explains the first tokens it is fitted to, the root mean square of
	// their log residuals (how many times off the fit was, before each
	// one) at most 1.25, a typical factor of 3.5. On engines whose first
	// token is not prefill work ahead of it (llm-d-inference-sim prefills
	// each request apart, behind a fixed cost) the fit is 4.4-8.0 times
	// off (1.48-2.08 after 30 first tokens, e2e's TestGIESideBySide), and
	// pricing it moved hot prefixes off their holders; in the simulator
	// it is 0.28-1.08 (docs/results.md, "Pools equal in decode").
	speedMaxResidual = 1.25
	// speedResidualClip bounds one first token's log residual to a factor
	// of 10, so that a few stalled requests do not hide a speed.
	speedResidualClip = math.Ln10
)

// speedFit is the state of one replica's fit. Its methods are pure: add
// returns a new state.
type speedFit struct {
	ww, wo, oo, wy, oy float64 // decayed sums of w², w·o, o², w·y, o·y
	n                  float64 // decayed sample weight
	nt                 float64 // decayed count of prefill-only samples (first tokens seen)
	nd                 float64 // decayed count of decode-only samples
	a, b               float64 // the fit: seconds per block, per token; 0 unknown
	// rr is the decayed sum of the squared log residuals of first tokens
	// (see speedMaxResidual), nr their decayed count.
	rr, nr float64
}

// add returns f with the sample y seconds for w blocks of prefill work and
// o decoded tokens. A sample that cannot be one (negative, not finite,
// both w and o zero, y not positive) leaves f as it is.
func (f speedFit) add(w, o, y float64) speedFit {
	if !(w >= 0 && o >= 0 && y > 0) || w+o == 0 || math.IsInf(w+o+y, 0) {
		return f
	}
	scale := y
	// The fit's prediction weighs and bounds a sample once the fit is in
	// use, and a sample of one part alone (a first token, or the decode
	// after it) once that part has had a sample of its own: a part that
	// answers seen only at their end put near 0 would otherwise bound its
	// first own sample to twice that and weigh it as if exact, and the
	// fit take hundreds of samples to recover (TestSpeedFitConverges).
	trusted := f.n >= speedMinSamples
	switch {
	case o == 0:
		trusted = trusted && f.nt > 0
	case w == 0:
		trusted = trusted && f.nd > 0
	}
	if trusted && o == 0 && f.a > 0 {
		// How far the fit was from this first token, before it learns
		// from it: a factor, its log bounded to speedResidualClip.
		l := min(math.Abs(math.Log(y/(f.a*w))), speedResidualClip)
		f.rr = speedDecay*f.rr + l*l
		f.nr = speedDecay*f.nr + 1
	}
	if trusted {
		if p := f.a*w + f.b*o; p > 0 {
			y = min(max(y, p/speedClip), p*speedClip)
			scale = p
		}
	}
	// Each sample weighs 1/scale², scale its predicted length (its own
	// until the fit is in use): the fit minimises relative errors, as a
	// request's noise grows with its length, and a long answer seen only
	// at its end must not drown the short samples that tell its parts.
	// Weighing by the prediction rather than the sample gives a replica
	// that slowed the same weight per sample as before.
	d, k := speedDecay, 1/(scale*scale)
	f.ww = d*f.ww + k*w*w
	f.wo = d*f.wo + k*w*o
	f.oo = d*f.oo + k*o*o
	f.wy = d*f.wy + k*w*y
	f.oy = d*f.oy + k*o*y
	f.n = d*f.n + 1
	switch {
	case o == 0:
		f.nt = d*f.nt + 1
	case w == 0:
		f.nd = d*f.nd + 1
	}
	f.a, f.b = f.solve()
	return f
}

// solve returns the least-squares a and b, neither negative; 0 where the
// samples do not determine it.
func (f speedFit) solve() (a, b float64) {
	det := f.ww*f.oo - f.wo*f.wo
	switch {
	case f.ww > 0 && f.oo > 0 && det > 1e-9*f.ww*f.oo:
		a = (f.wy*f.oo - f.oy*f.wo) / det
		b = (f.oy*f.ww - f.wy*f.wo) / det
	case f.oo == 0 && f.ww > 0: // prefill samples only
		return f.wy / f.ww, 0
	case f.ww == 0 && f.oo > 0: // decode samples only
		return 0, f.oy / f.oo
	default: // samples all of one shape w:o, which cannot be split
		return f.a, f.b
	}
	switch {
	case a < 0:
		return 0, max(f.oy/f.oo, 0)
	case b < 0:
		return max(f.wy/f.ww, 0), 0
	}
	return a, b
}

// packed returns the fit as replicaState.speed holds it: the time per block
// (high 32 bits) and per token (low 32 bits) in nanoseconds, each at least
// 1 when known and at most 2³²−1 (4.3 s); 0 before speedMinSamples. The
// time per block is published only once first tokens were seen (a
// decayed count of speedMinTTFT): answers seen only at their end are
// mostly decode, and the prefill they imply is too uncertain to
// route by (on the Mooncake trace, 4 replicas, no client streaming, its
// predicted TTFT was 0.49–6.0× the true one from the 10th to the 90th
// percentile; docs/results.md), and only while it explains the first
// tokens (speedMaxResidual).
func (f speedFit) packed() uint64 {
	if f.n < speedMinSamples {
		return 0
	}
	a := f.a
	if f.nt < speedMinTTFT || f.rr > speedMaxResidual*speedMaxResidual*f.nr {
		a = 0
	}
	return uint64(nanos32(a))<<32 | uint64(nanos32(f.b))
}

// unpack splits a published speed word (packed) into the time per block
// and per output token.
func unpack(sp uint64) (block, token time.Duration) {
	return time.Duration(sp >> 32), time.Duration(uint32(sp))
}

// nanos32 is s seconds in nanoseconds within 1..2³²−1, or 0 for 0.
func nanos32(s float64) uint32 {
	if !(s > 0) {
		return 0
	}
	return uint32(min(max(math.Round(s*1e9), 1), math.MaxUint32))
}

// speedLearner is a replica's fit behind a lock: samples come from the
// goroutines that report requests' ends, and the router reads only the
// published word (replicaState.speed).
type speedLearner struct {
	mu   sync.Mutex
	fit  speedFit
	load loadFit
	// pool is the gateway's sum of its replicas' times per block
	// (poolMean), and growths the sum of their growths (speedload.go),
	// kept current as this one's change; nil once the replica is removed.
	pool, growths *atomic.Uint64
}

// The pool's sum: the known times per block in nanoseconds, summed in the
// high 48 bits (each is below 2³², and a gateway has at most MaxReplicas
// = 2¹² replicas), and how many are known in the low 16.

// poolMean is the mean time per block of a pool sum, 0 if none is known.
func poolMean(v uint64) float64 {
	if n := v & 0xffff; n > 0 {
		return float64(v>>16) / float64(n)
	}
	return 0
}

// shiftSum moves a pool sum (see poolMean) from one of its replicas' old
// value to its new one (0 unknown); nil is no sum.
func shiftSum(pool *atomic.Uint64, old, nu uint64) {
	if pool == nil || old == nu {
		return
	}
	for {
		v := pool.Load()
		sum, n := v>>16, v&0xffff
		if old > 0 {
			sum, n = sum-old, n-1
		}
		if nu > 0 {
			sum, n = sum+nu, n+1
		}
		if pool.CompareAndSwap(v, sum<<16|n) {
			return
		}
	}
}

// forget drops the fit and publishes the speed as unknown (speed is the
// replica's published word).
func (l *speedLearner) forget(speed *atomic.Uint64) {
	l.mu.Lock()
	l.withdraw()
	l.fit, l.load = speedFit{}, loadFit{}
	speed.Store(0)
	l.mu.Unlock()
}

// leave takes the replica's time out of the pool's sum for good: it is
// being removed.
func (l *speedLearner) leave() {
	l.mu.Lock()
	l.withdraw()
	l.pool, l.growths = nil, nil
	l.mu.Unlock()
}

// withdraw takes the replica's time per block (nanoseconds) and growth
// out of the pool's sums. Under l.mu.
func (l *speedLearner) withdraw() {
	shiftSum(l.pool, l.fit.packed()>>32, 0)
	shiftSum(l.growths, l.load.packed(), 0)
}

// learn folds a finished request's observations into rs's fit and
// publishes it. work is the request's prefill work in blocks (see above;
// 0 when its prefill ran on another replica: then only the time between
// first token and end teaches anything), load the requests outstanding at the replica when it was routed, itself
// included (speedload.go).
func (rs *replicaState) learn(work, load int, info *DoneInfo) {
	if info.Err != nil {
		return
	}
	w, o := float64(work), float64(max(info.OutputTokens, 1)-1) // not OutputTokens-1: math.MinInt would wrap
	l := rs.learner
	l.mu.Lock()
	f := l.fit
	switch {
	case info.TTFT > 0:
		if work > 0 { // 0: prefill ran elsewhere (Decision.handOff)
			f = f.add(w, 0, info.TTFT.Seconds())
		}
		if info.Elapsed > info.TTFT && o > 0 {
			y := (info.Elapsed - info.TTFT).Seconds()
			f = f.add(0, o, y)
			lf := l.load.add(float64(load+rs.outstanding()+1)/2, y/o)
			shiftSum(l.growths, l.load.packed(), lf.packed())
			l.load = lf
		}
	case info.Elapsed > 0 && info.OutputTokens > 0 && work > 0:
		f = f.add(w, o, info.Elapsed.Seconds())
	}
	old := l.fit.packed()
	l.fit = f
	nu := f.packed()
	shiftSum(l.pool, old>>32, nu>>32)
	rs.speed.Store(nu)
	l.mu.Unlock()
}

// work is the prefill work, in blocks, ahead of a first token at c for a
// request of n blocks: the prefill pending there (this gateway's and its
// peers'), the request's own uncached blocks, and one for the step that
// yields the token.
func (c *Candidate) work(n int) int {
	return c.PendingPrefill + c.Load.PeerPrefill + max(n-c.Matched, 0) + 1
}

// speedRef is the candidates' reference time per block, for CacheAware's
// prices: the mean of the known ones, 0 if none is known.
type speedRef struct {
	sum float64
	n   int
}

func (s *speedRef) add(c *Candidate) {
	if c.BlockTime > 0 {
		s.sum += float64(c.BlockTime)
		s.n++
	}
}

// mean is the reference time per block in nanoseconds, 0 if none known.
func (s *speedRef) mean() float64 {
	if s.n == 0 {
		return 0
	}
	return s.sum / float64(s.n)
}

// slowness is how many times slower than the reference ref (nanoseconds
// per block, 0 unknown) c is: 1 when either is unknown or within
// speedDeadband of the other.
func slowness(c *Candidate, ref float64) float64 {
	a := float64(c.BlockTime)
	if a == 0 || ref == 0 {
		return 1
	}
	f := a / ref
	if f < speedDeadband && f > 1/speedDeadband {
		return 1
	}
	return f
}

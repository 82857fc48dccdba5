package reference

import (
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/examlops/gateway"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// descaled returns a fitted model's coefficients and intercept in the
// features' own units, as the training server reports them.
func descaled(m *bayesRidge) (brVec, float64) {
	var w brVec
	b := m.intercept
	for j := 0; j < m.p; j++ {
		w[j] = m.coef[j] / m.scale[j]
		b -= w[j] * m.mean[j]
	}
	return w, b
}

func TestBayesRidgeRecoversCoefficients(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	type row struct {
		x brVec
		y float64
	}
	var rows []row
	for range 2000 {
		x := brVec{rng.Float64(), rng.Float64() * 100, float64(rng.IntN(11)), 3} // the last is constant
		y := 5 + 20*x[0] + 0.3*x[1] - 2*x[2] + rng.NormFloat64()*0.1
		rows = append(rows, row{x, y})
	}
	m, ok := fitBayesRidge(4, func(yield func(*brVec, float64)) {
		for i := range rows {
			yield(&rows[i].x, rows[i].y)
		}
	})
	require.True(t, ok)
	w, b := descaled(&m)
	assert.InDelta(t, 20, w[0], 0.05)
	assert.InDelta(t, 0.3, w[1], 0.001)
	assert.InDelta(t, -2, w[2], 0.005)
	assert.Zero(t, m.coef[3], "a constant feature changes nothing")
	assert.InDelta(t, 5, b+w[3]*3, 0.05)
	// The fitted noise precision is 1/σ² of the noise (σ = 0.1).
	assert.InDelta(t, 100, m.alpha, 15)
	x := brVec{0.5, 50, 4, 3}
	assert.InDelta(t, 5+10+15-8, m.predict(&x), 0.05)
}

func TestBayesRidgeDegenerate(t *testing.T) {
	_, ok := fitBayesRidge(3, func(func(*brVec, float64)) {})
	assert.False(t, ok, "no rows, no model")
	// One sample: every feature is constant, the model predicts its
	// target, as the predictor's default model (one sample of 10 ms).
	one := brVec{0.2, 100, 1}
	m, ok := fitBayesRidge(3, func(yield func(*brVec, float64)) { yield(&one, 10) })
	require.True(t, ok)
	x := brVec{0.9, 5000, 7}
	assert.Equal(t, 10.0, m.predict(&x))
	// Two collinear features: finite coefficients, a fit that predicts.
	m, ok = fitBayesRidge(2, func(yield func(*brVec, float64)) {
		for i := range 50 {
			x := brVec{float64(i), 2 * float64(i)}
			yield(&x, 1+float64(i))
		}
	})
	require.True(t, ok)
	x = brVec{10, 20}
	assert.InDelta(t, 11, m.predict(&x), 0.01)
	assert.False(t, math.IsNaN(m.coef[0]) || math.IsNaN(m.coef[1]))
}

// llmdRig drives an LLMDPredicted as the simulator does: two replicas,
// "fast" and "slow", whose scraped loads differ (the slow one has more
// running requests) and whose requests take 20 ms plus 30 ms per running
// request, on a manual clock.
type llmdRig struct {
	t   *testing.T
	p   *LLMDPredicted
	now time.Time
	id  uint64
}

func newLLMDRig(t *testing.T, seed uint64, streaming bool) *llmdRig {
	r := &llmdRig{t: t, p: NewLLMDPredicted(seed, streaming), now: time.Unix(1000, 0)}
	r.p.SetClock(func() time.Time { return r.now })
	// One long request on each replica, never done, so that neither is
	// idle and the scorer compares predictions.
	for _, name := range []string{"fast", "slow"} {
		r.route(name)
	}
	return r
}

var llmdCands = []gateway.Candidate{
	{Name: "fast", CacheBlocks: 1000, Load: gateway.Load{Running: 1, KVUtilization: 0.1}},
	{Name: "slow", CacheBlocks: 1000, Load: gateway.Load{Running: 8, KVUtilization: 0.3}},
}

// route places one request, forcing it to replica force when not "".
func (r *llmdRig) route(force string) (string, uint64) {
	return r.routeSLO(force, 0, 0)
}

func (r *llmdRig) routeSLO(force string, ttft, tpot time.Duration) (string, uint64) {
	r.id++
	r.p.Arrive(Arrival{ID: r.id, Time: r.now, Tokens: 512, BlockTokens: 16})
	i := r.p.Pick(&gateway.Request{Key: keyFrom(r.id, 32), TTFT: ttft, TPOT: tpot}, llmdCands)
	name := llmdCands[i].Name
	if force != "" {
		name = force
	}
	r.p.Routed(r.id, name)
	return name, r.id
}

// serve routes a request and completes it after its replica's latency:
// its first token after 20 ms + 30 ms per running request, then ten more
// tokens at 2 ms each on the fast replica, 5 ms on the slow one.
func (r *llmdRig) serve() string { return r.serveSLO(0, 0) }

func (r *llmdRig) serveSLO(ttft, tpot time.Duration) string {
	name, id := r.routeSLO("", ttft, tpot)
	c, itl := llmdCands[0], 2
	if name == "slow" {
		c, itl = llmdCands[1], 5
	}
	r.now = r.now.Add(time.Duration(20+30*c.Load.Running) * time.Millisecond)
	r.p.FirstToken(id)
	r.now = r.now.Add(time.Duration(10*itl) * time.Millisecond)
	r.p.Done(id, gateway.DoneInfo{OutputTokens: 11})
	return name
}

// train runs 30 s of traffic and lets the predictor retrain and reload.
func (r *llmdRig) train() {
	for range 200 {
		r.serve()
	}
	r.now = r.now.Add(16 * time.Second)
}

func TestLLMDPredictedPrefersFasterReplicaAfterTraining(t *testing.T) {
	for _, streaming := range []bool{false, true} {
		r := newLLMDRig(t, 1, streaming)
		fast := 0
		for range 400 { // untrained (no time passes): the default model ties them
			name, id := r.route("")
			r.p.Done(id, gateway.DoneInfo{})
			if name == "fast" {
				fast++
			}
		}
		assert.InDelta(t, 200, fast, 40, "streaming %v: before training, a fair draw", streaming)
		assert.Equal(t, r.p.preds[0].ttft, r.p.preds[1].ttft)
		r.train()
		fast = 0
		for range 200 {
			if r.serve() == "fast" {
				fast++
			}
		}
		assert.Greater(t, fast, 190, "streaming %v: after training, the replica predicted faster", streaming)
		assert.Greater(t, r.p.preds[1].ttft-r.p.preds[0].ttft, 150.0, "the model learned the slow replica's latency")
	}
}

func TestLLMDPredictedObjectives(t *testing.T) {
	r := newLLMDRig(t, 5, true)
	r.train()
	assert.Positive(t, r.p.trainer.tpotData.n, "streaming: TPOT learned from the answers' token counts")
	assert.Greater(t, r.p.preds[1].tpot-r.p.preds[0].tpot, 1.5, "the slow replica's TPOT is predicted higher")
	count := func(ttft, tpot time.Duration) (fast int) {
		for range 200 {
			if r.serveSLO(ttft, tpot) == "fast" {
				fast++
			}
		}
		return fast
	}
	// Only the fast replica meets 150 ms: the positive tier (1% of the
	// time the other, 1% an affinity skip that changes nothing here).
	assert.Greater(t, count(150*time.Millisecond, 0), 190)
	// Both meet 2 s and 100 ms: "least" headroom packs the one nearer its
	// objectives, the slow replica.
	assert.Less(t, count(2*time.Second, 100*time.Millisecond), 10)
	// Neither meets 10 ms (nor the TPOT of 0 that no header means): the
	// least deficit, the fast replica.
	assert.Greater(t, count(10*time.Millisecond, 0), 190)
	// TTFT met by both, TPOT by neither (no header): the TPOT-only deficit
	// bucket, scored 0.8 on the TTFT headroom nearest 2 s (the slow
	// replica) and 0.2 on the TPOT deficit (the fast): a draw of about 1
	// in 5 for the fast replica.
	assert.InDelta(t, 40, count(2*time.Second, 0), 25)
	// A TPOT objective only the fast replica meets (3 ms), TTFT met by
	// both: the slow replica's deficit sends the request to the fast one.
	assert.Greater(t, count(2*time.Second, 3*time.Millisecond), 190)
	for _, pr := range r.p.preds {
		assert.False(t, math.IsNaN(pr.ttft) || math.IsNaN(pr.tpot))
	}
}

func TestLLMDPredictedDeterministic(t *testing.T) {
	run := func(seed uint64) []string {
		r := newLLMDRig(t, seed, true)
		var got []string
		for i := range 600 {
			if i == 300 {
				r.now = r.now.Add(16 * time.Second)
			}
			got = append(got, r.serve())
		}
		return got
	}
	assert.Equal(t, run(3), run(3))
	assert.NotEqual(t, run(3), run(4), "the seed drives the draws")
}

func TestLLMDPredictedZeroData(t *testing.T) {
	p := NewLLMDPredicted(0, false) // no clock: time.Now
	// No Arrive, empty loads, one candidate, unknown ids: no panic.
	one := []gateway.Candidate{{Name: "a"}}
	assert.Equal(t, 0, p.Pick(&gateway.Request{Key: keyFrom(1, 1)}, one))
	p.FirstToken(99)
	p.Done(99, gateway.DoneInfo{})
	p.Routed(5, "b") // not the last pick's replica
	p.Done(5, gateway.DoneInfo{Err: assert.AnError})
	i := p.Pick(&gateway.Request{Key: keyFrom(2, 3)}, llmdCands)
	assert.Contains(t, []int{0, 1}, i)
	assert.Zero(t, p.Predicted())
	// A zero-value policy works as well.
	var z LLMDPredicted
	z.Arrive(Arrival{})
	assert.Contains(t, []int{0, 1}, z.Pick(&gateway.Request{Key: keyFrom(3, 2)}, llmdCands))
}

func TestLLMDTrainingMemoryBounded(t *testing.T) {
	tr := newLLMDTrainer(1)
	rng := rand.New(rand.NewPCG(2, 2))
	for range 400_000 {
		s := llmdSample{kv: float32(rng.Float64()), prefix: float32(rng.Float64()), wait: float32(rng.IntN(20)),
			in: 100, y: float32(1 + rng.Float64())}
		tr.add(s, false)
	}
	for i := range tr.ttftData.b {
		assert.LessOrEqual(t, len(tr.ttftData.b[i].buf), llmdBucketSize)
	}
	assert.Equal(t, tr.ttftData.count(regimeAll), tr.ttftData.n)
	assert.LessOrEqual(t, tr.ttftData.n, llmdBuckets*llmdBucketSize)
	full := 0
	for i := range tr.ttftData.b {
		if len(tr.ttftData.b[i].buf) == llmdBucketSize {
			full++
		}
	}
	assert.Greater(t, full, llmdBuckets/2, "the busy buckets fill and stay full")
	// What awaits a flush is sampled down to llmdFlushMax.
	p := NewLLMDPredicted(1, false)
	p.init()
	for range 5000 {
		p.record(llmdSample{y: 1}, false)
	}
	assert.Len(t, p.flushBuf, llmdFlushMax)
	// A retrain over full stores completes and switches the ensemble on.
	for range 400_000 {
		s := llmdSample{kv: float32(rng.Float64()), wait: float32(rng.IntN(3)), in: 100, y: float32(1 + rng.Float64())}
		tr.add(s, true)
	}
	tr.retrain()
	assert.True(t, tr.models.ensemble)
}

func TestLLMDScorer(t *testing.T) {
	p := NewLLMDPredicted(1, true)
	p.init()
	keep := []int{0, 1, 2}
	// No SLO: every headroom negative; none idle: the lowest predicted
	// TTFT scores 1.01, the highest 0.01.
	p.preds = []llmdPred{{ttftH: -100, tpotH: -5}, {ttftH: -300, tpotH: -5}, {ttftH: -200, tpotH: -5}}
	p.scoreKept(keep)
	assert.Equal(t, []float64{1.01, 0.01, 0.51}, p.score)
	// One idle candidate: only it is scored.
	p.preds[1].idle = true
	p.scoreKept(keep)
	assert.Equal(t, []float64{0, 0.51, 0}, p.score)
	// Positive headroom present: only those, "least" (nearest the SLO).
	p.preds = []llmdPred{{ttftH: 50, tpotH: 1}, {ttftH: -10, tpotH: 1}, {ttftH: 150, tpotH: 1}}
	p.scoreKept(keep)
	assert.Equal(t, []float64{1.01, 0, 0.01}, p.score)
	// All negative, none idle: the TPOT-only deficit bucket beats TTFT.
	p.preds = []llmdPred{{ttftH: -10, tpotH: 1}, {ttftH: 5, tpotH: -1}, {ttftH: -10, tpotH: -1}}
	p.scoreKept(keep)
	assert.Equal(t, []float64{0, 0.51, 0}, p.score)
	// The tier filter keeps the positive tier (but for 1% exploration).
	p.preds = []llmdPred{{ttftH: 1}, {ttftH: -1}, {ttftH: 2}}
	pos := 0
	for range 1000 {
		if k := p.tier([]int{0, 1, 2}); len(k) == 2 {
			pos++
		}
	}
	assert.InDelta(t, 990, pos, 10)
}

// TestLLMDTrainingHeap measures the heap of two full stores (the figure
// in docs/results.md): go test ./reference -run TestLLMDTrainingHeap -v.
func TestLLMDTrainingHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("fills 400,000 samples")
	}
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	tr := newLLMDTrainer(1)
	rng := rand.New(rand.NewPCG(2, 2))
	for range 2_000_000 {
		s := llmdSample{kv: float32(rng.Float64()), prefix: float32(rng.Float64()), wait: float32(rng.IntN(40)), in: 100, y: 1}
		tr.add(s, false)
		tr.add(s, true)
	}
	runtime.GC()
	runtime.ReadMemStats(&b)
	require.Equal(t, llmdBuckets*llmdBucketSize, tr.ttftData.n)
	heap := float64(b.HeapAlloc) - float64(a.HeapAlloc)
	t.Logf("two full stores (%d samples each, %d bytes a sample): %.1f MB of heap", tr.ttftData.n, unsafe.Sizeof(llmdSample{}), heap/1e6)
	assert.Less(t, heap, 20e6)
	runtime.KeepAlive(tr)
}

// The scheduler profile clamps each scorer's score to 0..1 before
// weighing it (enforceScoreRange, pkg/epp/scheduling/scheduler_profile.go
// at 520af478), so the latency scorer's 1.01 reaches the weighted-random
// picker as 1: it draws exactly as between two scores of 1.
func TestLLMDPickerSeesClampedScores(t *testing.T) {
	a, b := NewLLMDPredicted(3, false), NewLLMDPredicted(3, false)
	a.init()
	b.init()
	keep := []int{0, 1}
	for i := range 10000 {
		a.score, b.score = []float64{1.01, 1}, []float64{1, 1}
		require.Equal(t, b.pickWeighted(keep), a.pickWeighted(keep), "draw %d", i)
	}
}

package reference

import "math/rand/v2"

// llmdSample is one training entry the predicted-latency producer sends
// its predictor: the target replica's state when the request was
// dispatched and the latency it then measured (float32 keeps 200,000 of
// them, a full store, in 5.6 MB).
type llmdSample struct {
	kv, prefix    float32 // KV-cache use 0..1, prefix-cache score 0..1
	in, wait, run float32 // input tokens, waiting and running requests
	tif           float32 // prefill tokens in flight at dispatch
	y             float32 // measured TTFT or TPOT, milliseconds
}

// The latency predictor's data store (training_server.py): one FIFO
// deque of at most llmdBucketSize samples per (queue, KV-cache, prefix)
// bucket, 5 × 20 × 4 of them, for each of the TTFT and TPOT models.
const (
	llmdQueueBuckets  = 5  // waiting 0, 1–2, 3–5, 6–10, 11+
	llmdCacheBuckets  = 20 // KV-cache use in 5% steps
	llmdPrefixBuckets = 4  // prefix score in quarters
	llmdBuckets       = llmdQueueBuckets * llmdCacheBuckets * llmdPrefixBuckets
	// llmdBucketSize is LATENCY_MAX_TRAINING_DATA_SIZE_PER_BUCKET (500,
	// the chart's and the code's default).
	llmdBucketSize = 500
	// llmdMinSamples is the samples a retrain needs: the server starts
	// without a model file, trains a default model and lowers
	// LATENCY_MIN_SAMPLES_FOR_RETRAIN to its _FRESH value, 10.
	llmdMinSamples = 10
	// llmdEnsembleMin is LATENCY_MIN_SAMPLES_FOR_ENSEMBLE_SPLIT: each of
	// the four queue-gated sub-models needs this many samples.
	llmdEnsembleMin = 200
	// llmdTestShare is LATENCY_TEST_TRAIN_RATIO: the share of samples
	// held out of training for the server's own accuracy metrics.
	llmdTestShare = 0.1
	// llmdDefaultMs is what the default models (fit to one sample of
	// 10 ms) predict before the first retrain.
	llmdDefaultMs = 10
)

func queueBucket(w float32) int {
	switch {
	case w <= 0:
		return 0
	case w <= 2:
		return 1
	case w <= 5:
		return 2
	case w <= 10:
		return 3
	}
	return 4
}

func fracBucket(f float32, n int) int {
	f = min(max(f, 0), 1)
	return min(int(f*float32(n)), n-1)
}

func (s *llmdSample) bucket() int {
	return (queueBucket(s.wait)*llmdCacheBuckets+fracBucket(s.kv, llmdCacheBuckets))*llmdPrefixBuckets +
		fracBucket(s.prefix, llmdPrefixBuckets)
}

// ring is one bucket's deque: the newest llmdBucketSize samples.
type ring struct {
	buf  []llmdSample
	next int
}

func (r *ring) push(s llmdSample) {
	if len(r.buf) < llmdBucketSize {
		r.buf = append(r.buf, s)
		return
	}
	r.buf[r.next] = s
	r.next = (r.next + 1) % llmdBucketSize
}

// llmdStore is the training server's samples for one model.
type llmdStore struct {
	b [llmdBuckets]ring
	n int
}

func (st *llmdStore) add(s llmdSample) {
	r := &st.b[s.bucket()]
	if len(r.buf) < llmdBucketSize {
		st.n++
	}
	r.push(s)
}

// inRegime reports whether bucket i holds samples of the queue regime
// asked: queued (waiting > 0), not queued, or both.
func inRegime(i, regime int) bool {
	q := i / (llmdCacheBuckets * llmdPrefixBuckets)
	return !(regime == regimeNoQueue && q != 0 || regime == regimeQueued && q == 0)
}

// each yields the samples of the queue regime asked.
func (st *llmdStore) each(regime int, f func(s *llmdSample)) {
	for i := range st.b {
		if !inRegime(i, regime) {
			continue
		}
		for j := range st.b[i].buf {
			f(&st.b[i].buf[j])
		}
	}
}

// count is how many samples each would yield.
func (st *llmdStore) count(regime int) int {
	n := 0
	for i := range st.b {
		if inRegime(i, regime) {
			n += len(st.b[i].buf)
		}
	}
	return n
}

const (
	regimeAll = iota
	regimeNoQueue
	regimeQueued
)

// Feature rows, in the predictor's column order, without the columns that
// are constant in this setting (every replica monolithic, so pod_type's
// one-hot columns; decode_tokens_in_flight, which the producer always
// sends as 0; num_tokens_generated, zeroed in training by
// LATENCY_TPOT_ZERO_TOKEN_COUNT): standardized, a constant column is 0
// and changes no fit.
//
//	TTFT: is_queued, kv_cache_percentage, input_token_length,
//	      num_request_waiting, num_request_running,
//	      prefill_tokens_in_flight, prefix_cache_score,
//	      effective_input_tokens = (1 − prefix) × input
//	TPOT: the same up to prefill_tokens_in_flight
//
// The no-queue sub-models drop is_queued and num_request_waiting.
func ttftRow(s *llmdSample, x *brVec, noQueue bool) int {
	q := 0.0
	if s.wait > 0 {
		q = 1
	}
	eff := (1 - float64(s.prefix)) * float64(s.in)
	if noQueue {
		*x = brVec{float64(s.kv), float64(s.in), float64(s.run), float64(s.tif), float64(s.prefix), eff}
		return 6
	}
	*x = brVec{q, float64(s.kv), float64(s.in), float64(s.wait), float64(s.run), float64(s.tif), float64(s.prefix), eff}
	return 8
}

func tpotRow(s *llmdSample, x *brVec, noQueue bool) int {
	if noQueue {
		*x = brVec{float64(s.kv), float64(s.in), float64(s.run), float64(s.tif)}
		return 4
	}
	q := 0.0
	if s.wait > 0 {
		q = 1
	}
	*x = brVec{q, float64(s.kv), float64(s.in), float64(s.wait), float64(s.run), float64(s.tif)}
	return 6
}

// llmdModels is what the prediction server holds: the TTFT and TPOT
// models and, once every queue regime has llmdEnsembleMin samples, the
// queue-gated pair of each (LATENCY_ENSEMBLE_MODE, on by default), which
// predicts for a replica with no waiting request from the no-queue model.
type llmdModels struct {
	ttft, tpot     bayesRidge
	ensemble       bool
	ttftNoQ, ttftQ bayesRidge
	tpotNoQ, tpotQ bayesRidge
}

func defaultModels() llmdModels {
	return llmdModels{ttft: constantModel(llmdDefaultMs), tpot: constantModel(llmdDefaultMs)}
}

// predict returns the predicted TTFT and TPOT, in milliseconds, of a
// request of the sample's features (its y unused).
func (m *llmdModels) predict(s *llmdSample) (ttft, tpot float64) {
	var x brVec
	tm, pm, noQ := &m.ttft, &m.tpot, false
	if m.ensemble {
		noQ = s.wait <= 0
		tm, pm = &m.ttftQ, &m.tpotQ
		if noQ {
			tm, pm = &m.ttftNoQ, &m.tpotNoQ
		}
	}
	ttftRow(s, &x, noQ)
	ttft = tm.predict(&x)
	tpotRow(s, &x, noQ)
	tpot = pm.predict(&x)
	return ttft, tpot
}

// llmdTrainer is the training server: its stores and the models its last
// retrain produced (starting from the default models).
type llmdTrainer struct {
	ttftData, tpotData llmdStore
	models             llmdModels
	dirty              bool // samples added since the last retrain
	rng                *rand.Rand
}

func newLLMDTrainer(seed uint64) *llmdTrainer {
	return &llmdTrainer{models: defaultModels(), rng: rand.New(rand.NewPCG(seed, 0x11d9))}
}

// add takes a flushed entry: a TTFT sample, a TPOT sample, or neither
// (y ≤ 0), a tenth held out as test data.
func (t *llmdTrainer) add(s llmdSample, isTPOT bool) {
	if s.y <= 0 {
		return
	}
	if t.rng.Float64() < llmdTestShare {
		return
	}
	if isTPOT {
		t.tpotData.add(s)
	} else {
		t.ttftData.add(s)
	}
	t.dirty = true
}

func fit(st *llmdStore, regime int, row func(*llmdSample, *brVec, bool) int) (bayesRidge, bool) {
	noQ := regime == regimeNoQueue
	var x brVec
	p := row(&llmdSample{}, &x, noQ)
	return fitBayesRidge(p, func(yield func(*brVec, float64)) {
		st.each(regime, func(s *llmdSample) {
			row(s, &x, noQ)
			yield(&x, float64(s.y))
		})
	})
}

// retrain is train() of training_server.py: with at least llmdMinSamples
// samples in all, each model with that many is refit; the ensemble is
// rebuilt when every regime has llmdEnsembleMin, else switched off.
func (t *llmdTrainer) retrain() {
	if !t.dirty || t.ttftData.n+t.tpotData.n < llmdMinSamples {
		return
	}
	t.dirty = false
	if t.ttftData.n >= llmdMinSamples {
		if m, ok := fit(&t.ttftData, regimeAll, ttftRow); ok {
			t.models.ttft = m
		}
	}
	if t.tpotData.n >= llmdMinSamples {
		if m, ok := fit(&t.tpotData, regimeAll, tpotRow); ok {
			t.models.tpot = m
		}
	}
	t.models.ensemble = false
	if min(t.ttftData.count(regimeNoQueue), t.ttftData.count(regimeQueued),
		t.tpotData.count(regimeNoQueue), t.tpotData.count(regimeQueued)) < llmdEnsembleMin {
		return
	}
	t.models.ttftNoQ, _ = fit(&t.ttftData, regimeNoQueue, ttftRow)
	t.models.ttftQ, _ = fit(&t.ttftData, regimeQueued, ttftRow)
	t.models.tpotNoQ, _ = fit(&t.tpotData, regimeNoQueue, tpotRow)
	t.models.tpotQ, _ = fit(&t.tpotData, regimeQueued, tpotRow)
	t.models.ensemble = true
}

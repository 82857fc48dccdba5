package reference

import (
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/examlops/gateway"
)

// LLMDPredicted is llm-d's predicted-latency scheduling, followed from
// llm-d/llm-d-inference-scheduler at 520af478 (2026-05-17; the plugin
// directories below are under pkg/epp/framework/plugins/) and the
// latency predictor it deploys, latencypredictor/ of GIE
// (kubernetes-sigs/gateway-api-inference-extension) at 1748e829
// (2026-06-16; the chart names the images' moving main tag):
//
//   - the chart's profile when latencyPredictor.enabled
//     (config/charts/epplib/templates/_config.yaml): predicted-latency-
//     producer, prefix-cache-affinity-filter at 0.99, slo-headroom-tier-
//     filter, prefix-cache-affinity-filter at 0.80, latency-scorer (weight
//     1), weighted-random-picker;
//   - the producer (requestcontrol/dataproducer/predictedlatency:
//     plugin.go, dataproducer_hooks.go, prediction.go, training.go,
//     requestcontrol_hooks.go): per candidate, predicted TTFT and TPOT
//     from the replica's scraped KV-cache use, waiting and running
//     requests, the prompt's length, its prefix-cache score (the
//     approximate prefix index, as GIE's prefix scorer) and the prompt
//     tokens this picker has in flight there; headroom = SLO − predicted
//     (x-slo-ttft-ms, x-slo-tpot-ms; 0 without the header, so headroom is
//     then −predicted). With streamingMode off (its default) the TTFT
//     trained is the whole request's latency, recorded at its end, and
//     TPOT is neutral (headroom 0, valid); on, TTFT is recorded at the
//     first token and TPOT = (end − start − TTFT)/(tokens − 1) at the end
//     (the producer counts response chunks, a token each when streamed),
//     its SLO tightened to the least TPOT SLO running on the replica;
//   - the filters (scheduling/filter/prefixcacheaffinity,
//     sloheadroomtier): keep the candidates whose prefix score reaches
//     the threshold unless none does, or 1% of the time, or the best of
//     them is predicted 5 s slower than the best of the rest; keep the
//     tier meeting every SLO, or 1% of the time (when both exist) the
//     other;
//   - the scorer (scheduling/scorer/latency, defaults ttftWeight 0.8,
//     tpotWeight 0.2, strategy "least"): if any candidate meets its SLOs,
//     those are scored; else the idle ones (none in flight from this
//     picker) if any; else the least severe deficit bucket (TPOT only,
//     TTFT only, both). |headroom| is normalized to 0..1 within the group
//     and blended, a weight dropped where its range is 0, and the score
//     is (⌊(1 − blend)·100⌋ + 1)/100: the candidate nearest its SLO (with
//     no SLO: the lowest prediction) scores 1.01, the farthest 0.01; the
//     scheduler profile clamps it to 0..1 and weighs it 1
//     (pkg/epp/scheduling/scheduler_profile.go, enforceScoreRange), so
//     1.01 and 1.00 reach the picker alike as 1;
//   - the picker (picker/weightedrandom): A-Res, key U^(1/score), the
//     largest key wins: a draw weighted by score, not the best score;
//   - the predictor (training_server.py, prediction_server.py, the
//     chart's LATENCY_* settings; see llmd_latency.go): Bayesian ridge
//     over standardized features, the TTFT model on is_queued, KV use,
//     input length, waiting, running, prefill tokens in flight, prefix
//     score and (1 − prefix) × input length; samples flushed by the
//     picker every second (at most 1,000 a flush), kept in 400 buckets of
//     at most 500 each per model, a tenth held out, retrained every 10 s
//     from 10 s after start, served by a prediction server that reloads
//     the model every 10 s (here 5 s after each retrain, the mean wait);
//     before the first retrain the default model predicts 10 ms for every
//     candidate, so the scorer ties them all.
//
// What differs: the predictor's default model type is XGBoost; this uses
// its other built-in type, Bayesian ridge (LATENCY_MODEL_TYPE
// bayesian_ridge), with the chart's mean objective. A tree ensemble fits
// interactions (queue × input length) a linear model cannot; the
// Bayesian ridge here is scikit-learn's algorithm written anew, not its
// code. Input length is in tokens where the producer counts the prompt's
// words (a linear model over standardized features is unchanged by the
// scale). Not modelled: the latency-slo-admitter (it sheds only
// sheddable requests, negative priority, which the simulator does not
// send), the composite fallback (used only when the prediction sidecar is
// down), the 5-minute context TTL, disaggregated prefill, and the
// prediction server's p90 quantile (the chart sets the mean objective).
// Two settings are the code's defaults where the chart sets others: a
// flush keeps at most 1,000 samples (the client's MaxSampleSize; the
// chart's eppEnv sets LATENCY_MAX_SAMPLE_SIZE 10,000, a difference only
// above 1,000 completions a second), and the prediction server reloads
// every 10 s (MODEL_SYNC_INTERVAL_SEC; the chart sets 30 s).
//
// It needs Arrive (Tracker) for the prompt's length and SetClock for the
// times of first tokens and ends (the simulator calls both); without
// SetClock it reads time.Now. Training memory is bounded: at most
// 2 × 400 × 500 samples of 28 bytes (13.1 MB of heap when full,
// TestLLMDTrainingHeap) plus 1,000 awaiting a flush; requests in flight
// hold one entry each until Done.
//
// The zero value follows llm-d's defaults (streaming mode off). Safe for
// concurrent use.
type LLMDPredicted struct {
	// Streaming is the producer's streamingMode: true records TTFT at the
	// first token and trains TPOT, for clients that stream; false, the
	// default, trains on the whole request's latency at its end.
	Streaming bool
	// Seed seeds the random draws: the filters' exploration, the
	// weighted picker, and which samples are held out.
	Seed uint64

	mu      sync.Mutex
	clock   func() time.Time
	ready   bool
	rng     *rand.Rand
	idx     *gieIndex
	trainer *llmdTrainer
	live    llmdModels // what the prediction server serves
	newer   bool       // the trainer has a model the server has not loaded

	started                        bool
	nextFlush, nextTrain, nextSync time.Time
	flushBuf                       []llmdEntry // reservoir of entries awaiting a flush
	flushSeen                      int

	reps map[string]*llmdReplica
	reqs map[uint64]*llmdReq
	pend pending
	last llmdLast

	predicted int
	preds     []llmdPred
	keep      []int
	scratch   []int
	score     []float64
}

// Predictor defaults (LATENCY_RETRAINING_INTERVAL_SEC in the chart's
// values.yaml, the training loop's first sleep, half the code's default
// MODEL_SYNC_INTERVAL_SEC, the client's FlushInterval and MaxSampleSize;
// see the type's doc for the two the chart sets otherwise).
const (
	llmdRetrain    = 10 * time.Second
	llmdSyncLag    = 5 * time.Second
	llmdFlushEvery = time.Second
	llmdFlushMax   = 1000
)

// Scheduling defaults of the chart's profile and the plugins' configs.
const (
	llmdStrictAffinity = 0.99
	llmdLooseAffinity  = 0.80
	llmdAffinityExpl   = 0.01
	llmdMaxTTFTPenalty = 5000 // ms
	llmdEpsilonNeg     = 0.01
	llmdTTFTWeight     = 0.8
	llmdTPOTWeight     = 0.2
)

type llmdEntry struct {
	s    llmdSample
	tpot bool
}

type llmdReplica struct {
	tif      int64              // prompt tokens of requests in flight
	inflight int                // requests in flight (DispatchedRequestCount)
	zeroSLO  int                // in flight without a TPOT SLO
	slos     map[uint64]float64 // in flight with one, by request
	load     gateway.Load       // last scraped, for TPOT samples
}

type llmdReq struct {
	rep     *llmdReplica
	start   time.Time
	s       llmdSample // features at dispatch
	tokens  int64
	ttft    float64 // ms, 0 until recorded
	tpotSLO float64
}

// llmdLast is what the last Pick chose, for the Routed that follows.
type llmdLast struct {
	set     bool
	replica string
	s       llmdSample
	tokens  int64
	tpotSLO float64
}

type llmdPred struct {
	ttft, tpot   float64
	ttftH, tpotH float64
	prefix       float64
	idle         bool
}

// NewLLMDPredicted returns llm-d's predicted-latency scheduler drawing
// from seed, in streaming mode when streaming.
func NewLLMDPredicted(seed uint64, streaming bool) *LLMDPredicted {
	return &LLMDPredicted{Seed: seed, Streaming: streaming}
}

var (
	_ gateway.Policy = (*LLMDPredicted)(nil)
	_ Tracker        = (*LLMDPredicted)(nil)
	_ Predictor      = (*LLMDPredicted)(nil)
)

// SetClock sets the clock the policy reads the times of first tokens and
// ends from; nil restores time.Now. The simulator sets its own.
func (p *LLMDPredicted) SetClock(now func() time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clock = now
}

func (p *LLMDPredicted) init() {
	if p.ready {
		return
	}
	p.ready = true
	p.rng = rand.New(rand.NewPCG(p.Seed, 0x11d7))
	p.idx = newGIEIndex()
	p.trainer = newLLMDTrainer(p.Seed)
	p.live = defaultModels()
	p.reps = map[string]*llmdReplica{}
	p.reqs = map[uint64]*llmdReq{}
}

func (p *LLMDPredicted) now() time.Time {
	if p.clock != nil {
		return p.clock()
	}
	return time.Now()
}

// tick readies the policy and runs the predictor's clocks up to now,
// which it returns.
func (p *LLMDPredicted) tick() time.Time {
	p.init()
	now := p.now()
	p.advance(now)
	return now
}

// advance runs the predictor's clocks up to now: flushes every second,
// retrains every 10 s, and the prediction server's reload 5 s after each.
func (p *LLMDPredicted) advance(now time.Time) {
	if !p.started {
		p.started = true
		p.nextFlush = now.Add(llmdFlushEvery)
		p.nextTrain = now.Add(llmdRetrain)
		p.nextSync = p.nextTrain.Add(llmdSyncLag)
	}
	for {
		t := minTime(p.nextFlush, minTime(p.nextTrain, p.nextSync))
		if t.After(now) {
			return
		}
		switch {
		case t.Equal(p.nextFlush):
			for _, e := range p.flushBuf {
				p.trainer.add(e.s, e.tpot)
			}
			p.flushBuf, p.flushSeen = p.flushBuf[:0], 0
			// Nothing more arrives before now: skip the empty flushes.
			p.nextFlush = skipTo(p.nextFlush, llmdFlushEvery, now)
		case t.Equal(p.nextTrain):
			if p.trainer.dirty {
				p.trainer.retrain()
				p.newer = true
			}
			p.nextTrain = p.nextTrain.Add(llmdRetrain)
			if !p.trainer.dirty && len(p.flushBuf) == 0 {
				p.nextTrain = skipTo(p.nextTrain.Add(-llmdRetrain), llmdRetrain, now)
			}
		default:
			if p.newer {
				p.live = p.trainer.models
				p.newer = false
			}
			p.nextSync = p.nextSync.Add(llmdRetrain)
			if !p.trainer.dirty && len(p.flushBuf) == 0 {
				p.nextSync = skipTo(p.nextSync.Add(-llmdRetrain), llmdRetrain, now)
			}
		}
	}
}

// skipTo returns the first tick after now of the series t, t+every, ….
func skipTo(t time.Time, every time.Duration, now time.Time) time.Time {
	if !t.After(now) {
		t = t.Add((now.Sub(t)/every + 1) * every)
	}
	return t
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// record queues a training entry for the next flush, keeping a uniform
// sample of at most llmdFlushMax (the client samples a larger batch down).
func (p *LLMDPredicted) record(s llmdSample, tpot bool) {
	p.flushSeen++
	e := llmdEntry{s: s, tpot: tpot}
	if len(p.flushBuf) < llmdFlushMax {
		p.flushBuf = append(p.flushBuf, e)
		return
	}
	if j := p.rng.IntN(p.flushSeen); j < llmdFlushMax {
		p.flushBuf[j] = e
	}
}

func (p *LLMDPredicted) replica(name string) *llmdReplica {
	r := p.reps[name]
	if r == nil {
		r = &llmdReplica{slos: map[uint64]float64{}}
		p.reps[name] = r
	}
	return r
}

// minTPOTSLO is the least TPOT SLO of the requests in flight on r (the
// producer's running-request queue, where a request without one counts
// as 0); 0 when there are none.
func (r *llmdReplica) minTPOTSLO() float64 {
	if r.zeroSLO > 0 || len(r.slos) == 0 {
		return 0
	}
	m := math.Inf(1)
	for _, v := range r.slos {
		m = min(m, v)
	}
	return m
}

// Arrive implements Tracker.
func (p *LLMDPredicted) Arrive(a Arrival) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.init()
	p.pend = pending{a: a, set: true}
}

// Predicted implements Predictor: blocks of the hashed window matched on
// the last pick's replica.
func (p *LLMDPredicted) Predicted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.predicted
}

// Pick implements gateway.Policy.
func (p *LLMDPredicted) Pick(req *gateway.Request, cands []gateway.Candidate) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	a := p.pend.take()
	p.tick()
	bt := max(a.BlockTokens, 1)
	hashes := req.Key[:min(len(req.Key), max(1, (gieMaxPrefixTokens+bt-1)/bt))]
	for i := range cands {
		p.idx.server(cands[i].Name, gieCapacity(0, cands[i].CacheBlocks, bt))
	}
	p.idx.match(hashes)
	ttftSLO, tpotSLO := objectiveMs(req)
	p.preds = p.preds[:0]
	for i := range cands {
		c := &cands[i]
		r := p.replica(c.Name)
		r.load = c.Load
		prefix := 0.0
		if len(hashes) > 0 {
			prefix = float64(p.idx.count[p.idx.slot[c.Name]]) / float64(len(hashes))
		}
		s := features(c.Load, prefix, a.Tokens, r.tif)
		ttft, tpot := p.live.predict(&s)
		pr := llmdPred{ttft: ttft, tpot: tpot, prefix: prefix, idle: r.inflight == 0, ttftH: ttftSLO - ttft}
		if p.Streaming {
			buffered := tpotSLO
			if m := r.minTPOTSLO(); m > 0 && tpotSLO > 0 {
				buffered = min(buffered, m)
			}
			pr.tpotH = buffered - tpot
		}
		p.preds = append(p.preds, pr)
	}
	p.keep = p.keep[:0]
	for i := range cands {
		p.keep = append(p.keep, i)
	}
	p.keep = p.affinity(p.keep, llmdStrictAffinity)
	p.keep = p.tier(p.keep)
	p.keep = p.affinity(p.keep, llmdLooseAffinity)
	best := p.pickWeighted(p.scoreKept(p.keep))
	c := &cands[best]
	chosen := features(c.Load, p.preds[best].prefix, a.Tokens, 0) // Routed sets tif
	s := p.idx.slot[c.Name]
	p.predicted = p.idx.count[s]
	p.idx.add(hashes, s)
	p.last = llmdLast{set: true, replica: c.Name, s: chosen, tokens: int64(a.Tokens), tpotSLO: tpotSLO}
	return best
}

// features is the producer's sample of a candidate: its scraped load,
// the prompt's prefix score and length, and the prompt tokens in flight.
func features(l gateway.Load, prefix float64, in int, tif int64) llmdSample {
	return llmdSample{kv: float32(l.KVUtilization), prefix: float32(prefix), in: float32(in),
		wait: float32(l.QueueDepth), run: float32(l.Running), tif: float32(tif)}
}

// affinity is prefix-cache-affinity-filter at threshold.
func (p *LLMDPredicted) affinity(keep []int, threshold float64) []int {
	if len(keep) <= 1 {
		return keep
	}
	if p.rng.Float64() < llmdAffinityExpl {
		return keep
	}
	sticky := p.scratch[:0]
	bestSticky, bestOther, others := math.MaxFloat64, math.MaxFloat64, 0
	for _, i := range keep {
		pr := &p.preds[i]
		if pr.prefix >= threshold {
			sticky = append(sticky, i)
			bestSticky = min(bestSticky, pr.ttft)
		} else {
			others++
			bestOther = min(bestOther, pr.ttft)
		}
	}
	p.scratch = sticky
	if len(sticky) == 0 || others > 0 && bestSticky-bestOther > llmdMaxTTFTPenalty {
		return keep
	}
	return append(keep[:0], sticky...)
}

// tier is slo-headroom-tier-filter.
func (p *LLMDPredicted) tier(keep []int) []int {
	if len(keep) <= 1 {
		return keep
	}
	pos := p.scratch[:0]
	for _, i := range keep {
		if p.preds[i].ttftH >= 0 && p.preds[i].tpotH >= 0 {
			pos = append(pos, i)
		}
	}
	p.scratch = pos
	switch {
	case len(pos) == 0 || len(pos) == len(keep):
		return keep
	case p.rng.Float64() < llmdEpsilonNeg:
		n := 0
		for _, i := range keep {
			if p.preds[i].ttftH < 0 || p.preds[i].tpotH < 0 {
				keep[n] = i
				n++
			}
		}
		return keep[:n]
	}
	return append(keep[:0], pos...)
}

// scoreKept is latency-scorer: it leaves each kept candidate's score in
// p.score, parallel to keep, and returns keep.
func (p *LLMDPredicted) scoreKept(keep []int) []int {
	p.score = p.score[:0]
	for range keep {
		p.score = append(p.score, 0)
	}
	neg := func(i int) bool { return p.preds[i].ttftH < 0 || p.preds[i].tpotH < 0 }
	anyPos, anyIdle := false, false
	for _, i := range keep {
		if !neg(i) {
			anyPos = true
		}
		anyIdle = anyIdle || p.preds[i].idle
	}
	var in func(i int) bool
	switch {
	case anyPos:
		in = func(i int) bool { return !neg(i) }
	case anyIdle:
		in = func(i int) bool { return p.preds[i].idle }
	default:
		// Deficit buckets: TPOT only, then TTFT only, then both.
		class := func(i int) int {
			t, o := p.preds[i].ttftH < 0, p.preds[i].tpotH < 0
			switch {
			case o && !t:
				return 0
			case t && !o:
				return 1
			}
			return 2
		}
		b := 2
		for _, i := range keep {
			b = min(b, class(i))
		}
		in = func(i int) bool { return class(i) == b }
	}
	p.scoreBucket(keep, in)
	return keep
}

// scoreBucket scores the kept candidates in the bucket, the others 0, by
// the "least" strategy (the default, and forced for negative headroom).
func (p *LLMDPredicted) scoreBucket(keep []int, in func(i int) bool) {
	alpha, beta := llmdTTFTWeight/(llmdTTFTWeight+llmdTPOTWeight), llmdTPOTWeight/(llmdTTFTWeight+llmdTPOTWeight)
	minT, maxT, minP, maxP := math.MaxFloat64, -math.MaxFloat64, math.MaxFloat64, -math.MaxFloat64
	for _, i := range keep {
		if !in(i) {
			continue
		}
		t, o := math.Abs(p.preds[i].ttftH), math.Abs(p.preds[i].tpotH)
		minT, maxT, minP, maxP = min(minT, t), max(maxT, t), min(minP, o), max(maxP, o)
	}
	const eps = 1e-9
	rt, rp := maxT-minT, maxP-minP
	switch {
	case rt <= eps && rp > eps:
		alpha, beta = 0, 1
	case rp <= eps && rt > eps:
		alpha, beta = 1, 0
	}
	for k, i := range keep {
		if !in(i) {
			continue
		}
		nt, np := 0.5, 0.5
		if rt > eps {
			nt = (math.Abs(p.preds[i].ttftH) - minT) / rt
		}
		if rp > eps {
			np = (math.Abs(p.preds[i].tpotH) - minP) / rp
		}
		p.score[k] = float64(int((1-(alpha*nt+beta*np))*100)+1) / 100
	}
}

// pickWeighted is weighted-random-picker over the profile's weighted
// scores, each clamped to 0..1: the largest U^(1/score), or a uniform
// draw when no score is positive.
func (p *LLMDPredicted) pickWeighted(keep []int) int {
	best, bestKey, any := keep[0], -1.0, false
	for k := range keep {
		if p.score[k] > 0 {
			any = true
		}
	}
	if !any {
		return keep[p.rng.IntN(len(keep))]
	}
	for k, i := range keep {
		key := 0.0
		if p.score[k] > 0 {
			u := p.rng.Float64()
			if u == 0 {
				u = 1e-10
			}
			key = math.Pow(u, 1/min(p.score[k], 1))
		}
		if key > bestKey {
			best, bestKey = i, key
		}
	}
	return best
}

// Routed implements gateway.Observer: the request the last Pick placed
// is dispatched (PreRequest).
func (p *LLMDPredicted) Routed(id uint64, replica string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.tick()
	l := p.last
	p.last.set = false
	if !l.set || l.replica != replica {
		l = llmdLast{}
	}
	r := p.replica(replica)
	r.tif += l.tokens
	r.inflight++
	if l.tpotSLO > 0 {
		r.slos[id] = l.tpotSLO
	} else {
		r.zeroSLO++
	}
	q := &llmdReq{rep: r, start: now, s: l.s, tokens: l.tokens, tpotSLO: l.tpotSLO}
	q.s.tif = float32(r.tif) // prefillTokensAtDispatch, this request included
	p.reqs[id] = q
}

// FirstToken implements gateway.Observer: in streaming mode, the TTFT
// sample.
func (p *LLMDPredicted) FirstToken(id uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.tick()
	q := p.reqs[id]
	if q == nil || !p.Streaming || q.ttft > 0 {
		return
	}
	q.ttft = float64(now.Sub(q.start).Milliseconds())
	if q.ttft > 0 {
		s := q.s
		s.y = float32(q.ttft)
		p.record(s, false)
	}
}

// Done implements gateway.Observer: the end of the response (the
// non-streaming TTFT sample, or the streaming TPOT sample) and the
// request's release.
func (p *LLMDPredicted) Done(id uint64, info gateway.DoneInfo) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.tick()
	q := p.reqs[id]
	if q == nil {
		return
	}
	delete(p.reqs, id)
	r := q.rep
	r.tif = max(0, r.tif-q.tokens)
	r.inflight--
	if q.tpotSLO > 0 {
		delete(r.slos, id)
	} else {
		r.zeroSLO--
	}
	if info.Err != nil {
		return
	}
	e2e := float64(now.Sub(q.start).Milliseconds())
	if !p.Streaming {
		if e2e > 0 {
			s := q.s
			s.y = float32(e2e)
			p.record(s, false)
		}
		return
	}
	if out := info.OutputTokens; q.ttft > 0 && out > 1 {
		if tpot := (e2e - q.ttft) / float64(out-1); tpot > 0 {
			s := llmdSample{kv: float32(r.load.KVUtilization), in: q.s.in, wait: float32(r.load.QueueDepth),
				run: float32(r.load.Running), tif: q.s.tif, y: float32(tpot)}
			p.record(s, true)
		}
	}
}

// objectiveMs returns the request's TTFT and TPOT objectives in
// milliseconds (Target.TTFT and Target.TPOT, llm-d's x-slo-ttft-ms and
// x-slo-tpot-ms headers); 0 where it sets none.
func objectiveMs(req *gateway.Request) (ttft, tpot float64) {
	return float64(req.TTFT) / 1e6, float64(req.TPOT) / 1e6
}

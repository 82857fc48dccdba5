package front

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/flow"
)

// Flow control at the fronts (issue 28): past capacity a request waits in
// its model's queue (package flow, the library's decisions) instead of
// being shed, and is bound to a replica when its turn comes. Both fronts
// hold through a FlowControl: the HTTP gateway holds the request, the
// picker the ext_proc stream, as GIE does.

// FlowControl holds a front's requests, a flow.Controller per model made
// on first use; the queues share one flow.Budget of Options.Queue.Total,
// so the requests and bytes held are bounded for the whole front. A nil
// *FlowControl is off. Safe for concurrent use.
type FlowControl struct {
	o   flow.Options
	now func() time.Time
	m   flowMetrics
	// objectives is o.Objectives, replaced whole by SetObjectives.
	objectives atomic.Pointer[map[string]int]

	mu   sync.Mutex
	ctls map[string]*modelFlow
}

type modelFlow struct {
	ctl    *flow.Controller[func() bool]
	cancel context.CancelFunc
	done   chan struct{}
}

// NewFlowControl returns the flow control o describes, its series
// registered on reg, or nil (off) when o is not Enabled. It checks the
// queue's configuration once.
func NewFlowControl(o flow.Options, now func() time.Time, reg prometheus.Registerer) (*FlowControl, error) {
	if !o.Enabled {
		return nil, nil
	}
	if _, err := flow.New[int](o.Queue); err != nil {
		return nil, err
	}
	// The models' queues share one budget of the total limits: the
	// front's memory for held requests is bounded once, whatever the
	// number of models.
	budget, err := flow.NewBudget(o.Queue.Total)
	if err != nil {
		return nil, err
	}
	o.Queue.Budget = budget
	if o.Retry < 0 {
		return nil, fmt.Errorf("%w: flow.Options.Retry %v is negative", flow.ErrInvalid, o.Retry)
	}
	for p, c := range o.UsageLimits {
		if !flow.ValidUsageLimit(c) {
			return nil, fmt.Errorf("%w: flow.Options.UsageLimits[%d] %v, want (0, 1]", flow.ErrInvalid, p, c)
		}
	}
	if o.FairnessHeader == "" {
		o.FairnessHeader = flow.HeaderFairnessID
	}
	if now == nil {
		now = time.Now
	}
	f := &FlowControl{o: o, now: now, ctls: map[string]*modelFlow{}}
	f.SetObjectives(o.Objectives)
	f.m = newFlowMetrics(f)
	if reg != nil {
		for _, c := range f.m.collectors() {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return f, nil
}

// Header is a request's headers: http.Header, or the picker's
// picker.Headers (flow.Header, which the rate limiter reads too).
type Header = flow.Header

// Priority returns the priority of a request with header h: its
// objective's, else 0.
func (f *FlowControl) Priority(h Header) int {
	return (*f.objectives.Load())[h.Get(flow.HeaderObjective)]
}

// Admission returns the admission rule a request with header h binds
// under: a, scaled by the usage limit of its priority (flow.Limit,
// Options.UsageLimits), so that a lower band leaves headroom for a higher
// one.
func (f *FlowControl) Admission(a gateway.Admission, h Header) gateway.Admission {
	if len(f.o.UsageLimits) == 0 {
		return a
	}
	return flow.Limit(a, f.o.UsageLimits[f.Priority(h)])
}

// SetObjectives replaces the objectives (name to priority), as when
// Kubernetes' InferenceObjectives change; m is not modified after. Nil
// means none. The requests and queue-time series of priorities no
// objective has any more (0 aside) are dropped, so that objectives
// changing over time do not grow the series.
func (f *FlowControl) SetObjectives(m map[string]int) {
	if f == nil {
		return
	}
	if m == nil {
		m = map[string]int{}
	}
	f.objectives.Store(&m)
	f.m.drop(m)
}

// Hold holds a request of model with header h and size bytes until bind
// takes it (see flow.Controller.Hold; bind is called at most once with
// true). It returns nil once bound, else the reason it was not (answer it
// with FlowAnswer).
func (f *FlowControl) Hold(ctx context.Context, model string, h Header, bytes int64, bind func() bool) error {
	id := h.Get(f.o.FairnessHeader)
	if len(id) > flow.MaxFlowID {
		id = id[:flow.MaxFlowID] // a longer id shares the flow of its prefix
	}
	prio := f.Priority(h)
	mf, err := f.model(model)
	if err != nil {
		return err
	}
	start := f.now()
	err = mf.ctl.Hold(ctx, flow.Request[func() bool]{Value: bind, Flow: id, Priority: prio, Bytes: bytes})
	if err != nil && ctx.Err() != nil && outcome(err) == FlowClientGone {
		// A context ended for a cause of its own, not by the client
		// going (the picker's RequestTimeout): the request's time ran
		// out in the queue.
		if c := context.Cause(ctx); c != nil && !errors.Is(c, context.Canceled) && !errors.Is(c, context.DeadlineExceeded) {
			err = fmt.Errorf("%w: %w", flow.ErrExpired, c)
		}
	}
	f.m.count(model, prio, outcome(err), f.now().Sub(start))
	return err
}

// Kick tells model's queue that a request ended: one held may go.
func (f *FlowControl) Kick(model string) {
	if f == nil {
		return
	}
	f.mu.Lock()
	mf := f.ctls[model]
	f.mu.Unlock()
	if mf != nil {
		mf.ctl.Kick()
	}
}

// FirstToken tells model's queue of a request's first token when the
// front's admission rule a counts room in pending prefill
// (a.PendingPrefill), which the first token releases: a held request may
// then go. Both fronts call it at a first token; nil (off) does nothing.
func (f *FlowControl) FirstToken(model string, a gateway.Admission) {
	if FirstTokenFreesRoom(a) {
		f.Kick(model)
	}
}

// FirstTokenFreesRoom reports whether a first token can give a replica
// room under a: when a counts pending prefill (a.PendingPrefill), which
// the first token releases. The fronts (FlowControl.FirstToken) and the
// simulator dispatch held requests then.
func FirstTokenFreesRoom(a gateway.Admission) bool { return a.PendingPrefill > 0 }

// Close stops every model's queue, answering what each holds with
// flow.ErrClosed; the next Hold starts a new one.
func (f *FlowControl) Close() {
	if f == nil {
		return
	}
	f.mu.Lock()
	ctls := f.ctls
	f.ctls = map[string]*modelFlow{}
	f.mu.Unlock()
	for _, mf := range ctls {
		mf.cancel()
		<-mf.done
	}
}

// Retain stops the queues of the models next lacks (a reload removed
// them): what they hold is answered as when the queue stops (flow.ErrClosed:
// 503), and a later request of that name starts a new queue. It is the
// fronts' fleet.Fleet.OnApply hook; nil (off) does nothing.
func (f *FlowControl) Retain(_, next *fleet.State) {
	if f == nil {
		return
	}
	f.mu.Lock()
	var stop []*modelFlow
	for name, mf := range f.ctls {
		if next.Models[name] == nil {
			stop = append(stop, mf)
			delete(f.ctls, name)
		}
	}
	f.mu.Unlock()
	for _, mf := range stop {
		mf.cancel() // its Run answers what it holds and ends
	}
}

// model returns model's controller, started on first use.
func (f *FlowControl) model(model string) (*modelFlow, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if mf := f.ctls[model]; mf != nil {
		return mf, nil
	}
	ctl, err := flow.NewController[func() bool](f.o.Queue, func(bind func() bool) bool { return bind() }, f.now, f.o.Retry)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	mf := &modelFlow{ctl: ctl, cancel: cancel, done: make(chan struct{})}
	go func() { ctl.Run(ctx); close(mf.done) }()
	f.ctls[model] = mf
	return mf, nil
}

// Outcomes of exa_gateway_flow_requests_total.
const (
	FlowDispatched = "dispatched"
	FlowFull       = "rejected_full"
	FlowDisplaced  = "displaced"
	FlowExpired    = "expired"
	FlowSheddable  = "shed_sheddable"
	FlowClientGone = "client_gone"
	FlowClosed     = "closed"
	FlowInvalid    = "invalid"
)

func outcome(err error) string {
	switch {
	case err == nil:
		return FlowDispatched
	case errors.Is(err, flow.ErrFull):
		return FlowFull
	case errors.Is(err, flow.ErrDisplaced):
		return FlowDisplaced
	case errors.Is(err, flow.ErrExpired):
		return FlowExpired
	case errors.Is(err, flow.ErrSheddable):
		return FlowSheddable
	case errors.Is(err, flow.ErrClosed):
		return FlowClosed
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return FlowClientGone
	}
	return FlowInvalid
}

// FlowAnswer is the answer to a request Hold did not bind (err not nil),
// as GIE answers its flow control's outcomes (requestcontrol/admission.go:
// capacity 429, time-out in queue 503): 429 rate_limit_error (with
// Retry-After) for a full queue, a displacement or a sheddable request;
// 503 for a request held past its deadline or a stopping queue; 499 for a
// client gone.
func FlowAnswer(model string, err error) (status int, typ, code, msg string) {
	switch outcome(err) {
	case FlowFull, FlowDisplaced, FlowSheddable:
		return http.StatusTooManyRequests, TypeRateLimit, CodeShed, fmt.Sprintf("gateway: model %q is saturated and its queue has no room for this request: %v; retry later", model, err)
	case FlowExpired:
		return http.StatusServiceUnavailable, TypeUnavailable, "queue_timeout", fmt.Sprintf("gateway: model %q: the request waited its whole time in queue and no replica had room: %v", model, err)
	case FlowClientGone:
		return StatusClientClosed, TypeInvalidRequest, CodeClientCanceled, fmt.Sprintf("gateway: the client went away while its request waited in model %q's queue", model)
	}
	return http.StatusServiceUnavailable, TypeUnavailable, "queue_closed", fmt.Sprintf("gateway: model %q: %v", model, err)
}

// flowMetrics are flow control's series, like GIE's flow-control metrics
// (pkg/epp/metrics: flow_control_queue_size, queue_bytes,
// request_queue_duration_seconds): by model and priority, the priorities
// being the configured objectives' and 0. Fairness ids are not a label,
// so a client cannot add series.
type flowMetrics struct {
	f         *FlowControl
	requests  *prometheus.CounterVec
	queueTime *prometheus.HistogramVec
	size      *prometheus.Desc
	bytes     *prometheus.Desc
	counted   *countedPriorities
}

// countedPriorities are the priorities that have requests and queue-time
// series; mu also orders a count against drop, so that a series counted
// while its priority is dropped is dropped at the next change.
type countedPriorities struct {
	mu sync.Mutex
	p  map[int]bool
}

func newFlowMetrics(f *FlowControl) flowMetrics {
	const ns = "exa_gateway"
	return flowMetrics{
		f: f,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "flow_requests_total",
			Help: "Requests past capacity that flow control held or refused, by model, priority and outcome (dispatched, rejected_full, displaced, expired, shed_sheddable, client_gone, closed, invalid)."},
			[]string{"model", "priority", "outcome"}),
		queueTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "flow_queue_duration_seconds",
			Help: "Time requests spent in flow control's queue, by model, priority and outcome.", Buckets: LatencyBuckets},
			[]string{"model", "priority", "outcome"}),
		size:    prometheus.NewDesc(ns+"_flow_queue_requests", "Requests held in flow control's queue, by model and priority: the demand waiting for capacity (an autoscaling signal).", []string{"model", "priority"}, nil),
		bytes:   prometheus.NewDesc(ns+"_flow_queue_bytes", "Bytes of the requests held in flow control's queue, by model and priority.", []string{"model", "priority"}, nil),
		counted: &countedPriorities{p: map[int]bool{}},
	}
}

func (m *flowMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.requests, m.queueTime, (*flowGauges)(m)}
}

func (m *flowMetrics) count(model string, prio int, outcome string, held time.Duration) {
	p := strconv.Itoa(prio)
	m.counted.mu.Lock()
	defer m.counted.mu.Unlock()
	m.counted.p[prio] = true
	m.requests.WithLabelValues(model, p, outcome).Inc()
	m.queueTime.WithLabelValues(model, p, outcome).Observe(held.Seconds())
}

// drop deletes the requests and queue-time series of the priorities
// counted that neither objectives nor 0 has.
func (m *flowMetrics) drop(objectives map[string]int) {
	if m.counted == nil { // NewFlowControl's first SetObjectives
		return
	}
	keep := map[int]bool{0: true}
	for _, p := range objectives {
		keep[p] = true
	}
	m.counted.mu.Lock()
	defer m.counted.mu.Unlock()
	for p := range m.counted.p {
		if !keep[p] {
			l := prometheus.Labels{"priority": strconv.Itoa(p)}
			m.requests.DeletePartialMatch(l)
			m.queueTime.DeletePartialMatch(l)
			delete(m.counted.p, p)
		}
	}
}

// flowGauges reads the queues' sizes at each scrape.
type flowGauges flowMetrics

func (g *flowGauges) Describe(ch chan<- *prometheus.Desc) { ch <- g.size; ch <- g.bytes }

func (g *flowGauges) Collect(ch chan<- prometheus.Metric) {
	f := g.f
	f.mu.Lock()
	stats := make(map[string]flow.Stats, len(f.ctls))
	for model, mf := range f.ctls {
		stats[model] = mf.ctl.Stats()
	}
	f.mu.Unlock()
	configured := map[int]bool{0: true}
	for _, p := range *f.objectives.Load() {
		configured[p] = true
	}
	for model, s := range stats {
		held := map[int]flow.BandStats{}
		for _, b := range s.Bands {
			held[b.Priority] = b
		}
		prios := maps.Clone(configured)
		for p := range held { // a band of objectives since replaced: this model's alone
			prios[p] = true
		}
		for p := range prios {
			b := held[p]
			ch <- prometheus.MustNewConstMetric(g.size, prometheus.GaugeValue, float64(b.Requests), model, strconv.Itoa(p))
			ch <- prometheus.MustNewConstMetric(g.bytes, prometheus.GaugeValue, float64(b.Bytes), model, strconv.Itoa(p))
		}
	}
}

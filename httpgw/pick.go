package httpgw

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/keys"
	"github.com/examlops/gateway/picker"
)

// This file serves the Server's routing to Envoy as an endpoint picker
// (package picker): the same configuration, models, health checks, load
// scrapes, exact index and reloads as the HTTP gateway, the same request
// parsing and keys, the same metrics, but Envoy carries the traffic. See
// docs/picker.md.

// PickerOptions configures a Picker. The zero value offers no fallbacks
// and never sheds.
type PickerOptions struct {
	// Fallbacks is how many fallback endpoints each pick offers
	// (picker.Pick.Fallbacks): other healthy replicas of the model within
	// the subset hint, fewest outstanding requests first. The picker
	// server sends them only up to its own picker.Options.MaxFallbacks.
	// Default 0.
	Fallbacks int
	// ShedAbove, when positive, declines a request with 429 when every
	// healthy replica of its model within the subset hint has at least
	// this many requests outstanding: the larger of the gateway's
	// in-flight count and the engine's scraped queue plus batch, as
	// gateway.Candidate.Outstanding counts them. It is the Outstanding
	// threshold of the Server's admission rule (Options.Admission), whose
	// other thresholds apply too. Default 0: the Server's.
	ShedAbove int
}

// Picker is a picker.Router over a Server's models: a request is parsed
// and keyed as the HTTP gateway parses and keys it, resolved to its model
// (or a LoRA adapter of one, routed over the replicas serving it, its key
// salted, as in lora.go), routed by the model's gateway within the subset
// hint (gateway.Target.Adapter), and answered with the chosen engine's
// "ip:port". Create one with Server.Picker; it is safe for concurrent use,
// and follows the Server's reloads.
//
// Errors answer the client as the HTTP gateway does, with the same status
// and OpenAI error object (picker.StatusError): 400 for a malformed
// request, 404 for an unknown model or path, 405 for another method, 503
// when the model has no replicas or none is healthy (and within the
// hint); 429 when shedding. GET /v1/models is answered by the picker from
// the configuration (picker.Pick.Reply), as the HTTP gateway answers it.
//
// Endpoints must be IP addresses with ports, since Envoy's ORIGINAL_DST
// cluster connects to the address it is given without resolving names: a
// replica whose address has a host name is never picked (it is left out as
// if unhealthy, with a warning logged when the configuration is read) and,
// if no other replica is eligible, the client gets 503 naming it.
//
// A disaggregated model in sidecar mode (config.PDModeSidecar) is served
// as llm-d's P/D profile serves it: the picker names the decode replica
// (the sidecar's address) and, when the decider splits the request, sets
// x-prefiller-host-port to the prefill replica for the sidecar; otherwise
// it removes a client's x-prefiller-host-port. In gateway mode the HTTP
// gateway runs the prefill request itself, which a picker cannot: such a
// model is answered with 500 naming the setting to change.
type Picker struct {
	s     *Server
	opts  PickerOptions
	table atomic.Pointer[pickTable]
	mu    sync.Mutex // serialises table builds
	pool  sync.Pool  // *pickTracker
}

var _ picker.Router = (*Picker)(nil)

// Picker returns a picker.Router over the Server's models.
func (s *Server) Picker(opts PickerOptions) (*Picker, error) {
	if opts.Fallbacks < 0 {
		return nil, fmt.Errorf("%w: PickerOptions.Fallbacks %d is negative", ErrInvalidOptions, opts.Fallbacks)
	}
	if opts.ShedAbove < 0 {
		return nil, fmt.Errorf("%w: PickerOptions.ShedAbove %d is negative", ErrInvalidOptions, opts.ShedAbove)
	}
	p := &Picker{s: s, opts: opts}
	p.pool.New = func() any { return new(pickTracker) }
	p.tableOf(s.Snapshot())
	return p, nil
}

// pickTable is the picker's view of one state snapshot: each engine's
// "ip:port" endpoint, in canonical form. Immutable once built.
type pickTable struct {
	st *fleet.State
	// eps maps an engine's base URL to its endpoint; an engine whose
	// address is not ip:port is absent, and bad says why.
	eps  map[string]pickEndpoint
	byEP map[string]*fleet.Endpoint // endpoint to engine
	bad  map[string]string          // base URL to the reason
	// allIP lists the models all of whose replicas have endpoints.
	allIP map[string]bool
}

// pickEndpoint is an engine's endpoint, canonical ("ip:port") and its
// address alone, for subset entries that name an address without a port.
type pickEndpoint struct {
	ep, addr string
}

// tableOf returns the table of st, building it on the first pick after a
// reload.
func (p *Picker) tableOf(st *fleet.State) *pickTable {
	if t := p.table.Load(); t != nil && t.st == st {
		return t
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if t := p.table.Load(); t != nil && t.st == st {
		return t
	}
	t := &pickTable{st: st, eps: map[string]pickEndpoint{}, byEP: map[string]*fleet.Endpoint{}, bad: map[string]string{}, allIP: map[string]bool{}}
	for base, ep := range st.Endpoints {
		s, err := picker.EndpointOf(base)
		if err == nil {
			ap, perr := netip.ParseAddrPort(s)
			if perr == nil {
				pe := pickEndpoint{ep: ap.String(), addr: ap.Addr().String()}
				t.eps[base] = pe
				t.byEP[pe.ep] = ep
				continue
			}
			err = perr
		}
		t.bad[base] = err.Error()
	}
	names := st.File.Names()
	for _, name := range names {
		m := st.Models[name]
		if m == nil {
			continue
		}
		ok := true
		for _, r := range m.Order {
			if m.PD != nil && m.PD.PrefillNames[r] {
				continue // named to the sidecar, which resolves host names
			}
			ep := m.ByName[r]
			if why, bad := t.bad[ep.Base]; bad {
				ok = false
				p.s.log.Warn("picker: a replica's address is not ip:port, so the picker never picks it (Envoy's ORIGINAL_DST cluster connects to IP addresses only; write the engine's IP)",
					"model", name, "replica", r, "address", ep.Base, "err", why)
			}
		}
		t.allIP[name] = ok
	}
	p.table.Store(t)
	return t
}

// endpointOf returns the endpoint of an engine's base URL.
func (t *pickTable) endpointOf(base string) (string, error) {
	if pe, ok := t.eps[base]; ok {
		return pe.ep, nil
	}
	// An engine a reload added after this snapshot.
	s, err := picker.EndpointOf(base)
	if err != nil {
		return "", err
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return "", err
	}
	return ap.String(), nil
}

// allows reports whether the replica name of ms may be picked: its engine
// has an endpoint, within the subset hint (nil: any).
func (t *pickTable) allows(ms *fleet.Model, sub picker.Subset, name string) bool {
	ep := ms.ByName[name]
	if ep == nil {
		return false
	}
	pe, ok := t.eps[ep.Base]
	if !ok {
		return false
	}
	if sub == nil {
		return true
	}
	for _, e := range sub { // canonical entries (picker.Subset)
		if e == pe.ep || e == pe.addr {
			return true
		}
	}
	return false
}

// Pick implements picker.Router.
func (p *Picker) Pick(ctx context.Context, req *picker.PickRequest) (picker.Pick, error) {
	s := p.s
	start := req.Received
	if start.IsZero() {
		start = s.opts.Clock()
	}
	path := req.Path
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	var kind endpointKind
	switch path {
	case "/v1/chat/completions":
		kind = endpointChat
	case "/v1/completions":
		kind = endpointCompletions
	case "/v1/models":
		return p.models(req)
	default:
		s.metrics.requests.WithLabelValues("", "other", "404").Inc()
		return picker.Pick{}, &picker.StatusError{Status: http.StatusNotFound, Type: typeNotFound, Code: "unknown_endpoint",
			Err: errors.New("gateway: no endpoint " + path + " (the picker routes /v1/chat/completions and /v1/completions, and answers /v1/models)")}
	}
	pr := pickRequest{p: p, kind: kind, start: start}
	if req.Method != http.MethodPost {
		return pr.fail(http.StatusMethodNotAllowed, typeInvalidRequest, "method_not_allowed", "",
			errors.New("gateway: "+path+" accepts POST only, not "+req.Method))
	}
	body := req.Body
	if body == nil {
		body = []byte{}
	}
	rq, err := parseRequest(kind, body)
	if err != nil {
		var re *requestError
		param := ""
		if errors.As(err, &re) {
			param = re.field
		}
		return pr.fail(http.StatusBadRequest, typeInvalidRequest, "invalid_request", param, fmt.Errorf("%w: %w", picker.ErrBadRequest, err))
	}
	st := s.Snapshot()
	ms, ok := st.Models[rq.Model]
	if !ok {
		// A LoRA adapter of a configured model, or else a 404 (lora.go).
		if pr.lora, err = st.AdapterRoute(rq.Model); err != nil {
			return pr.fail(http.StatusNotFound, typeNotFound, "model_not_found", "model", fmt.Errorf("%w: %w", picker.ErrUnknownModel, err))
		}
		ms = pr.lora.Model
	}
	pr.ms = ms
	switch {
	case ms.NoReplicas && len(ms.MissingPools) > 0:
		return pr.fail(http.StatusServiceUnavailable, typeUnavailable, "no_replicas", "model",
			fmt.Errorf("%w: %w: model %q is disaggregated but its pools %q are not defined", picker.ErrNoEndpoint, ErrNoReplicas, ms.Name, ms.MissingPools))
	case ms.NoReplicas:
		return pr.fail(http.StatusServiceUnavailable, typeUnavailable, "no_replicas", "model",
			fmt.Errorf("%w: %w: model %q has no replicas configured", picker.ErrNoEndpoint, ErrNoReplicas, ms.Name))
	case ms.PD != nil && !ms.PD.Sidecar:
		return pr.fail(http.StatusInternalServerError, typeServer, "pd_mode_gateway", "model",
			fmt.Errorf("gateway: model %q is disaggregated in P/D mode gateway, where the HTTP gateway runs the prefill request itself, which a picker cannot; serve it with `exa serve gateway`, or set its P/D mode to sidecar (exa serve routing set %s --pd-mode sidecar) with llm-d's pd-sidecar in front of each decode engine", ms.Name, ms.Name))
	}
	kp := s.keyPool.Get().(*gateway.Key)
	defer func() { s.keyPool.Put(kp) }()
	hdr := keyHeader(req.Header)
	if ms.ExactBlockSize > 0 {
		hr := (&http.Request{Method: http.MethodPost, Header: hdr}).WithContext(ctx)
		c := &call{r: hr, body: body, req: rq, ms: ms, lora: pr.lora, oc: outcome{kind: kind}}
		*kp, pr.fallback = s.exactKey(c, (*kp)[:0])
	} else {
		*kp = keys.Salt(appendKey(s.hasher, (*kp)[:0], rq, hdr), pr.adapter())
	}
	pr.key = *kp
	pr.tab = p.tableOf(st)
	pr.sub = req.Subset
	return pr.route()
}

// keyHeader returns the request headers a prefix key reads (see
// appendKey) as an http.Header; nil when there are none.
func keyHeader(h picker.Headers) http.Header {
	var out http.Header
	for _, name := range [...]string{HeaderSessionID, HeaderRAGContext} {
		if v := h.Get(name); v != "" {
			if out == nil {
				out = make(http.Header, 2)
			}
			out.Set(name, v)
		}
	}
	return out
}

// pickRequest is one request being picked for.
type pickRequest struct {
	p        *Picker
	kind     endpointKind
	start    time.Time
	ms       *fleet.Model
	lora     *fleet.AdapterRoute // the LoRA adapter the request names; nil for the base model
	key      gateway.Key
	fallback int
	tab      *pickTable
	sub      picker.Subset
}

// adapter is the request's LoRA adapter, "" for the base model.
func (pr *pickRequest) adapter() string {
	if pr.lora == nil {
		return ""
	}
	return pr.lora.Name
}

// fail counts a request the picker answers with an error and returns the
// error, which answers as the HTTP gateway would.
func (pr *pickRequest) fail(status int, typ, code, param string, err error) (picker.Pick, error) {
	s, model := pr.p.s, ""
	var mm *modelMetrics
	if pr.ms != nil {
		model, mm = pr.ms.Name, mmOf(pr.ms)
	}
	mm.requestsC(s.metrics, model, pr.kind, strconv.Itoa(status)).Inc()
	if model != "" {
		mm.durationO(s.metrics, model, pr.kind).Observe(s.opts.Clock().Sub(pr.start).Seconds())
	}
	return picker.Pick{}, &picker.StatusError{Status: status, Type: typ, Code: code, Param: param, Err: err}
}

// allow returns the replicas of the model the pick may choose, for
// gateway.Target.Adapter: for an adapter, those whose engines serve it;
// those with an endpoint (unless the prefill pool's, which the sidecar
// reaches); within the subset hint. nil (all) when that is every replica.
func (pr *pickRequest) allow(prefill bool) func(string) bool {
	var eligible map[string]bool
	if pr.lora != nil {
		eligible = pr.lora.Eligible
	}
	tab, ms, sub := pr.tab, pr.ms, pr.sub
	needEP := sub != nil || (!prefill && !tab.allIP[ms.Name])
	if eligible == nil && !needEP {
		return nil
	}
	return func(name string) bool {
		if eligible != nil && !eligible[name] {
			return false
		}
		return !needEP || tab.allows(ms, sub, name)
	}
}

// noEndpoint is the error of a pick that found no eligible replica.
func (pr *pickRequest) noEndpoint(pool string, err error) (picker.Pick, error) {
	ms := pr.ms
	what := "replica"
	if pool != "" {
		what = pool + " replica"
	}
	msg := fmt.Sprintf("gateway: no healthy %s for model %q", what, ms.Name)
	if pr.lora != nil {
		msg = fmt.Sprintf("gateway: no healthy %s serving LoRA adapter %q of model %q", what, pr.lora.Name, ms.Name)
	}
	if pr.sub != nil {
		msg += fmt.Sprintf(" within the subset hint %v", []string(pr.sub))
	}
	var bad []string
	for _, r := range ms.Order {
		if ms.PD != nil && ms.PD.PrefillNames[r] {
			continue
		}
		if ep := ms.ByName[r]; ep != nil {
			if _, ok := pr.tab.bad[ep.Base]; ok {
				bad = append(bad, r+"="+ep.Base)
			}
		}
	}
	if len(bad) > 0 {
		msg += fmt.Sprintf(" (replicas whose address is not ip:port are never picked: %s)", strings.Join(bad, ", "))
	}
	return pr.fail(http.StatusServiceUnavailable, typeUnavailable, "no_healthy_replica", "",
		fmt.Errorf("%w: %s: %v", picker.ErrNoEndpoint, msg, err))
}

// admission is the picker's admission rule: the Server's
// (Options.Admission), with PickerOptions.ShedAbove as its Outstanding
// threshold when set.
func (p *Picker) admission() gateway.Admission {
	a := p.s.opts.Admission
	if p.opts.ShedAbove > 0 {
		a.Outstanding = p.opts.ShedAbove
	}
	return a
}

// target is the gateway.Target of a pick within allow (pr.allow).
func (pr *pickRequest) target(allow func(string) bool) gateway.Target {
	return gateway.Target{Adapter: pr.adapter(), Allow: allow}
}

// route routes the request over its model's gateway and returns the pick.
func (pr *pickRequest) route() (picker.Pick, error) {
	p, s, ms := pr.p, pr.p.s, pr.ms
	allow := pr.allow(false)
	if a := p.admission(); ms.Gateway.Saturated(pr.target(allow), a) {
		return pr.fail(http.StatusTooManyRequests, "rate_limit_error", "shed", "",
			fmt.Errorf("%w: gateway: model %q is saturated: no eligible replica has room (%s)", picker.ErrShed, ms.Name, admissionText(a)))
	}
	if ms.PD != nil {
		return pr.routePD(allow)
	}
	var failed string
	for try := 0; try < 2; try++ {
		t := pr.target(allow)
		t.Exclude = failed
		d, err := ms.Gateway.RouteWith(pr.key, t)
		if err != nil {
			if errors.Is(err, gateway.ErrNoHealthyReplica) {
				return pr.noEndpoint("", err)
			}
			return pr.fail(http.StatusInternalServerError, typeServer, "routing_error", "", err)
		}
		ep := s.endpointOf(ms, &d)
		var endpoint string
		if ep == nil {
			err = fmt.Errorf("replica %q (%s) is no longer configured", d.Replica, d.Address)
		} else {
			endpoint, err = pr.tab.endpointOf(ep.Base)
		}
		if err != nil {
			// A reload moved the replica (or gave it a host name): release
			// the decision and try another.
			d.Done(gateway.DoneInfo{Err: err})
			failed = d.Replica
			continue
		}
		tr := pr.track(d, ep, endpoint)
		return picker.Pick{Endpoint: endpoint, Fallbacks: pr.fallbacks(allow, d.Replica), ResponseHeaders: pr.decisionHeaders(&d), Tracker: tr}, nil
	}
	return pr.noEndpoint("", fmt.Errorf("replica %q is no longer configured", failed))
}

// fallbacks returns the endpoints of up to Fallbacks other eligible
// replicas than picked, as the library ranks them (gateway.Spares).
func (pr *pickRequest) fallbacks(allow func(string) bool, picked string) []string {
	n := pr.p.opts.Fallbacks
	if n == 0 {
		return nil
	}
	t := pr.target(allow)
	t.Exclude = picked
	var buf [8]string
	names := pr.ms.Gateway.Spares(buf[:0], n, t)
	out := make([]string, 0, len(names))
	for _, name := range names {
		if ep := pr.ms.ByName[name]; ep != nil {
			if pe, ok := pr.tab.eps[ep.Base]; ok {
				out = append(out, pe.ep)
			}
		}
	}
	return out
}

// describeDecision is HeaderDecision's value for decision d of a request
// of ms keyed with fallback (see exactKey): its kind and prefix match, and
// on the exact index which key matched. The HTTP gateway and the picker
// both report decisions with it.
func describeDecision(ms *fleet.Model, fallback int, d *gateway.Decision) string {
	s := d.Kind.String() + "; matched=" + strconv.Itoa(d.Matched) + "/" + strconv.Itoa(d.Blocks)
	if ms.ExactBlockSize == 0 {
		return s
	}
	if fallback >= 0 {
		return s + "; index=exact; fallback=" + fleet.FallbackNames[fallback]
	}
	return s + "; index=exact"
}

// decisionHeaders are the response headers that report a pick's decision
// to the client as the HTTP gateway reports its own (HeaderReplica,
// HeaderDecision).
func (pr *pickRequest) decisionHeaders(d *gateway.Decision) []picker.Header {
	return []picker.Header{{Name: HeaderReplica, Value: d.Replica}, {Name: HeaderDecision, Value: describeDecision(pr.ms, pr.fallback, d)}}
}

// track counts a decision and returns the Tracker of its request.
func (pr *pickRequest) track(d gateway.Decision, ep *fleet.Endpoint, endpoint string) *pickTracker {
	s, ms := pr.p.s, pr.ms
	s.countDecision(ms, &d)
	mmOf(ms).replicaReqsC(s.metrics, ms.Name, d.Replica).Inc()
	s.metrics.inFlight.Inc()
	t := pr.p.pool.Get().(*pickTracker)
	*t = pickTracker{p: pr.p, ms: ms, kind: pr.kind, start: pr.start, d: d, ep: ep, endpoint: endpoint, tab: pr.tab}
	return t
}

// models answers GET /v1/models with the HTTP gateway's own handler, whose
// answer the picker sends the client (picker.Pick.Reply).
func (p *Picker) models(req *picker.PickRequest) (picker.Pick, error) {
	w := &replyWriter{h: http.Header{}}
	r := &http.Request{Method: req.Method, URL: &url.URL{Path: "/v1/models"}, Header: http.Header{}, Host: req.Authority}
	p.s.serveModels(w, r)
	if w.code == 0 {
		w.code = http.StatusOK
	}
	if req.Method == http.MethodHead {
		w.body = nil
	}
	return picker.Pick{Reply: &picker.Reply{Status: w.code, ContentType: w.h.Get("Content-Type"), Body: w.body}}, nil
}

// replyWriter is an http.ResponseWriter that keeps the answer.
type replyWriter struct {
	h    http.Header
	code int
	body []byte
}

func (w *replyWriter) Header() http.Header { return w.h }
func (w *replyWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}
func (w *replyWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	w.body = append(w.body, b...)
	return len(b), nil
}

// pickTracker follows a picked request: it feeds its first token and end
// to the routing decisions, the passive health checks and the metrics, as
// the HTTP gateway's proxy does. Pooled: Done returns it.
type pickTracker struct {
	p        *Picker
	ms       *fleet.Model
	kind     endpointKind
	start    time.Time
	d        gateway.Decision
	pre      *gateway.Decision // a split request's prefill decision
	preD     gateway.Decision  // its storage
	ep       *fleet.Endpoint
	endpoint string
	tab      *pickTable
}

var _ picker.Tracker = (*pickTracker)(nil)

// codeStreamEnded is the outcome code of a picked request whose ext_proc
// stream ended before its response did: the client went away, or the data
// plane reset the request (the picker cannot tell which).
const codeStreamEnded = "stream_ended"

// FirstToken implements picker.Tracker.
func (t *pickTracker) FirstToken() {
	s := t.p.s
	t.d.FirstToken()
	mmOf(t.ms).ttfbO(s.metrics, t.ms.Name, t.kind).Observe(s.opts.Clock().Sub(t.start).Seconds())
}

// Done implements picker.Tracker.
func (t *pickTracker) Done(o picker.Outcome) {
	s := t.p.s
	// Passive health: a 5xx counts against the engine that answered, as
	// in the HTTP gateway; a fallback that served means the endpoint
	// picked failed first.
	served := t.ep
	if o.Served != "" && o.Served != t.endpoint {
		if t.ep != nil {
			s.Observe(t.ep, t.ep.Health.Failure(false))
		}
		served = t.tab.byEP[o.Served]
	}
	if served != nil && o.Status > 0 {
		if o.Status >= 500 {
			s.Observe(served, served.Health.Failure(false))
		} else {
			s.Observe(served, served.Health.Success(false))
		}
	}
	code := strconv.Itoa(o.Status)
	switch {
	case o.Err != nil && o.Status < 500:
		code = codeStreamEnded
		t.d.Done(gateway.DoneInfo{Err: o.Err})
	case o.Err != nil:
		t.d.Done(gateway.DoneInfo{Err: o.Err})
	default:
		t.d.Done(gateway.DoneInfo{Latency: o.Latency})
	}
	if t.pre != nil {
		// The sidecar ran the prefill; the picker cannot tell when it
		// ended, so its decision is released with the request, as the
		// HTTP gateway's sidecar mode releases it.
		t.pre.Done(gateway.DoneInfo{})
	}
	mm := mmOf(t.ms)
	mm.requestsC(s.metrics, t.ms.Name, t.kind, code).Inc()
	mm.durationO(s.metrics, t.ms.Name, t.kind).Observe(s.opts.Clock().Sub(t.start).Seconds())
	s.metrics.inFlight.Dec()
	p := t.p
	*t = pickTracker{}
	p.pool.Put(t)
}

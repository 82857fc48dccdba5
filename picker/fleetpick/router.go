package fleetpick

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/flow"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/keys"
	"github.com/examlops/gateway/picker"
	"github.com/prometheus/client_golang/prometheus"
)

// ErrInvalidOptions is returned by New for Options it cannot use.
var ErrInvalidOptions = errors.New("fleetpick: invalid options")

// Options configures a Router. The zero value is usable: every zero field
// takes the default named in its comment.
type Options struct {
	// Fallbacks is how many fallback endpoints each pick offers
	// (picker.Pick.Fallbacks): other healthy replicas of the model within
	// the subset hint, as the library ranks them (gateway.Spares). The
	// picker server sends them only up to its own
	// picker.Options.MaxFallbacks. Default 0.
	Fallbacks int
	// Admission sheds a model's requests with 429 when no eligible
	// replica has room (gateway.Admission, the library's rule, as the
	// HTTP gateway's Options.Admission). The zero value sheds nothing.
	// When a threshold is set and Staleness is 0, load older than three
	// of the fleet's scrape intervals counts as no room (unless every
	// replica's is: admission then fails open).
	Admission gateway.Admission
	// ShedAbove, when positive, is Admission's Outstanding threshold: a
	// request is declined with 429 when every healthy replica of its
	// model within the subset hint has at least this many requests
	// outstanding (gateway.Candidate.Outstanding). Default 0: Admission's.
	ShedAbove int
	// TokenizeTimeout bounds one request's tokenization on the exact
	// index; a request whose tokenization fails or times out is routed as
	// if nothing were cached. Default 2s (as httpgw's).
	TokenizeTimeout time.Duration
	// Registerer receives the request metrics (exa_gateway_*, as the HTTP
	// gateway's; docs/metrics.md); default a fresh registry.
	Registerer prometheus.Registerer
	// Flow, when Enabled, holds a model's requests past capacity (the
	// ext_proc stream waits) in a queue by priority and fairness instead
	// of declining them, and picks each endpoint when its turn comes (as
	// the HTTP gateway's Options.Flow; package flow). Admission says when
	// a replica has room. The zero value is off.
	Flow flow.Options
	// Objectives are the chat, completions and responses requests'
	// latency objectives (as the HTTP gateway's Options.Objectives): the
	// per-model defaults, which the request headers x-slo-ttft-ms and
	// x-slo-tpot-ms replace, and what to do when no replica is predicted
	// to meet one (best effort, or 429 slo_unattainable). The zero value
	// sets none and routes best effort.
	Objectives front.Objectives
	// RateLimit limits each client's request rate, as the HTTP gateway's
	// Options.RateLimit (the same decision, flow.RateLimiter): a request
	// to a model endpoint (all but GET /v1/models) whose client is over
	// it gets 429 rate_limited with Retry-After once its headers arrive,
	// before its body is read (picker.HeadChecker). Clients are told apart
	// by RateLimit.Key: header:NAME, or ip, Envoy's source.address
	// request attribute (PickRequest.ClientAddress) when sent, else the
	// address Envoy appends last to X-Forwarded-For (with
	// use_remote_address); requests with neither share one rate, as one
	// client. The zero value limits nothing.
	RateLimit flow.RateLimit
	// Logger: default slog.Default(). Clock, the time source of latency
	// measurements: default time.Now.
	Logger *slog.Logger
	Clock  func() time.Time
}

// Attach is the fleet.Options.Attach hook that caches each model's metric
// series for the Router (as httpgw's Server does for itself); with a
// fleet built without it, each series is looked up per request.
var Attach = front.Attach

// Router is a picker.Router over a fleet's models: a request is parsed
// and keyed as the HTTP gateway parses and keys it, resolved to its model
// (or a LoRA adapter of one, routed over the replicas serving it, its key
// salted), routed by the model's gateway within the subset hint
// (gateway.Target), and answered with the chosen engine's "ip:port".
// Create one with New; it is safe for concurrent use, and follows the
// fleet's reloads.
//
// The OpenAI Responses API (POST /v1/responses) is routed as chat is, by
// its instructions and input. A request continuing a stored response
// (previous_response_id) goes to the replica that stored it, as in the
// HTTP gateway: the Router learns each answer's response id from the head
// of its body (its Tracker is a picker.HeadTracker; at most
// picker.MaxResponseHead bytes are read, only of a 200 answer) into one
// table (front.ResponseIDs: the 65,536 most recent ids, 12.1 MiB
// measured), and pins the continuation there by the library's decision
// (gateway.Target.Allow naming that replica alone), with no fallbacks.
// As from the HTTP gateway, a continuation whose replica is not eligible
// (unhealthy, outside the subset hint) gets 503 naming the replica and the
// response; one whose id the Router never saw (another picker replica's,
// or forgotten) is routed by its key, and the engine chosen answers 404
// for a response it does not hold. A disaggregated model decodes a Responses
// API request co-located, in either P/D mode, as the HTTP gateway does.
//
// Requests about a stored response (GET and DELETE /v1/responses/{id},
// POST .../cancel, GET .../input_items) go to the replica that stored it
// (front.RouteStored), with no fallbacks; an unknown id gets 404 naming
// it. /v1/embeddings, /tokenize and /detokenize are routed by load
// alone (gateway.Target.NoPrompt), as the HTTP gateway passes them
// through; their body must name its model.
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
// (the sidecar's address) and, when the plan splits the request, sets
// x-prefiller-host-port to the prefill replica for the sidecar; otherwise
// it removes a client's x-prefiller-host-port. In gateway mode the HTTP
// gateway runs the prefill request itself, which a picker cannot: such a
// model is answered with 500 naming the setting to change.
type Router struct {
	fl      *fleet.Fleet
	opts    Options
	metrics *front.Metrics
	keyer   *front.Keyer
	table   atomic.Pointer[table]
	mu      sync.Mutex // serialises table builds
	pool    sync.Pool  // *tracker
	// respIDs remembers which replica stored each recent Responses API
	// response (front.ResponseIDs, bounded), learned from the head of
	// each answer (tracker.ResponseHead).
	respIDs front.ResponseIDs
	flow    *front.FlowControl // nil when Options.Flow is off
	rate    *flow.RateLimiter  // nil when Options.RateLimit is off
	// afterFunc starts the timer that releases a non-streamed request's
	// predicted prefill (tracker): time.AfterFunc, replaced by tests.
	afterFunc func(time.Duration, func()) (stop func() bool)
}

var (
	_ picker.Router      = (*Router)(nil)
	_ picker.HeadChecker = (*Router)(nil)
)

// New returns a Router over fl's models, its metrics registered on
// Options.Registerer.
func New(fl *fleet.Fleet, opts Options) (*Router, error) {
	if fl == nil {
		return nil, fmt.Errorf("%w: nil fleet", ErrInvalidOptions)
	}
	if opts.Fallbacks < 0 {
		return nil, fmt.Errorf("%w: Fallbacks %d is negative", ErrInvalidOptions, opts.Fallbacks)
	}
	if opts.ShedAbove < 0 {
		return nil, fmt.Errorf("%w: ShedAbove %d is negative", ErrInvalidOptions, opts.ShedAbove)
	}
	if opts.TokenizeTimeout < 0 {
		return nil, fmt.Errorf("%w: TokenizeTimeout %v is negative", ErrInvalidOptions, opts.TokenizeTimeout)
	}
	if err := opts.Objectives.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	fo := fl.Options()
	if err := front.FillAdmission(&opts.Admission, fo.ScrapeInterval); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	if opts.ShedAbove > 0 {
		opts.Admission.Outstanding = opts.ShedAbove
	}
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	r := &Router{fl: fl, opts: opts,
		afterFunc: func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }}
	var err error
	if r.metrics, err = front.NewMetrics(opts.Registerer); err != nil {
		return nil, fmt.Errorf("%w: register metrics: %w", ErrInvalidOptions, err)
	}
	if r.rate, err = front.NewRateLimiter(opts.RateLimit, opts.Registerer); err != nil {
		return nil, fmt.Errorf("%w: RateLimit: %w", ErrInvalidOptions, err)
	}
	r.keyer, err = front.NewKeyer(front.KeyerOptions{Fleet: fl, Metrics: r.metrics, BlockSize: fo.BlockSize,
		TokenizeTimeout: opts.TokenizeTimeout, Clock: opts.Clock, Logger: opts.Logger})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	if r.flow, err = front.NewFlowControl(opts.Flow, opts.Clock, opts.Registerer); err != nil {
		return nil, fmt.Errorf("%w: Flow: %w", ErrInvalidOptions, err)
	}
	r.pool.New = func() any { return new(tracker) }
	r.tableOf(fl.Snapshot())
	fl.OnApply(r.metrics.DropReplicas) // removed replicas' series go
	fl.OnApply(r.flow.Retain)          // and removed models' queues
	return r, nil
}

// Pick implements picker.Router.
func (r *Router) Pick(ctx context.Context, req *picker.PickRequest) (picker.Pick, error) {
	start := req.Received
	if start.IsZero() {
		start = r.opts.Clock()
	}
	path := pathOf(req)
	kind, prompt := promptKind(path)
	switch {
	case prompt:
	case path == "/v1/models":
		return r.models(req)
	case passEndpoints[path] != "":
		return r.passThrough(req, path, start)
	default:
		if strings.HasPrefix(path, front.StoredPrefix) {
			return r.stored(req, path, start)
		}
		r.metrics.Requests.WithLabelValues("", "other", "404").Inc()
		return picker.Pick{}, &picker.StatusError{Status: http.StatusNotFound, Type: front.TypeNotFound, Code: "unknown_endpoint",
			Err: errors.New("gateway: no endpoint " + path + " (the picker routes /v1/chat/completions, /v1/completions, /v1/responses, /v1/responses/{id}, /v1/embeddings, /tokenize and /detokenize, and answers /v1/models)")}
	}
	pr := pickRequest{r: r, kind: kind, start: start, ctx: ctx, hdr: req.Header, size: int64(len(req.Body))}
	if req.Method != http.MethodPost {
		return pr.fail(http.StatusMethodNotAllowed, front.TypeInvalidRequest, "method_not_allowed", "",
			errors.New("gateway: "+path+" accepts POST only, not "+req.Method))
	}
	body := req.Body
	if body == nil {
		body = []byte{}
	}
	rq, err := front.Parse(kind, body)
	if err != nil {
		return pr.fail(http.StatusBadRequest, front.TypeInvalidRequest, "invalid_request", front.Param(err), fmt.Errorf("%w: %w", picker.ErrBadRequest, err))
	}
	st := r.fl.Snapshot()
	ms, ok := st.Models[rq.Model]
	if !ok {
		// A LoRA adapter of a configured model, or else a 404.
		if pr.lora, err = st.AdapterRoute(rq.Model); err != nil {
			return pr.fail(http.StatusNotFound, front.TypeNotFound, "model_not_found", "model", fmt.Errorf("%w: %w", picker.ErrUnknownModel, err))
		}
		ms = pr.lora.Model
	}
	pr.ms, pr.stream, pr.assemble = ms, rq.Stream, assembly(kind, rq, body)
	pr.assembled = pr.assemble != picker.AssembleNone && req.CanAssemble
	if pr.slo, err = r.opts.Objectives.For(ms.Name, sloHeaders(req.Header)); err != nil {
		return pr.fail(http.StatusBadRequest, front.TypeInvalidRequest, "invalid_header", front.Param(err), fmt.Errorf("%w: %w", picker.ErrBadRequest, err))
	}
	switch {
	case ms.NoReplicas && len(ms.MissingPools) > 0:
		return pr.fail(http.StatusServiceUnavailable, front.TypeUnavailable, "no_replicas", "model",
			fmt.Errorf("%w: %w: model %q is disaggregated but its pools %q are not defined", picker.ErrNoEndpoint, front.ErrNoReplicas, ms.Name, ms.MissingPools))
	case ms.NoReplicas && (r.flow == nil || pr.lora != nil): // with flow control it waits for a replica (hold)
		return pr.fail(http.StatusServiceUnavailable, front.TypeUnavailable, "no_replicas", "model",
			fmt.Errorf("%w: %w: model %q has no replicas configured", picker.ErrNoEndpoint, front.ErrNoReplicas, ms.Name))
	case pdGatewayMode(ms, kind):
		return pr.pdGatewayMode()
	}
	kp := r.keyer.Buffer()
	pr.key, pr.fallback = r.keyer.Key(ctx, (*kp)[:0], ms, front.Input{Kind: kind, Body: body, Req: rq,
		Session: req.Header.Get(keys.HeaderSessionID), RAG: req.Header.Get(keys.HeaderRAGContext), Adapter: pr.adapter()})
	defer func() { r.keyer.Release(kp, pr.key) }()
	pr.tab = r.tableOf(st)
	pr.sub = req.Subset
	if kind == keys.Responses {
		pr.client = clientOf(req)
		if rq.PreviousResponseID != "" {
			pr.prev = rq.PreviousResponseID
			pr.pin, _ = front.StoredOwner(st, &r.respIDs, pr.prev, ms.Name)
		}
	}
	return pr.route()
}

// pdGatewayMode reports whether a request of kind to ms is one a picker
// cannot serve: a disaggregated model in P/D mode gateway (a Responses
// API request is decoded co-located).
func pdGatewayMode(ms *fleet.Model, kind keys.Endpoint) bool {
	return ms.PD != nil && !ms.PD.Sidecar && kind != keys.Responses
}

// pdGatewayMode answers a request to a model in P/D mode gateway.
func (pr *pickRequest) pdGatewayMode() (picker.Pick, error) {
	name := pr.ms.Name
	return pr.fail(http.StatusInternalServerError, front.TypeServer, "pd_mode_gateway", "model",
		fmt.Errorf("gateway: model %q is disaggregated in P/D mode gateway, where the HTTP gateway runs the prefill request itself, which a picker cannot; serve it with `exa serve gateway`, or set its P/D mode to sidecar (exa serve routing set %s --pd-mode sidecar) with llm-d's pd-sidecar in front of each decode engine", name, name))
}

// clientOf is the address of a request's client, as the data plane saw
// it: the request attribute source.address when Envoy sends it
// (PickRequest.ClientAddress), else the last address of its last
// X-Forwarded-For header (the one Envoy appends for the peer it accepted
// the request from, with use_remote_address); "" without either.
// front.ClientOf reduces it when an id is learned.
func clientOf(req *picker.PickRequest) string {
	if req.ClientAddress != "" {
		return req.ClientAddress
	}
	xff := ""
	for _, hd := range req.Header {
		if strings.EqualFold(hd.Name, "x-forwarded-for") {
			xff = hd.Value
		}
	}
	if i := strings.LastIndexByte(xff, ','); i >= 0 {
		xff = xff[i+1:]
	}
	return strings.TrimSpace(xff) // "a, b": the list's spaces are not the address's
}

// pathOf is a request's path without its query.
func pathOf(req *picker.PickRequest) string {
	path, _, _ := strings.Cut(req.Path, "?")
	return path
}

// promptKind is the kind of the endpoint at path routed by its prompt,
// and whether path is one.
func promptKind(path string) (keys.Endpoint, bool) {
	switch path {
	case "/v1/chat/completions":
		return keys.Chat, true
	case "/v1/completions":
		return keys.Completions, true
	case "/v1/responses":
		return keys.Responses, true
	}
	return 0, false
}

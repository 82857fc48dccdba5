package httpgw

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/flow"
	"github.com/examlops/gateway/internal/apikeys"
	"github.com/examlops/gateway/internal/budget"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/internal/httpclient"
	"github.com/examlops/gateway/keys"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Defaults of Options fields left zero (the control plane's are fleet's).
const (
	DefaultMaxBodyBytes = 8 << 20
	// DefaultFirstByteTimeout bounds the wait for the first byte of a
	// streamed answer (Options.FirstByteTimeout): 30s, 1.5 times the
	// ~20s prefill of a 100k-token prompt at 5k tokens/s (a 70B-class
	// model on four H100s; an 8B model prefills it in under 10s).
	DefaultFirstByteTimeout = 30 * time.Second
	// DefaultResponseTimeout bounds a non-streamed answer as a whole
	// (Options.ResponseTimeout): 10 minutes, the OpenAI SDKs' default
	// timeout, past which the usual client has given up; it covers 12k
	// generated tokens at 20 tokens/s.
	DefaultResponseTimeout = 10 * time.Minute
	// DefaultTokenizeTimeout bounds a request's tokenization on the exact
	// index (Options.TokenizeTimeout).
	DefaultTokenizeTimeout = front.DefaultTokenizeTimeout
	// DefaultMaxAssembledBytes bounds the memory of all the answers being
	// assembled together (Options.MaxAssembledBytes): 256 MiB, as the
	// picker's buffered bodies (picker.DefaultMaxBufferedBytes); three
	// answers at the 32 MiB limit, thousands of the usual few-KiB ones.
	DefaultMaxAssembledBytes = 256 << 20
	// DefaultMaxRequestBytes bounds the memory of all the request bodies
	// in flight together (Options.MaxRequestBytes): 512 MiB, charged
	// twice a body's size: 31 bodies at the 8 MiB limit, 2,600 of 100 KB
	// (a 25k-token prompt), 65,000 of the usual 4 KiB.
	DefaultMaxRequestBytes = 512 << 20
)

// Options configures a Server. The zero value is usable: every zero field
// takes the default named in its comment.
type Options struct {
	// Admission sheds a model's requests with 429 and Retry-After when no
	// eligible replica has room (gateway.Admission, the library's rule;
	// admission.go), at the HTTP gateway and the picker alike. The zero
	// value sheds nothing. When a threshold is set and Staleness is 0,
	// load older than three scrape intervals counts as no room (unless
	// every replica's is: admission then fails open).
	Admission gateway.Admission
	// Flow, when Enabled, holds a model's requests past capacity in a
	// queue (package flow: priorities, fairness among flows, deadlines)
	// instead of shedding them, and binds each to a replica when its turn
	// comes; Admission says when a replica has room. The zero value is
	// off.
	Flow flow.Options
	// RateLimit bounds each client's requests to the model endpoints
	// (chat, completions, responses, embeddings, tokenize, detokenize,
	// stored responses) to a rate and a burst, clients told apart by IP address
	// or a header (flow.RateLimit); a request past it gets 429
	// rate_limited with Retry-After before its body is read. The zero
	// value is off.
	RateLimit flow.RateLimit
	// APIKeysFile, when set, names a file of the API keys clients must
	// present on the model endpoints and /v1/models ("Authorization:
	// Bearer KEY"; one key per line, internal/apikeys), re-read when it
	// changes; others get 401 invalid_api_key before their body is read.
	// The header is forwarded to the engine as it came. Default: no keys
	// asked for.
	APIKeysFile string
	// Fleet configures the control plane (package fleet): the
	// configuration file and its polling, probes, scrapes, discovery,
	// outlier ejection, the peer token, the exact index's tokenizer and
	// the reload hook; each zero field takes fleet's default. Its
	// BlockSize, Transport, Registerer, Logger, Clock, GatewayOptions and
	// Attach are set from this Options' own.
	Fleet fleet.Options
	// MaxBodyBytes bounds request bodies; larger ones get 413. Default
	// DefaultMaxBodyBytes (8 MiB).
	MaxBodyBytes int64
	// BlockSize is the prefix-key block size in bytes; default
	// keys.TextBlockBytes.
	BlockSize int
	// FirstByteTimeout bounds the time from sending a streamed request
	// ("stream": true) to an engine until the first byte of the answer's
	// body arrives: its time to first token (queueing and prefill); default
	// DefaultFirstByteTimeout (30s), negative means no bound. An engine
	// that misses it counts as failed, like a 5xx answer (it feeds passive
	// health), and the request is retried once on another replica if
	// nothing was sent to the client yet. Raise it for prompts that take
	// longer to prefill.
	FirstByteTimeout time.Duration
	// ResponseTimeout bounds a non-streamed request's answer as a whole,
	// on each replica tried: from sending the request to the engine until
	// the answer's last byte, whether the engine streams it to the gateway
	// (UpstreamStream) or sends it whole. An engine that runs out of it
	// counts as failed; if nothing was sent to the client yet the request
	// is retried once on another replica, else the client gets 504
	// (upstream_timeout); a relayed answer already begun is cut. Set it
	// above the longest such generation. Default DefaultResponseTimeout
	// (10 minutes), negative means no bound. It bounds the pass-through
	// and stored-response requests' answers alike (an SSE answer until its
	// head): 504 upstream_timeout, or a retry on another replica for a
	// pass-through request.
	ResponseTimeout time.Duration
	// UpstreamStream says whether a chat or completions request whose
	// client does not stream is streamed from the engine (its body gets
	// "stream": true and "stream_options": {"include_usage": true} as its
	// last members), so that the gateway learns its first token when it
	// comes, and answered with the non-streamed JSON assembled from the
	// stream (see "Non-streamed requests" in the package doc). Its wait
	// for the first token is then bounded by FirstByteTimeout, like a
	// streamed request's, and the whole answer by ResponseTimeout. The
	// assembled answer is bounded by
	// 4×MaxBodyBytes, each event of the stream by MaxBodyBytes (else 502),
	// and all of them together by MaxAssembledBytes (else 503). Default
	// UpstreamStreamDefault: on.
	UpstreamStream UpstreamStreamMode
	// MaxAssembledBytes bounds the memory held by all the answers the
	// gateway assembles at once (UpstreamStream), each charged twice the
	// memory it holds (its buffers' capacity: Go's collector, at the
	// default GOGC=100, lets the heap grow to twice what is live). A
	// request whose answer would take the sum past it gets 503
	// (assembly_over_budget) with Retry-After, before it is sent to an
	// engine or as soon as its answer outgrows the budget (the engine's
	// stream is then dropped). Default DefaultMaxAssembledBytes (256 MiB);
	// it must not be negative.
	MaxAssembledBytes int64
	// MaxRequestBytes bounds the memory held by the request bodies of all
	// the calls in flight at once (inference, pass-through and stored
	// response requests, those flow control holds included), from their
	// first byte read until the call ends: each is charged twice its
	// buffer's capacity (the body and the parsed request's copy of its
	// text), and every body the gateway makes from it by its own, before
	// it is made: one asking the engine for a stream, one naming the sole
	// model (twice: it is parsed again), a disaggregated request's
	// prefill and decode bodies. A request whose body would take the sum
	// past it gets 503 (overloaded) with Retry-After: 1 before the rest of
	// it is read, as does one whose body naming the sole model would;
	// one whose body asking for a stream would is sent as it is, and a
	// disaggregated one decodes co-located. Default DefaultMaxRequestBytes (512 MiB) or
	// 4×MaxBodyBytes if more; it must be at least 4×MaxBodyBytes, so
	// that a body of the largest size can always be read and rewritten.
	MaxRequestBytes int64
	// Transport carries requests to the engines; default an
	// internal/httpclient.Pool: keep-alive HTTP/1.1 connections, each
	// exchange done on the request's own goroutine (plain http; anything
	// else goes to a tuned http.Transport), interim 1xx answers skipped and
	// response heads bounded to 64 KiB (a larger head fails the request:
	// 502, or a retry on another replica). The e2e latency test measured
	// it 70–150 µs faster per request than http.Transport (see "Engine
	// client" in docs/gateway.md).
	Transport http.RoundTripper
	// Registerer receives the gateway's metrics; default a fresh
	// prometheus.Registry with the Go runtime and process collectors
	// (go_*, process_*), which /metrics then serves. When Registerer is
	// set, Gatherer should be too (it is what /metrics serves).
	Registerer prometheus.Registerer
	// Gatherer is what /metrics serves; default the fresh registry, or
	// prometheus.DefaultGatherer when only Registerer is given.
	Gatherer prometheus.Gatherer
	// Logger receives operational messages (ejections, reloads); default
	// slog.Default().
	Logger *slog.Logger
	// Clock is the time source for latency measurements; default time.Now.
	Clock func() time.Time
	// GatewayOptions are added to every model's gateway.New options, after
	// the ones its configuration implies.
	GatewayOptions []gateway.Option
	// CORSOrigins are the browser origins (scheme://host[:port], or "*"
	// for any) whose cross-origin requests the gateway allows: their
	// answers carry Access-Control-Allow-Origin and preflight OPTIONS
	// requests are answered (204); an engine's own Access-Control-*
	// headers are then not relayed. Nil (the default) means CORS is off:
	// the gateway adds no CORS headers, and OPTIONS gets 405.
	CORSOrigins []string
	// TokenizeTimeout bounds one request's tokenization; a request whose
	// tokenization fails or times out is routed as if nothing were cached
	// (see docs/gateway.md). Default DefaultTokenizeTimeout (2s).
	TokenizeTimeout time.Duration
	// Objectives are the chat, completions and responses requests'
	// latency objectives (objective.go): each model's default, which the
	// headers x-slo-ttft-ms and x-slo-tpot-ms replace, and what to do
	// when no replica is predicted to meet one (best effort, or 429
	// slo_unattainable). The zero value sets none and routes best effort.
	// Read-only once the Server is created.
	Objectives front.Objectives
}

// Server is the HTTP gateway: an http.Handler that serves the OpenAI
// endpoints, /metrics, /stats and /healthz, plus the background loops
// (Run) that reload the configuration and watch the engines. Create one
// with New. All methods are safe for concurrent use.
type Server struct {
	// Fleet is the control plane the Server serves from (package fleet):
	// its Apply, Reload, Run, ProbeAll, ScrapeAll, DiscoverAll and Stats
	// are the Server's.
	*fleet.Fleet

	opts    Options
	keyer   *front.Keyer // request keys (internal/front, shared with the picker)
	metrics *front.Metrics
	gather  prometheus.Gatherer
	log     *slog.Logger
	mux     *http.ServeMux

	bufPool sync.Pool
	// assembled is the MaxAssembledBytes budget the assembled answers
	// share (upstream.go).
	assembled *budget.Budget
	// bodies is the MaxRequestBytes budget the request bodies share
	// (bodies.go).
	bodies  *budget.Budget
	mem     *memReturner       // returns the memory of long answers (memreturn.go)
	respIDs front.ResponseIDs  // which replica produced each recent response (responses.go)
	flow    *front.FlowControl // nil when flow control is off (admission.go)
	rate    *flow.RateLimiter  // nil when off (ratelimit.go)
	keys    *apikeys.File      // nil when no keys are asked for (ratelimit.go)

	// afterFunc starts the first-byte timer: time.AfterFunc, replaced by tests.
	afterFunc func(time.Duration, func()) (stop func() bool)
	// newRequestID names the two requests of a disaggregated request
	// (x-request-id): newUUID, replaced by tests.
	newRequestID func() string
}

// New returns a Server. With Options.Fleet.ConfigPath set it loads the file; a
// missing file is an empty configuration (no models) that Run picks up once
// it appears, a corrupt one an error.
func New(opts Options) (*Server, error) {
	if err := fillOptions(&opts); err != nil {
		return nil, err
	}
	s := &Server{
		opts:   opts,
		log:    opts.Logger,
		gather: opts.Gatherer,

		afterFunc: func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop },

		newRequestID: newUUID,
	}
	s.bufPool.New = func() any { b := make([]byte, 32<<10); return &b }
	s.assembled = budget.New(opts.MaxAssembledBytes)
	s.bodies = budget.New(opts.MaxRequestBytes)
	s.mem = newMemReturner(s.afterFunc, opts.Clock)
	var err error
	s.Fleet, err = fleet.New(fleetOptions(opts))
	if err != nil {
		return nil, fleetError(err)
	}
	if s.metrics, err = front.NewMetrics(opts.Registerer); err != nil {
		_ = s.Fleet.Close()
		return nil, fmt.Errorf("%w: register metrics: %w", ErrInvalidOptions, err)
	}
	if s.flow, err = front.NewFlowControl(opts.Flow, opts.Clock, opts.Registerer); err != nil {
		_ = s.Fleet.Close()
		return nil, fmt.Errorf("%w: Flow: %w", ErrInvalidOptions, err)
	}
	if s.rate, err = front.NewRateLimiter(opts.RateLimit, opts.Registerer); err != nil {
		_ = s.Fleet.Close()
		return nil, fmt.Errorf("%w: RateLimit: %w", ErrInvalidOptions, err)
	}
	if s.keys, err = loadAPIKeys(opts.APIKeysFile, opts.Clock, opts.Registerer); err != nil {
		_ = s.Fleet.Close()
		return nil, fmt.Errorf("%w: APIKeysFile: %w", ErrInvalidOptions, err)
	}
	s.keyer, err = front.NewKeyer(front.KeyerOptions{Fleet: s.Fleet, Metrics: s.metrics, BlockSize: opts.BlockSize,
		TokenizeTimeout: opts.TokenizeTimeout, Clock: opts.Clock, Logger: opts.Logger})
	if err != nil { // not reached: fillOptions checked BlockSize
		_ = s.Fleet.Close()
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.serveInference(w, r, keys.Chat) })
	s.mux.HandleFunc("/v1/completions", func(w http.ResponseWriter, r *http.Request) { s.serveInference(w, r, keys.Completions) })
	s.mux.HandleFunc("/v1/responses", func(w http.ResponseWriter, r *http.Request) { s.serveInference(w, r, keys.Responses) })
	s.mux.HandleFunc(front.StoredPrefix, s.serveStored)
	for path := range passEndpoints {
		s.mux.HandleFunc(path, s.servePassThrough)
	}
	s.mux.HandleFunc("/v1/models", func(w http.ResponseWriter, r *http.Request) {
		if s.unauthorized(w, r, func(status int, typ, code, param, msg string) {
			s.metrics.Requests.WithLabelValues("", "models", strconv.Itoa(status)).Inc()
			front.WriteError(w, status, typ, code, param, msg)
		}) {
			return
		}
		front.ServeModels(w, r, s.Fleet, s.metrics)
	})
	s.mux.Handle("/stats", front.StatsHandler(s.Fleet))
	s.mux.HandleFunc("/health", s.serveHealth)
	s.mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.metrics.Requests.WithLabelValues("", "other", "404").Inc()
		front.WriteError(w, http.StatusNotFound, front.TypeNotFound, "unknown_endpoint", "",
			"gateway: no endpoint "+r.URL.Path+" (serving /v1/chat/completions, /v1/completions, /v1/responses, /v1/responses/{id}, /v1/embeddings, /tokenize, /detokenize, /v1/models, /health, /stats, /metrics, /healthz)")
	})
	s.mux.Handle("/metrics", front.MetricsHandler(s.Fleet, s.gather))
	s.Fleet.OnApply(s.metrics.DropReplicas) // removed replicas' series go
	s.Fleet.OnApply(s.flow.Retain)          // and removed models' queues
	return s, nil
}

func fillOptions(o *Options) error {
	if o.TokenizeTimeout < 0 {
		return fmt.Errorf("%w: TokenizeTimeout %v is negative", ErrInvalidOptions, o.TokenizeTimeout)
	}
	if o.TokenizeTimeout == 0 {
		o.TokenizeTimeout = DefaultTokenizeTimeout
	}
	scrape := o.Fleet.ScrapeInterval // fleet.New refuses a negative one
	if scrape <= 0 {
		scrape = fleet.DefaultScrapeInterval
	}
	if err := front.FillAdmission(&o.Admission, scrape); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	if o.BlockSize < 0 {
		return fmt.Errorf("%w: BlockSize %d is negative", ErrInvalidOptions, o.BlockSize)
	}
	if o.BlockSize == 0 {
		o.BlockSize = keys.TextBlockBytes
	}
	if o.FirstByteTimeout == 0 {
		o.FirstByteTimeout = DefaultFirstByteTimeout
	}
	if o.ResponseTimeout == 0 {
		o.ResponseTimeout = DefaultResponseTimeout
	}
	for _, origin := range o.CORSOrigins {
		if err := ValidCORSOrigin(origin); err != nil {
			return fmt.Errorf("%w: CORSOrigins: %w", ErrInvalidOptions, err)
		}
	}
	if err := o.Objectives.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	if o.UpstreamStream < UpstreamStreamDefault || o.UpstreamStream > UpstreamStreamOff {
		return fmt.Errorf("%w: UpstreamStream %d is not a mode", ErrInvalidOptions, o.UpstreamStream)
	}
	if o.MaxBodyBytes < 0 {
		return fmt.Errorf("%w: MaxBodyBytes %d is negative", ErrInvalidOptions, o.MaxBodyBytes)
	}
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.MaxBodyBytes > 1<<40 {
		return fmt.Errorf("%w: MaxBodyBytes %d is over 1 TiB", ErrInvalidOptions, o.MaxBodyBytes)
	}
	if o.MaxAssembledBytes < 0 {
		return fmt.Errorf("%w: MaxAssembledBytes %d is negative", ErrInvalidOptions, o.MaxAssembledBytes)
	}
	if o.MaxAssembledBytes == 0 {
		o.MaxAssembledBytes = DefaultMaxAssembledBytes
	}
	if o.MaxRequestBytes < 0 {
		return fmt.Errorf("%w: MaxRequestBytes %d is negative", ErrInvalidOptions, o.MaxRequestBytes)
	}
	if o.MaxRequestBytes == 0 {
		o.MaxRequestBytes = max(DefaultMaxRequestBytes, 4*o.MaxBodyBytes)
	}
	if o.MaxRequestBytes < 4*o.MaxBodyBytes {
		return fmt.Errorf("%w: MaxRequestBytes %d is below 4×MaxBodyBytes (%d): a body of the largest size could not be read and rewritten",
			ErrInvalidOptions, o.MaxRequestBytes, 4*o.MaxBodyBytes)
	}
	if o.Transport == nil {
		o.Transport = httpclient.New(httpclient.Options{})
	}
	switch {
	case o.Registerer == nil:
		// The gateway's own registry also carries the Go runtime's and the
		// process's metrics (go_*, process_*), as the default registry
		// does; a Registerer given is left to its owner.
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		o.Registerer = reg
		if o.Gatherer == nil {
			o.Gatherer = reg
		}
	case o.Gatherer == nil:
		o.Gatherer = prometheus.DefaultGatherer
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	return nil
}

// ServeHTTP serves /v1/chat/completions, /v1/completions, the
// pass-through /v1/embeddings, /tokenize and /detokenize, /v1/models,
// /health, /stats, /metrics and /healthz. The client's address is appended
// to X-Forwarded-For; with Options.CORSOrigins set, CORS headers are added
// and preflight requests answered.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if len(s.opts.CORSOrigins) > 0 && s.cors(w, r) {
		return
	}
	ff := appendForwardedFor(r)
	defer ff.restore(r) // also when an answer is aborted (http.ErrAbortHandler)
	s.mux.ServeHTTP(w, r)
}

// Close closes the idle connections of the default engine transport (a
// Transport given in Options is left alone) and stops listening for and
// connecting to KV events (the exact index), and answers the requests
// flow control holds with 503 (later ones are held anew). It does not stop Run (cancel
// its context for that) or requests in flight, and the Server stays usable:
// later requests dial new connections, and the next configuration applied
// subscribes to KV events again. Call it once the Server is no longer
// used, e.g. after http.Server.Shutdown, so no connection is left open.
// It returns nil.
func (s *Server) Close() error {
	s.flow.Close()
	return s.Fleet.Close()
}

// fleetOptions are the control plane's options of a Server's (filled).
func fleetOptions(o Options) fleet.Options {
	fo := o.Fleet
	fo.BlockSize, fo.Transport, fo.Registerer, fo.Logger, fo.Clock = o.BlockSize, o.Transport, o.Registerer, o.Logger, o.Clock
	fo.GatewayOptions, fo.Attach = o.GatewayOptions, front.Attach
	return fo
}

// fleetError maps the control plane's invalid options to the Server's.
func fleetError(err error) error {
	if errors.Is(err, fleet.ErrInvalidOptions) {
		return fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	return err
}

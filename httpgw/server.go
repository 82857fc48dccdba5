package httpgw

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/internal/httpclient"
	"github.com/examlops/gateway/keys"
	"github.com/examlops/gateway/kvevents"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Defaults of Options fields left zero.
const (
	DefaultReloadInterval = time.Second
	DefaultProbeInterval  = time.Second
	DefaultProbeTimeout   = time.Second
	DefaultScrapeInterval = time.Second
	DefaultEjectAfter     = 2
	DefaultReadmitAfter   = 2
	// DefaultEjectionTime is Options.EjectionTime's default: 30s, Envoy's
	// outlier detection base_ejection_time.
	DefaultEjectionTime = 30 * time.Second
	DefaultMaxBodyBytes = 8 << 20
	// DefaultFirstByteTimeout bounds the wait for the first byte of a
	// streamed answer (Options.FirstByteTimeout): 30s, 1.5 times the
	// ~20s prefill of a 100k-token prompt at 5k tokens/s (a 70B-class
	// model on four H100s; an 8B model prefills it in under 10s).
	DefaultFirstByteTimeout = 30 * time.Second
	// DefaultResponseTimeout bounds the wait for a non-streamed answer,
	// whose first byte comes when it is complete (Options.ResponseTimeout):
	// 10 minutes, the OpenAI SDKs' default timeout, past which the usual
	// client has given up; it covers 12k generated tokens at 20 tokens/s.
	DefaultResponseTimeout = 10 * time.Minute
	// DefaultTokenizeTimeout bounds a request's tokenization on the exact
	// index (Options.TokenizeTimeout).
	DefaultTokenizeTimeout = 2 * time.Second
	// DefaultDiscoverInterval is how often Run lists each engine's LoRA
	// adapters (Options.DiscoverInterval).
	DefaultDiscoverInterval = 5 * time.Second
)

// Options configures a Server. The zero value is usable: every zero field
// takes the default named in its comment.
type Options struct {
	// ConfigPath is the routing configuration file (package config's
	// format) that New loads and Run polls for changes. "" means none:
	// the embedder calls Apply instead.
	ConfigPath string
	// ReloadInterval is how often Run checks the file's modification time
	// and size; default DefaultReloadInterval (1s).
	ReloadInterval time.Duration
	// ProbeInterval is how often Run probes each engine's /health; default
	// DefaultProbeInterval (1s). ProbeTimeout bounds each probe; default
	// DefaultProbeTimeout (1s).
	ProbeInterval, ProbeTimeout time.Duration
	// ScrapeInterval is how often Run scrapes each engine's /metrics;
	// default DefaultScrapeInterval (1s).
	ScrapeInterval time.Duration
	// DiscoverInterval is how often Run fetches each engine's GET
	// /v1/models to learn the LoRA adapters it serves (DiscoverAll; the
	// first time when Run starts); default DefaultDiscoverInterval (5s).
	DiscoverInterval time.Duration
	// EjectAfter is how many consecutive failures (failed probes, 5xx
	// responses, transport errors) eject an engine; a refused connection
	// ejects at once. Default DefaultEjectAfter (2).
	EjectAfter int
	// ReadmitAfter is how many consecutive successful probes readmit an
	// ejected engine; default DefaultReadmitAfter (2).
	ReadmitAfter int
	// PeerTokenFile, when set, names a file holding the peer token (see
	// ReadPeerToken): /metrics then answers only requests carrying
	// "Authorization: Bearer <token>" (others get 401), and the peer
	// scrapes send it. Every gateway sharing pending prefill, and any
	// Prometheus scraping /metrics, needs the same token. The file is
	// re-read when it changes. Default "": /metrics is open, as before.
	PeerTokenFile string
	// EjectionTime is the back-off of an engine ejected for its answers
	// (EjectAfter consecutive 5xx or gateway errors, or one prefill
	// timeout), as Envoy's outlier detection's base_ejection_time: no
	// probe readmits it for EjectionTime times the number of times it was
	// so ejected, at most 10 times EjectionTime. Default
	// DefaultEjectionTime (30s, Envoy's default); negative, none.
	EjectionTime time.Duration
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
	// ResponseTimeout is FirstByteTimeout for non-streamed requests, whose
	// first byte comes only once the whole answer is generated: set it
	// above the longest such generation. Default DefaultResponseTimeout
	// (10 minutes), negative means no bound.
	ResponseTimeout time.Duration
	// UpstreamStream says whether a chat or completions request whose
	// client does not stream is streamed from the engine (its body gets
	// "stream": true and "stream_options": {"include_usage": true} as its
	// last members), so that the gateway learns its first token when it
	// comes, and answered with the non-streamed JSON assembled from the
	// stream (see "Non-streamed requests" in the package doc). Its wait
	// for the first token is then bounded by FirstByteTimeout, like a
	// streamed request's. The assembled answer is bounded by
	// 4×MaxBodyBytes, each event of the stream by MaxBodyBytes (else 502).
	// Default UpstreamStreamDefault: on.
	UpstreamStream UpstreamStreamMode
	// Transport carries requests to the engines; default an
	// internal/httpclient.Pool: keep-alive HTTP/1.1 connections, each
	// exchange done on the request's own goroutine (plain http; anything
	// else goes to a tuned http.Transport), interim 1xx answers skipped and
	// response heads bounded to 64 KiB (a larger head fails the request:
	// 502, or a retry on another replica). The e2e latency test measured
	// it 70–150 µs faster per request than http.Transport (see "Engine
	// client" in the package doc).
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
	// Tokenizer tokenizes the requests of models on the exact index;
	// default the engines' own POST /tokenize (kvevents.HTTPTokenizer, on
	// a healthy replica of the request's model, taken in turn) behind a
	// kvevents.CachedTokenizer. An embedder with an in-process tokenizer
	// that reproduces the engines' tokens and chat templates exactly may
	// supply it; it is used as is.
	Tokenizer kvevents.Tokenizer
	// TokenizeTimeout bounds one request's tokenization; a request whose
	// tokenization fails or times out is routed as if nothing were cached
	// (see the package doc). Default DefaultTokenizeTimeout (2s).
	TokenizeTimeout time.Duration
}

// Server is the HTTP gateway: an http.Handler that serves the OpenAI
// endpoints, /metrics, /stats and /healthz, plus the background loops
// (Run) that reload the configuration and watch the engines. Create one
// with New. All methods are safe for concurrent use.
type Server struct {
	opts    Options
	hasher  *keys.Hasher
	control *http.Client // probes and scrapes
	metrics *metrics
	gather  prometheus.Gatherer
	log     *slog.Logger
	mux     *http.ServeMux

	state atomic.Pointer[state]

	mu       sync.Mutex // serialises Apply, reloads and health transitions
	fileInfo os.FileInfo
	fileMod  time.Time
	fileSize int64
	fileSeen bool
	// fileMissing records that the file was found missing before any
	// load, and the empty configuration applied.
	fileMissing bool

	keyPool sync.Pool
	bufPool sync.Pool

	// pool is Options.Transport when it is the default connection pool
	// (which Apply, Run and Close tidy), else nil.
	pool *httpclient.Pool

	// newGateway builds a model's gateway: gateway.New, replaced by tests.
	newGateway func([]gateway.Replica, ...gateway.Option) (*gateway.Gateway, error)
	// afterFunc starts the first-byte timer: time.AfterFunc, replaced by tests.
	afterFunc func(time.Duration, func()) (stop func() bool)
	// newRequestID names the two requests of a disaggregated request
	// (x-request-id): newUUID, replaced by tests.
	newRequestID func() string

	// kv is the exact index's machinery (exact.go); tokTurn spreads
	// tokenization over a model's replicas.
	kv      *kvRuntime
	tokTurn atomic.Uint64

	// peers is what the peer gateways last reported (peers.go).
	peers peerTable
}

// state is an immutable snapshot of the configured models and engines.
type state struct {
	file      *config.File
	models    map[string]*modelState
	endpoints map[string]*endpoint // by normalised address
	kv        *kvTable             // the exact index's routing of engine events
	adapters  *adapterTable        // LoRA adapter names to their models (lora.go)
}

// modelState is one model's routing table.
type modelState struct {
	name    string
	cfg     config.Model
	mode    gateway.Mode
	gw      *gateway.Gateway // nil when the model has no replicas
	order   []string         // replica names in configuration order
	byName  map[string]*endpoint
	noReps  bool
	disaggr bool
	missing []string      // prefill/decode pools named but not defined
	mm      *modelMetrics // cached metric series; nil means look them up
	// pd, for a disaggregated model served by its two pools, holds the
	// prefill pool's gateway and the decider's settings; gw is then the
	// decode pool's gateway. Nil otherwise.
	pd *pdState
	// exactBS is the block size in tokens of a model on the exact index,
	// 0 on the approximate index; exactCnt its counters.
	exactBS  int
	exactCnt *exactCounters
}

// New returns a Server. With Options.ConfigPath set it loads the file; a
// missing file is an empty configuration (no models) that Run picks up once
// it appears, a corrupt one an error.
func New(opts Options) (*Server, error) {
	if err := fillOptions(&opts); err != nil {
		return nil, err
	}
	h, err := keys.NewHasher(opts.BlockSize)
	if err != nil {
		return nil, fmt.Errorf("%w: BlockSize: %w", ErrInvalidOptions, err)
	}
	s := &Server{
		opts:    opts,
		hasher:  h,
		control: &http.Client{Transport: opts.Transport, CheckRedirect: noRedirect, Timeout: opts.ProbeTimeout},
		log:     opts.Logger,
		gather:  opts.Gatherer,

		newGateway: gateway.New,
		afterFunc:  func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop },

		newRequestID: newUUID,
	}
	s.pool, _ = opts.Transport.(*httpclient.Pool)
	s.keyPool.New = func() any { k := make(gateway.Key, 0, 256); return &k }
	s.bufPool.New = func() any { b := make([]byte, 32<<10); return &b }
	if s.metrics, err = newMetrics(opts.Registerer); err != nil {
		return nil, fmt.Errorf("%w: register metrics: %w", ErrInvalidOptions, err)
	}
	s.kv = &kvRuntime{counters: map[string]*exactCounters{},
		opts: kvevents.Options{Logf: func(format string, args ...any) { s.log.Debug(fmt.Sprintf(format, args...)) }, Policy: kvPolicy{s: s}}}
	s.kv.tr = kvevents.NewTranslator(s.resolveKV, kvevents.Limits{})
	s.kv.tok = opts.Tokenizer
	if s.kv.tok == nil {
		client := &http.Client{Transport: opts.Transport, CheckRedirect: noRedirect}
		s.kv.tc = kvevents.NewCachedTokenizer(countingTokenizer{kvevents.NewHTTPTokenizer(client, s.tokenizeBase), s.kv}, kvevents.CacheOptions{})
		s.kv.tok = s.kv.tc
	} else {
		s.kv.tok = countingTokenizer{opts.Tokenizer, s.kv}
	}
	if err := opts.Registerer.Register(kvCollector{s}); err != nil {
		return nil, fmt.Errorf("%w: register metrics: %w", ErrInvalidOptions, err)
	}
	if err := opts.Registerer.Register(peerCollector{s}); err != nil {
		return nil, fmt.Errorf("%w: register metrics: %w", ErrInvalidOptions, err)
	}
	s.state.Store(&state{file: &config.File{Version: config.Version}, models: map[string]*modelState{}, endpoints: map[string]*endpoint{}, kv: buildKVTable(nil)})
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.serveInference(w, r, endpointChat) })
	s.mux.HandleFunc("/v1/completions", func(w http.ResponseWriter, r *http.Request) { s.serveInference(w, r, endpointCompletions) })
	s.mux.HandleFunc("/v1/models", s.serveModels)
	s.mux.HandleFunc("/stats", s.serveStats)
	s.mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.metrics.requests.WithLabelValues("", "other", "404").Inc()
		writeError(w, http.StatusNotFound, typeNotFound, "unknown_endpoint", "",
			"gateway: no endpoint "+r.URL.Path+" (serving /v1/chat/completions, /v1/completions, /v1/models, /stats, /metrics, /healthz)")
	})
	metricsHandler := promhttp.HandlerFor(s.gather, promhttp.HandlerOpts{})
	s.mux.Handle("/metrics", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.authorizeMetrics(w, r) {
			return
		}
		s.refreshGauges()
		metricsHandler.ServeHTTP(w, r)
	}))
	if opts.ConfigPath != "" {
		if _, err := s.Reload(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func fillOptions(o *Options) error {
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"ReloadInterval", &o.ReloadInterval, DefaultReloadInterval},
		{"ProbeInterval", &o.ProbeInterval, DefaultProbeInterval},
		{"ProbeTimeout", &o.ProbeTimeout, DefaultProbeTimeout},
		{"ScrapeInterval", &o.ScrapeInterval, DefaultScrapeInterval},
		{"TokenizeTimeout", &o.TokenizeTimeout, DefaultTokenizeTimeout},
		{"DiscoverInterval", &o.DiscoverInterval, DefaultDiscoverInterval},
	} {
		if *d.v < 0 {
			return fmt.Errorf("%w: %s %v is negative", ErrInvalidOptions, d.name, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	for _, d := range []struct {
		name string
		v    *int
		def  int
	}{
		{"EjectAfter", &o.EjectAfter, DefaultEjectAfter},
		{"ReadmitAfter", &o.ReadmitAfter, DefaultReadmitAfter},
		{"BlockSize", &o.BlockSize, keys.TextBlockBytes},
	} {
		if *d.v < 0 {
			return fmt.Errorf("%w: %s %d is negative", ErrInvalidOptions, d.name, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if o.EjectionTime == 0 {
		o.EjectionTime = DefaultEjectionTime
	}
	if o.FirstByteTimeout == 0 {
		o.FirstByteTimeout = DefaultFirstByteTimeout
	}
	if o.ResponseTimeout == 0 {
		o.ResponseTimeout = DefaultResponseTimeout
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

func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// ServeHTTP serves /v1/chat/completions, /v1/completions, /v1/models,
// /stats, /metrics and /healthz.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mux.ServeHTTP(w, r)
}

// Close closes the idle connections of the default engine transport (a
// Transport given in Options is left alone) and stops listening for and
// connecting to KV events (the exact index). It does not stop Run (cancel
// its context for that) or requests in flight, and the Server stays usable:
// later requests dial new connections, and the next configuration applied
// subscribes to KV events again. Call it once the Server is no longer
// used, e.g. after http.Server.Shutdown, so no connection is left open.
// It returns nil.
func (s *Server) Close() error {
	if s.pool != nil {
		s.pool.CloseIdleConnections()
	}
	s.kv.close()
	return nil
}

// refreshGauges sets the gauges computed from the routing library's
// counters, just before /metrics is gathered.
func (s *Server) refreshGauges() {
	// Under s.mu, so that a concurrent Apply cannot delete a series that
	// this then sets again from the old snapshot.
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.state.Load()
	for name, m := range st.models {
		if m.gw != nil {
			st := m.gw.Stats()
			s.metrics.hitRate.WithLabelValues(name).Set(hitRate(st.Hits, st.Routed))
		}
		if m.pd != nil {
			s.metrics.pdSplitShare.WithLabelValues(name).Set(m.pd.splitShare())
		}
	}
	for addr, ep := range st.endpoints {
		v := 0.0
		if ep.health.healthy() {
			v = 1
		}
		s.metrics.healthy.WithLabelValues(addr).Set(v)
	}
}

package fleet

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/internal/budget"
	"github.com/examlops/gateway/internal/httpclient"
	"github.com/examlops/gateway/keys"
	"github.com/examlops/gateway/kvevents"
	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of Options fields left zero.
const (
	DefaultReloadInterval = time.Second
	DefaultProbeInterval  = time.Second
	DefaultProbeTimeout   = time.Second
	DefaultScrapeInterval = time.Second
	// DefaultPeerScrapeInterval is Options.PeerScrapeInterval's default:
	// 100 ms (docs/multi-gateway.md, "The scrape interval matters").
	DefaultPeerScrapeInterval = 100 * time.Millisecond
	DefaultEjectAfter         = 2
	DefaultReadmitAfter       = 2
	// DefaultEjectionTime is Options.EjectionTime's default: 30s, Envoy's
	// outlier detection base_ejection_time.
	DefaultEjectionTime = 30 * time.Second
	// DefaultDiscoverInterval is how often Run lists each engine's LoRA
	// adapters and models (Options.DiscoverInterval).
	DefaultDiscoverInterval = 5 * time.Second
)

// ErrInvalidOptions is returned by New for Options it cannot use.
var ErrInvalidOptions = errors.New("fleet: invalid options")

// Options configures a Fleet. The zero value is usable: every zero field
// takes the default named in its comment (httpgw.Options.Fleet is one;
// `exa serve picker` builds a Fleet directly).
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
	// PeerScrapeInterval is how often Run scrapes the peer gateways
	// (config.Model.Peers) for their pending prefill, apart from the
	// engines; a peer's counts are used for 3 of these intervals after its
	// last good scrape. Default DefaultPeerScrapeInterval (100ms).
	PeerScrapeInterval time.Duration
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
	// PeerCAFile, when set, names a PEM file of the CA certificates that
	// peer scrapes over https trust, in place of the system roots (see
	// ReadPeerCA); re-read when it changes, the last good CAs kept while
	// it does not read. An https:// peer's certificate must name its
	// host; each address of a "dns+https://NAME:PORT" peer's must name
	// NAME. Default "": the system roots (and Transport's own TLS
	// settings, when it is an *http.Transport).
	PeerCAFile string
	// EjectionTime is the back-off of an engine ejected for its answers
	// (EjectAfter consecutive 5xx or gateway errors, or one prefill
	// timeout), as Envoy's outlier detection's base_ejection_time: no
	// probe readmits it for EjectionTime times the number of times it was
	// so ejected, at most 10 times EjectionTime. Default
	// DefaultEjectionTime (30s, Envoy's default); negative, none.
	EjectionTime time.Duration
	// MaxEjectionPercent caps outlier ejection, as Envoy's
	// max_ejection_percent: an ejection that would leave more than this
	// share of a model's engines, or of a disaggregated model's decode
	// pool, ejected is refused (EjectionAllowed);
	// 100 = no cap. Default DefaultMaxEjectionPercent (50); 1 to 100.
	MaxEjectionPercent int
	// Tokenizer tokenizes the requests of models on the exact index;
	// default the engines' own POST /tokenize (kvevents.HTTPTokenizer, on
	// a healthy replica of the request's model, taken in turn) behind a
	// kvevents.CachedTokenizer. An embedder with an in-process tokenizer
	// that reproduces the engines' tokens and chat templates exactly may
	// supply it; it is used as is.
	Tokenizer kvevents.Tokenizer
	// KVMaxMappedBlocks bounds the engine blocks the KV-event maps of all
	// engines hold together (kvevents.Limits.MaxMapped; each engine's own
	// is bounded by KVMapFactor × its capacity): past it the engine
	// holding the most is cleared. Default
	// kvevents.DefaultMaxMappedTotal (8,388,608); it must not be
	// negative.
	KVMaxMappedBlocks int
	// TokenizeMaxBytes bounds the memory of all the calls to engines'
	// /tokenize in flight together (their bodies, answers and token ids),
	// when Tokenizer is the default: a call past it fails at once and the
	// request is keyed without tokens (FallbackTokenize). Default
	// kvevents.DefaultTokenizeBytes (256 MiB); it must not be negative.
	TokenizeMaxBytes int64
	// OnReload, when set, is called after each load of ConfigPath (by New
	// and Run), from the loading goroutine, with the version of the file
	// read and the outcome; the CLI records it so that `exa serve routing
	// set` can tell when a running process failed to apply a change.
	OnReload func(ReloadResult)
	// BlockSize is the approximate key's block size in bytes; default
	// keys.TextBlockBytes.
	BlockSize int
	// Transport carries probes, scrapes, discovery and tokenization;
	// default a fresh internal/httpclient.Pool (closed by Close).
	Transport http.RoundTripper
	// Registerer receives the control plane's metrics; default a fresh
	// registry.
	Registerer prometheus.Registerer
	// Logger: default slog.Default(). Clock: default time.Now.
	Logger *slog.Logger
	Clock  func() time.Time
	// GatewayOptions are added to every model's gateway.New options.
	GatewayOptions []gateway.Option
	// EngineMetrics, when set, names the series (and the page) read from
	// every engine whose models name no engine type (config.EngineAuto),
	// in place of autodetection; an engine whose model names a type keeps
	// that type's names, on EngineMetrics' page. Nil: autodetection at
	// /metrics. An invalid spec is an error of New naming it.
	EngineMetrics *EngineMetrics
	// InstanceID names this process to its peers: /metrics shows it
	// (exa_gateway_instance_info), and a peer whose page shows this
	// process's own is this process, and is ignored. Default: 16 random
	// bytes in hex, drawn by New.
	InstanceID string
	// Resolver resolves the names of "dns+http://NAME:PORT" (and https) peers
	// (config.DNSPeerPrefix), at most once every ScrapeInterval. Default
	// net.DefaultResolver.
	Resolver interface {
		LookupHost(ctx context.Context, host string) ([]string, error)
	}
	// Attach, when set, is called for every model of a configuration
	// being applied, before it is published; its result is the model's
	// Front, the data plane's own per-model state (e.g. cached metric
	// series). Nil: Front is nil.
	Attach func(m *Model) any
}

// Fleet is the control plane: it applies configurations (Apply, Reload),
// probes and scrapes the engines, discovers their adapters and models,
// wires KV events to the exact index and scrapes the peer gateways (Run),
// and publishes each result as an immutable State that the data planes
// (httpgw, the endpoint picker) read with Snapshot. All methods are safe
// for concurrent use.
type Fleet struct {
	opts    Options
	control *http.Client // probes and scrapes
	metrics *metrics
	log     *slog.Logger

	state atomic.Pointer[State]

	mu sync.Mutex // serialises Apply, reloads and health transitions
	// onApply are called after each configuration is published (OnApply);
	// guarded by mu.
	onApply  []func(old, next *State)
	fileInfo os.FileInfo
	fileMod  time.Time
	fileSize int64
	fileSeen bool
	// fileDigest is the SHA-256 of the contents last read; fileRacy
	// records that they were read within racyWindow of the file's
	// modification time, so that the next Reload reads them again.
	fileDigest [32]byte
	fileRacy   bool
	// fileMissing records that the file was found missing before any
	// load, and the empty configuration applied.
	fileMissing bool

	// pool is Options.Transport when it is the default connection pool
	// (which Apply, Run and Close tidy), else nil.
	pool *httpclient.Pool

	// newGateway builds a model's gateway: gateway.New, replaced by tests.
	newGateway func([]gateway.Replica, ...gateway.Option) (*gateway.Gateway, error)
	// readConfig reads the configuration file for Reload: os.ReadFile,
	// replaced by tests.
	readConfig func(string) ([]byte, error)

	// kv is the exact index's machinery (exact.go); tokTurn spreads
	// tokenization over a model's replicas.
	kv      *kvRuntime
	tokTurn atomic.Uint64

	// peers is what the peer gateways last reported (peers.go).
	peers peerTable

	// running holds Run's context while Run runs (else nil): Apply
	// scrapes an engine it adds for its KV-cache size only then
	// (learnCapacity), so a Fleet that is not run makes no request.
	running atomic.Pointer[context.Context]
	// engines is the engine type each engine's metrics page showed
	// (engines.go).
	engines engineTable
	custom  *customNames // Options.EngineMetrics parsed; nil without
	// modelInfo is what the engines' /v1/models say of their models
	// (modelinfo.go).
	modelInfo modelInfoTable
	// scrapeBudget bounds the lines of the engines' and peers' pages
	// being parsed at once, listBudget the engines' model lists being
	// read and parsed (pagefilter.go). Apart, so that a discovery of
	// long lists never fails the load scrapes routing depends on.
	scrapeBudget, listBudget *budget.Budget
	// adapterRoom makes DiscoverAll's check of maxDiscoveredEntries and
	// its store of an engine's list one step, across calls too.
	adapterRoom sync.Mutex
}

// New returns a Fleet. With Options.ConfigPath set it loads the file; a
// missing file is an empty configuration (no models) that Run picks up
// once it appears, a corrupt one an error.
func New(opts Options) (*Fleet, error) {
	if err := fillOptions(&opts); err != nil {
		return nil, err
	}
	s := &Fleet{
		opts:         opts,
		control:      &http.Client{Transport: opts.Transport, CheckRedirect: noRedirect, Timeout: opts.ProbeTimeout},
		log:          opts.Logger,
		newGateway:   gateway.New,
		readConfig:   os.ReadFile,
		scrapeBudget: budget.New(scrapeBudgetBytes),
		listBudget:   budget.New(listBudgetBytes),
	}
	s.pool, _ = opts.Transport.(*httpclient.Pool)
	var err error
	if opts.PeerCAFile != "" {
		if err := s.loadPeerCA(); err != nil {
			return nil, fmt.Errorf("%w: PeerCAFile: %w", ErrInvalidOptions, err)
		}
	}
	if opts.EngineMetrics != nil {
		if s.custom, err = opts.EngineMetrics.compile(); err != nil {
			return nil, fmt.Errorf("%w: EngineMetrics: %w", ErrInvalidOptions, err)
		}
	}
	if s.metrics, err = newMetrics(opts.Registerer); err != nil {
		return nil, fmt.Errorf("%w: register metrics: %w", ErrInvalidOptions, err)
	}
	s.kv = &kvRuntime{counters: map[string]*ExactCounters{},
		opts: kvevents.Options{Logf: func(format string, args ...any) { s.log.Debug(fmt.Sprintf(format, args...)) }, Policy: kvPolicy{s: s}}}
	s.kv.tr = kvevents.NewTranslator(s.resolveKV, kvevents.Limits{MaxMapped: opts.KVMaxMappedBlocks})
	// Engines without kv_events_replay are cleared on a gap, as before.
	s.kv.tr.SetReplay(kvevents.ReplayOptions{Logf: s.kv.opts.Logf})
	s.kv.tok = opts.Tokenizer
	if s.kv.tok == nil {
		client := &http.Client{Transport: opts.Transport, CheckRedirect: noRedirect}
		s.kv.http = kvevents.NewHTTPTokenizer(client, s.tokenizeBase, opts.TokenizeMaxBytes)
		s.kv.tc = kvevents.NewCachedTokenizer(countingTokenizer{s.kv.http, s.kv}, kvevents.CacheOptions{})
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
	s.state.Store(&State{File: &config.File{Version: config.Version}, Models: map[string]*Model{}, Endpoints: map[string]*Endpoint{}, KV: buildKVTable(nil)})
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
		{"PeerScrapeInterval", &o.PeerScrapeInterval, DefaultPeerScrapeInterval},
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
	if o.MaxEjectionPercent == 0 {
		o.MaxEjectionPercent = DefaultMaxEjectionPercent
	}
	if o.MaxEjectionPercent < 1 || o.MaxEjectionPercent > 100 {
		return fmt.Errorf("%w: MaxEjectionPercent %d: want 1 to 100", ErrInvalidOptions, o.MaxEjectionPercent)
	}
	if o.KVMaxMappedBlocks < 0 {
		return fmt.Errorf("%w: KVMaxMappedBlocks %d is negative", ErrInvalidOptions, o.KVMaxMappedBlocks)
	}
	if o.TokenizeMaxBytes < 0 {
		return fmt.Errorf("%w: TokenizeMaxBytes %d is negative", ErrInvalidOptions, o.TokenizeMaxBytes)
	}
	if o.Transport == nil {
		o.Transport = httpclient.New(httpclient.Options{})
	}
	if o.Registerer == nil {
		o.Registerer = prometheus.NewRegistry()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.InstanceID == "" {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return fmt.Errorf("%w: InstanceID: %w", ErrInvalidOptions, err)
		}
		o.InstanceID = hex.EncodeToString(b[:])
	}
	if o.Resolver == nil {
		o.Resolver = net.DefaultResolver
	}
	return nil
}

func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// Snapshot returns the current state: immutable (but for the endpoints'
// health and load, and the counters, which are safe for concurrent use).
// A request reads one snapshot from start to end.
func (s *Fleet) Snapshot() *State { return s.state.Load() }

// Options returns the Fleet's options, defaults filled in: the data
// planes read the approximate key's BlockSize and the ScrapeInterval
// (admission's staleness) from it.
func (s *Fleet) Options() Options { return s.opts }

// Tokenizer is what tokenizes requests of models on the exact index
// (Options.Tokenizer, or the engines' /tokenize behind a cache), counted
// per model.
func (s *Fleet) Tokenizer() kvevents.Tokenizer { return s.kv.tok }

// Close closes the idle connections of the default transport (a Transport
// given in Options is left alone) and stops listening for and connecting
// to KV events. It does not stop Run; the Fleet stays usable. It returns
// nil.
func (s *Fleet) Close() error {
	if s.pool != nil {
		s.pool.CloseIdleConnections()
	}
	s.peers.tls.close()
	s.kv.close()
	return nil
}

// RefreshGauges sets the gauges computed from the engines' health, just
// before /metrics is gathered.
func (s *Fleet) RefreshGauges() {
	// Under s.mu, so that a concurrent Apply cannot delete a series that
	// this then sets again from the old snapshot.
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.state.Load()
	for addr, ep := range st.Endpoints {
		v := 0.0
		if ep.Health.Healthy() {
			v = 1
		}
		s.metrics.healthy.WithLabelValues(addr).Set(v)
	}
}

// PeerToken returns the peer bearer token that /metrics requires, or
// required false when Options.PeerTokenFile is not set. The file is
// re-read when it changes.
func (s *Fleet) PeerToken() (tok []byte, required bool, err error) {
	if s.opts.PeerTokenFile == "" {
		return nil, false, nil
	}
	tok, _, err = s.peers.token.get(s.opts.PeerTokenFile, "peer token file", ReadPeerToken, bytes.Equal)
	// Logged when it becomes unreadable and when it is read again, not at
	// every peer scrape and /metrics request (10 a second each).
	switch {
	case err != nil && s.peers.tokenFailing.CompareAndSwap(false, true):
		s.log.Warn("gateway: peer token unreadable: /metrics answers 503 and peers are scraped without it", "err", err)
	case err == nil && s.peers.tokenFailing.CompareAndSwap(true, false):
		s.log.Info("gateway: peer token readable again")
	}
	return tok, true, err
}

// metrics are the control plane's Prometheus collectors.
type metrics struct {
	ejections *prometheus.CounterVec // address, source, reason
	// ejectionsCapped: ejections refused by MaxEjectionPercent.
	ejectionsCapped *prometheus.CounterVec // source, reason
	readmissions    *prometheus.CounterVec // address
	healthy         *prometheus.GaugeVec   // address
	probeFails      *prometheus.CounterVec // address
	scrapeErrors    *prometheus.CounterVec // address
	reloads         *prometheus.CounterVec // result
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns = "exa_gateway"
	m := &metrics{
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "ejections_total",
			Help: "Times an engine address was ejected as unhealthy, by what saw it (probe, traffic) and why (timeout, refused, status, error)."},
			[]string{"address", "source", "reason"}),
		ejectionsCapped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "ejections_capped_total",
			Help: "Ejections refused because they would take more than the maximum ejection percent of a model's engines out, by source and reason."},
			[]string{"source", "reason"}),
		readmissions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "readmissions_total",
			Help: "Times an ejected engine address was readmitted."}, []string{"address"}),
		healthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "endpoint_healthy",
			Help: "1 if the engine address is in rotation, 0 if ejected."}, []string{"address"}),
		probeFails: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "probe_failures_total",
			Help: "Failed active /health probes, by engine address."}, []string{"address"}),
		scrapeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "scrape_errors_total",
			Help: "Failed /metrics scrapes, by engine address."}, []string{"address"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "config_reloads_total",
			Help: "Configuration loads, by result (ok, error)."}, []string{"result"}),
	}
	for _, c := range []prometheus.Collector{m.ejections, m.ejectionsCapped, m.readmissions, m.healthy, m.probeFails, m.scrapeErrors, m.reloads} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// ErrModelNotFound reports a request for a model (or LoRA adapter) the
// configuration does not name.
var ErrModelNotFound = errors.New("gateway: model not found")

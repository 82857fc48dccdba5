package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/httpgw"
	"github.com/examlops/gateway/keys"
	"github.com/examlops/gateway/kvevents"
	"github.com/spf13/pflag"
)

// serveFlags are the flags that `exa serve gateway` and `exa serve picker`
// share: the routing configuration, the engine probes and scrapes, the
// request limits, profiling, shutdown and logging.
type serveFlags struct {
	config                                string
	reload, probe, probeTimeout, scrape   time.Duration
	discover, tokenizeTimeout, peerScrape time.Duration
	ejectAfter, readmitAfter, blockSize   int
	maxEjectionPercent, kvMaxBlocks       int
	tokenizeMaxBytes                      int64
	maxBody                               int64
	shutdownGrace, ejectionTime           time.Duration
	pprofListen, logLevel, logFormat      string
	peerTokenFile                         string
	peerCAFile                            string
	admission                             gateway.Admission // --shed-*
	flow                                  flowFlags         // --flow-*, --objective
	// removeStatus removes the process's reload status file (see
	// reloadRecorder); set by fleetOptions, nil before.
	removeStatus func()
}

// serveHelp holds the help texts of the shared flags that each command
// words in its own terms.
type serveHelp struct{ discover, ejectAfter, shutdownGrace, pprofListen string }

// register declares the shared flags on f, with their defaults.
func (s *serveFlags) register(f *pflag.FlagSet, h serveHelp) {
	f.StringVar(&s.config, "config", "", "routing configuration file (default $EXA_CONFIG, else the user config dir's exa/routing.json)")
	f.DurationVar(&s.reload, "reload-interval", fleet.DefaultReloadInterval, "how often to check the configuration file for changes")
	f.DurationVar(&s.probe, "probe-interval", fleet.DefaultProbeInterval, "how often to probe each engine's /health")
	f.DurationVar(&s.probeTimeout, "probe-timeout", fleet.DefaultProbeTimeout, "timeout of one /health probe or /metrics scrape (a round of peer scrapes: at most --peer-scrape-interval)")
	f.DurationVar(&s.scrape, "scrape-interval", fleet.DefaultScrapeInterval, "how often to scrape each engine's /metrics")
	f.DurationVar(&s.peerScrape, "peer-scrape-interval", fleet.DefaultPeerScrapeInterval,
		"how often to scrape the peer gateways (a model's peers) for their pending prefill, apart from the engines; their counts are used for 3 of these intervals")
	f.DurationVar(&s.discover, "discover-interval", fleet.DefaultDiscoverInterval, h.discover)
	f.IntVar(&s.ejectAfter, "eject-after", fleet.DefaultEjectAfter, h.ejectAfter)
	f.DurationVar(&s.ejectionTime, "ejection-time", fleet.DefaultEjectionTime,
		"back-off of an engine ejected for its answers (--eject-after consecutive 5xx or gateway errors while /health may pass, or one prefill timeout): no probe readmits it for this long times the number of such ejections, at most 10 times it (0 = probes readmit at once)")
	f.IntVar(&s.maxEjectionPercent, "max-ejection-percent", fleet.DefaultMaxEjectionPercent,
		"most engines of a model ejected at once, in percent, rounded down (Envoy's max_ejection_percent): an ejection past it is refused and logged; below 100 one engine always stays in (100 = no cap)")
	f.IntVar(&s.readmitAfter, "readmit-after", fleet.DefaultReadmitAfter, "consecutive successful probes that readmit an ejected engine")
	f.IntVar(&s.blockSize, "block-size", keys.TextBlockBytes, "prefix-key block size in bytes")
	f.Int64Var(&s.maxBody, "max-body-bytes", httpgw.DefaultMaxBodyBytes, "largest request body accepted (larger ones get 413)")
	f.IntVar(&s.kvMaxBlocks, "kv-events-max-blocks", kvevents.DefaultMaxMappedTotal,
		"for models on the exact index, the most engine blocks the KV-event maps of all engines may hold together (each engine's is bounded by 4 × its capacity); past it the engine holding the most is cleared from the index, as for a sequence gap")
	f.Int64Var(&s.tokenizeMaxBytes, "tokenize-max-bytes", kvevents.DefaultTokenizeBytes,
		"for models on the exact index, the most bytes all calls to engines' /tokenize in flight may hold together (request bodies, answers, token ids); a call past it fails at once and its request is routed as if nothing were cached")
	f.DurationVar(&s.tokenizeTimeout, "tokenize-timeout", httpgw.DefaultTokenizeTimeout,
		"for models on the exact index, how long a request's tokenization on an engine's /tokenize may take before the request is routed as if nothing were cached")
	f.DurationVar(&s.shutdownGrace, "shutdown-grace", 10*time.Second, h.shutdownGrace)
	f.StringVar(&s.pprofListen, "pprof-listen", "", h.pprofListen)
	f.StringVar(&s.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	f.IntVar(&s.admission.QueueDepth, "shed-queue-depth", 0,
		"admission control: shed a request (429 with Retry-After) when every eligible replica of its model has this many requests waiting or more, as GIE's saturation detector (which has room while waiting ≤ its threshold: GIE's default 5 is 6 here; 0 = not checked)")
	f.Float64Var(&s.admission.KVUtilization, "shed-kv", 0, "admission control: ... or its KV cache this full (0..1; GIE's default 0.8; 0 = not checked)")
	f.IntVar(&s.admission.Outstanding, "shed-outstanding", 0, "admission control: ... or this many requests outstanding (0 = not checked)")
	f.IntVar(&s.admission.PendingPrefill, "shed-pending-prefill", 0,
		"admission control: ... or this many blocks of prefill routed there whose first token has not been seen (work, not requests: a cold prompt counts all its blocks; 0 = not checked)")
	f.DurationVar(&s.admission.Staleness, "shed-staleness", 0,
		"admission control: load older than this counts as no room, unless every replica's is (fail open); default 3 scrape intervals")
	f.StringVar(&s.peerTokenFile, "peer-token-file", "",
		"file holding the token peer gateways share (docs/multi-gateway.md): /metrics then wants Authorization: Bearer <token> (401 without), and peer scrapes send it; re-read when it changes")
	f.StringVar(&s.peerCAFile, "peer-ca", "",
		"PEM file of the CA certificates peer scrapes over https trust, in place of the system roots (an https:// peer's certificate must name its host, a dns+https://NAME:PORT peer's NAME); re-read when it changes")
	f.StringVar(&s.logFormat, "log-format", "text", "log format: text or json (one JSON object per line)")
	s.flow.register(f)
}

// validate returns a usage error naming the first invalid shared flag and
// its value, or nil.
func (s *serveFlags) validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"reload-interval", s.reload}, {"probe-interval", s.probe}, {"probe-timeout", s.probeTimeout}, {"scrape-interval", s.scrape}, {"peer-scrape-interval", s.peerScrape},
		{"tokenize-timeout", s.tokenizeTimeout}, {"discover-interval", s.discover}} {
		if d.v <= 0 {
			return usagef("invalid --%s %q: must be positive", d.name, d.v)
		}
	}
	for _, d := range []struct {
		name string
		v    int64
	}{{"eject-after", int64(s.ejectAfter)}, {"readmit-after", int64(s.readmitAfter)}, {"block-size", int64(s.blockSize)}, {"max-body-bytes", s.maxBody}, {"kv-events-max-blocks", int64(s.kvMaxBlocks)}, {"tokenize-max-bytes", s.tokenizeMaxBytes}} {
		if d.v < 1 {
			return usagef("invalid --%s %q: must be at least 1", d.name, fmt.Sprint(d.v))
		}
	}
	if s.maxEjectionPercent < 1 || s.maxEjectionPercent > 100 {
		return usagef("invalid --max-ejection-percent %q: want 1 to 100", fmt.Sprint(s.maxEjectionPercent))
	}
	if s.ejectionTime < 0 {
		return usagef("invalid --ejection-time %q: must not be negative", s.ejectionTime)
	}
	switch a := s.admission; {
	case a.QueueDepth < 0:
		return usagef("invalid --shed-queue-depth %q: must not be negative", fmt.Sprint(a.QueueDepth))
	case !(a.KVUtilization >= 0 && a.KVUtilization <= 1):
		return usagef("invalid --shed-kv %q: want 0..1", fmt.Sprint(a.KVUtilization))
	case a.Outstanding < 0:
		return usagef("invalid --shed-outstanding %q: must not be negative", fmt.Sprint(a.Outstanding))
	case a.PendingPrefill < 0:
		return usagef("invalid --shed-pending-prefill %q: must not be negative", fmt.Sprint(a.PendingPrefill))
	case a.Staleness < 0:
		return usagef("invalid --shed-staleness %q: must not be negative", a.Staleness)
	}
	if s.shutdownGrace < 0 {
		return usagef("invalid --shutdown-grace %q: must not be negative", s.shutdownGrace)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(s.logLevel)); err != nil {
		return usagef("invalid --log-level %q: want debug, info, warn or error", s.logLevel)
	}
	if s.peerTokenFile != "" {
		if _, err := fleet.ReadPeerToken(s.peerTokenFile); err != nil {
			return usagef("invalid --peer-token-file %q: %v", s.peerTokenFile, err)
		}
	}
	if s.peerCAFile != "" {
		if _, err := fleet.ReadPeerCA(s.peerCAFile); err != nil {
			return usagef("invalid --peer-ca %q: %v", s.peerCAFile, err)
		}
	}
	if s.logFormat != "text" && s.logFormat != "json" {
		return usagef("invalid --log-format %q: want text or json", s.logFormat)
	}
	if _, err := s.flow.options(); err != nil {
		return err
	}
	return nil
}

// setup resolves the configuration file's path (--config, else
// config.Path) and returns it with a logger on w at --log-level, which
// validate has accepted, in --log-format; the libraries' loggers log
// through it (routeLogs).
func (s *serveFlags) setup(w io.Writer) (path string, logger *slog.Logger, err error) {
	path = s.config
	if path == "" {
		if path, err = config.Path(); err != nil {
			return "", nil, fmt.Errorf("%w (or pass --config)", err)
		}
	}
	var level slog.Level
	_ = level.UnmarshalText([]byte(s.logLevel)) // validated
	ho := &slog.HandlerOptions{Level: level}
	logger = slog.New(slog.NewTextHandler(w, ho))
	if s.logFormat == "json" {
		logger = slog.New(slog.NewJSONHandler(w, ho))
	}
	routeLogs(logger)
	return path, logger, nil
}

// fleetOptions warns when the configuration file at path does not exist
// yet, then returns the control plane's options of the shared flags.
// command (gateway or picker) names the process in its reload status
// file, which the caller removes with s.cleanup when it exits.
func (s *serveFlags) fleetOptions(command, path string, logger *slog.Logger) fleet.Options {
	if _, err := os.Stat(path); path != "" && errors.Is(err, fs.ErrNotExist) {
		logger.Warn("configuration file does not exist yet; serving no models until it appears", "file", path)
	}
	o := fleet.Options{ConfigPath: path, ReloadInterval: s.reload, ProbeInterval: s.probe, ProbeTimeout: s.probeTimeout,
		ScrapeInterval: s.scrape, PeerScrapeInterval: s.peerScrape, DiscoverInterval: s.discover, EjectAfter: s.ejectAfter, ReadmitAfter: s.readmitAfter,
		EjectionTime: s.ejectionTime, MaxEjectionPercent: s.maxEjectionPercent, BlockSize: s.blockSize, PeerTokenFile: s.peerTokenFile, PeerCAFile: s.peerCAFile, KVMaxMappedBlocks: s.kvMaxBlocks, TokenizeMaxBytes: s.tokenizeMaxBytes, Logger: logger}
	if o.EjectionTime == 0 {
		o.EjectionTime = -1
	}
	o.OnReload, s.removeStatus = reloadRecorder(path, command, logger.Warn)
	return o
}

// newServer returns the HTTP gateway of o with the shared flags' fields
// set (see fleetOptions).
func (s *serveFlags) newServer(command, path string, logger *slog.Logger, o httpgw.Options) (*httpgw.Server, error) {
	o.Fleet = s.fleetOptions(command, path, logger)
	o.BlockSize = s.blockSize
	o.MaxBodyBytes = s.maxBody
	o.TokenizeTimeout = s.tokenizeTimeout
	o.Admission = s.admission
	o.Flow, _ = s.flow.options() // validate checked them
	o.Logger = logger
	srv, err := httpgw.New(o)
	if err != nil {
		s.cleanup()
		return nil, err
	}
	return srv, nil
}

// cleanup removes the reload status file fleetOptions started, if any.
func (s *serveFlags) cleanup() {
	if s.removeStatus != nil {
		s.removeStatus()
	}
}

// startPprof serves the Go profiles on --pprof-listen (see startPprof);
// a bad address is a usage error.
func (s *serveFlags) startPprof(logger *slog.Logger) (stop func(), err error) {
	stop, err = startPprof(s.pprofListen, logger)
	if err != nil {
		return nil, usagef("invalid --pprof-listen %q: %v", s.pprofListen, err)
	}
	return stop, nil
}

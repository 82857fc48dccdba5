package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/httpserver"
	"github.com/examlops/gateway/picker"
	"github.com/examlops/gateway/picker/fleetpick"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

func init() { serveCmd.AddCommand(newPickerCmd()) }

// pickerFlags are the flags of `exa serve picker`.
type pickerFlags struct {
	serveFlags
	listen, adminListen  string
	fallbacks, shedAbove int
	tlsFlags             // --tls-*
	rateFlags            // --rate-limit*

	requestTimeout, responseTimeout time.Duration
	maxBuffered                     int64
	upstreamStream                  bool
	maxStreams                      uint32
	maxConnAge, maxConnAgeGrace     time.Duration
	disc                            discoveryFlags
	conns                           pickerConnFlags
	gie                             gieFlags
	gieConfigIgnored                bool
	gieUnread                       []string // settings of the ignored file that change GIE's scrapes (logged)
	slo                             sloFlags // --slo-*
}

// newPickerCmd returns the `exa serve picker` command.
func newPickerCmd() *cobra.Command { return pickerCommand(&pickerFlags{}) }

// pickerCommand returns the `exa serve picker` command parsing its flags
// into fl.
func pickerCommand(fl *pickerFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "picker",
		Short: "Serve the routing to Envoy as an endpoint picker (ext_proc gRPC, Gateway API Inference Extension)",
		Long: `Serve the routing to Envoy as an endpoint picker.

It is an Envoy external processor (gRPC service envoy.service.ext_proc.v3.ExternalProcessor
over HTTP/2, with the gRPC health service) that follows the Gateway API Inference
Extension's endpoint picker protocol: Envoy sends each request's headers and body
(FULL_DUPLEX_STREAMED), the picker answers with the chosen engine's ip:port in the header
and metadata x-gateway-destination-endpoint, and Envoy sends the request there itself. The
picker routes with the same configuration, models, LoRA adapters, health checks, load scrapes,
exact index, metrics and reloads as "exa serve gateway", and reads the response phase (headers, body end)
to keep each engine's load and latency current. It routes /v1/chat/completions,
/v1/completions and /v1/responses; a Responses API conversation continued with
previous_response_id goes to the replica that stored it, as learned from the answers passing
through this picker (the head of each body), and so do GET and DELETE /v1/responses/{id},
.../cancel and .../input_items (an id the picker never saw: 404). /v1/embeddings, /tokenize
and /detokenize go to the least loaded replica. GET /v1/models is answered by the picker
from the configuration.

Envoy must reach the engines by IP: a replica whose address has a host name is never picked
(a warning is logged; with no other replica the client gets 503). Disaggregated models are
served in P/D mode sidecar only (the decode replica is picked and the prefill replica named
in x-prefiller-host-port for llm-d's pd-sidecar); a /v1/responses request is decoded
co-located, in either mode.

The gRPC server is plaintext by default. --tls-cert and --tls-key serve TLS with PEM
files, re-read every --reload-interval when they change; --tls-self-signed serves a
certificate made at start, as GIE's own picker does by default (Envoy must then skip
verification, as GIE's configurations do). Any client that reaches the port can then open
streams, make picks and add to the load booked for each engine. --tls-client-ca binds the
streams to Envoy: every connection must present a client certificate chained to one of its
CAs (and, with --tls-client-san, naming an allowed SAN), or the handshake fails. GIE's
picker (v1.5.0) has no such option.

--admin-listen serves /metrics (Prometheus), /stats (as "exa serve gateway" serves it) and
/healthz over HTTP. Envoy's configuration for both deployment modes (plain Envoy with an
ORIGINAL_DST cluster; Kubernetes, as an InferencePool's endpoint picker) is in docs/picker.md.
No real Envoy has run against it in this project's tests: they play Envoy's message sequence
from a Go client.`,
		Example: `  exa serve routing set JPCP --mode cache_aware --replica e0=http://10.0.0.7:8000 --replica e1=http://10.0.0.8:8000
  exa serve picker --listen 127.0.0.1:9002 --admin-listen 127.0.0.1:9090
  exa serve picker --listen 0.0.0.0:9002 --tls-cert /etc/exa/tls.crt --tls-key /etc/exa/tls.key
  exa serve picker --listen 0.0.0.0:9002 --tls-self-signed
  exa serve picker --listen 0.0.0.0:9002 --tls-cert /etc/exa/tls.crt --tls-key /etc/exa/tls.key \
    --tls-client-ca /etc/exa/client-ca.crt --tls-client-san spiffe://cluster.local/ns/gw/sa/envoy`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := fl.gie.apply(cmd, fl); err != nil {
				return err
			}
			if err := fl.tlsFlags.exclusive(cmd); err != nil {
				return err
			}
			return runPicker(cmd, *fl)
		},
	}
	f := cmd.Flags()
	fl.register(f, serveHelp{
		discover:      "how often to list each engine's LoRA adapters (GET /v1/models); requests naming an adapter go to the replicas serving it",
		ejectAfter:    "consecutive failures (failed probes, 5xx answers) that eject an engine",
		shutdownGrace: "on SIGINT/SIGTERM, how long to let ext_proc streams in flight finish",
		pprofListen:   "serve Go profiles (net/http/pprof, /debug/pprof/) on this address; off by default",
	})
	f.StringVar(&fl.listen, "listen", "127.0.0.1:9002", "address of the ext_proc gRPC server, host:port")
	f.StringVar(&fl.adminListen, "admin-listen", "127.0.0.1:9090", `address of the HTTP server of /metrics, /stats and /healthz, host:port ("" = none)`)
	f.IntVar(&fl.fallbacks, "max-fallbacks", 0,
		"fallback endpoints to list after the chosen one in x-gateway-destination-endpoint (ip:port,ip:port...); 0 for plain Envoy, whose ORIGINAL_DST cluster takes one address")
	f.IntVar(&fl.shedAbove, "shed-above", 0,
		"answer 429 when every eligible replica of the model has this many requests outstanding or more (0 = never shed)")
	f.DurationVar(&fl.requestTimeout, "request-timeout", picker.DefaultRequestTimeout,
		"how long a stream's request phase (headers and whole body) may take before the client gets 408 and the stream ends (0 = no limit)")
	f.DurationVar(&fl.responseTimeout, "response-timeout", picker.DefaultResponseTimeout,
		"how long a routed request may wait for its response headers before its stream ends and its load is released (0 = no limit); keep it above Envoy's route timeout")
	f.Int64Var(&fl.maxBuffered, "max-buffered-bytes", picker.DefaultMaxBufferedBytes,
		"memory all streams together may hold: 32 KiB a stream and the bodies being read; a body that would go past it gets 503, a stream RESOURCE_EXHAUSTED (at least --max-body-bytes + 32 KiB)")
	f.BoolVar(&fl.upstreamStream, "upstream-stream", true,
		"ask the engine to stream the answer of a chat or completions request whose client does not stream, and answer the client with the JSON assembled from the stream, so that the picker learns the request's first token (its prefill's end) when it comes rather than at completion, as the gateway does; only in Envoy's response body mode FULL_DUPLEX_STREAMED, and while --max-buffered-bytes has room (else the request goes as it is); --upstream-stream=false forwards such requests as they are")
	f.Uint32Var(&fl.maxStreams, "max-concurrent-streams", picker.DefaultMaxConcurrentStreams,
		"ext_proc streams (requests in flight) one gRPC connection may have open; Envoy opens more connections past it")
	f.DurationVar(&fl.maxConnAge, "max-connection-age", 0,
		"send GOAWAY to a gRPC connection this old, then close it after --max-connection-age-grace (0 = never)")
	f.DurationVar(&fl.maxConnAgeGrace, "max-connection-age-grace", 10*time.Minute,
		"after --max-connection-age, how long the connection's streams may still run before it is closed")
	fl.registerRate(f,
		"requests per second each client may send to the model endpoints on average (chat, completions, responses, embeddings, tokenize, detokenize, stored responses); one past it gets 429 rate_limited with Retry-After when its headers arrive, before its body is read (0 = no limit, the default; Envoy's local_ratelimit filter can do this in front instead)",
		"requests a client idle long enough may send at once under --rate-limit (0 = --rate-limit rounded up, at least 1)",
		"what tells clients apart for --rate-limit: ip (Envoy's source.address request attribute when its ext_proc filter sends it (request_attributes: [source.address]), else the address Envoy appends last to X-Forwarded-For, with use_remote_address; requests with neither share one rate; IPv6 by its /64) or header:NAME (that header's value, e.g. header:Authorization or header:x-gateway-inference-fairness-id; a request without it counts by address)")
	fl.registerTLS(f, tlsHelp{
		serves:     "serve TLS",
		selfSigned: "(ECDSA P-256, as GIE's picker does without --cert-path); clients must skip verification",
		client:     "every client (Envoy)",
		sanExample: "Envoy's SPIFFE ID",
	})
	fl.conns.register(f)
	fl.disc.register(f)
	fl.gie.register(f)
	fl.slo.register(f)
	return cmd
}

func runPicker(cmd *cobra.Command, fl pickerFlags) error {
	if err := fl.validate(); err != nil {
		return err
	}
	if err := fl.disc.validate(); err != nil {
		return err
	}
	if err := fl.conns.validate(); err != nil {
		return err
	}
	if fl.maxBody > 1<<30 {
		return usagef("invalid --max-body-bytes %q: at most %d (1 GiB)", fmt.Sprint(fl.maxBody), 1<<30)
	}
	for _, d := range []struct {
		name string
		v    int64
	}{{"max-fallbacks", int64(fl.fallbacks)}, {"shed-above", int64(fl.shedAbove)}, {"request-timeout", int64(fl.requestTimeout)},
		{"response-timeout", int64(fl.responseTimeout)}, {"max-connection-age", int64(fl.maxConnAge)}, {"max-connection-age-grace", int64(fl.maxConnAgeGrace)}} {
		if d.v < 0 {
			v := fmt.Sprint(d.v)
			if strings.HasSuffix(d.name, "timeout") || strings.Contains(d.name, "age") {
				v = time.Duration(d.v).String()
			}
			return usagef("invalid --%s %q: must not be negative", d.name, v)
		}
	}
	if fl.flow.on && fl.requestTimeout > 0 && fl.flow.ttl >= fl.requestTimeout {
		// The stream's request phase, the wait in the queue included, is
		// cut at --request-timeout (408): a longer wait could never end
		// with the queue's own answer.
		return usagef("invalid --flow-ttl %q: must be shorter than --request-timeout (%s), which bounds a held stream too", fl.flow.ttl, fl.requestTimeout)
	}
	objectives, err := fl.slo.options()
	if err != nil {
		return err
	}
	if fl.maxBuffered < fl.maxBody+picker.StreamBytes {
		return usagef("invalid --max-buffered-bytes %q: must be at least --max-body-bytes (%d) + %d", fmt.Sprint(fl.maxBuffered), fl.maxBody, picker.StreamBytes)
	}
	if fl.maxStreams == 0 {
		return usagef("invalid --max-concurrent-streams %q: must be at least 1", "0")
	}
	tlsSrc, err := loadTLS(cmd, fl.tlsFlags, fl.listen)
	if err != nil {
		return err
	}
	rate, err := fl.rateLimitOptions(cmd)
	if err != nil {
		return err
	}
	path, logger, err := fl.setup(cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	if tlsSrc != nil && tlsSrc.kp != nil {
		warnValidity(tlsSrc.kp.Certificate(), time.Now(), logger)
	}
	fl.logIgnored(logger)
	srvPath := path
	if fl.disc.enabled() {
		srvPath = "" // discovery reads the file and applies it with the replicas
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	fo := fl.fleetOptions("picker", srvPath, logger)
	fo.Registerer, fo.Attach, fo.EngineMetrics = reg, fleetpick.Attach, fl.gie.engineMetrics
	flt, err := fleet.New(fo)
	if err != nil {
		fl.cleanup()
		return err
	}
	defer fl.cleanup()
	defer flt.Close()
	ready := func() bool { return true }
	if fl.disc.enabled() {
		disc, stopDisc, err := fl.disc.start(path, fl.reload, flt, reg, logger)
		if err != nil {
			return err
		}
		defer stopDisc()
		ready = disc.Synced
	}
	flowOpts, _ := fl.flow.options() // validate checked them
	router, err := fleetpick.New(flt, fleetpick.Options{Fallbacks: fl.fallbacks, ShedAbove: fl.shedAbove, Admission: fl.admission, Flow: flowOpts,
		Objectives: objectives, TokenizeTimeout: fl.tokenizeTimeout, RateLimit: rate, Registerer: reg, Logger: logger})
	if err != nil {
		return err
	}
	stopObjectives, err := fl.disc.watchObjectives(fl.flow, router.SetObjectives, logger)
	if err != nil {
		return err
	}
	defer stopObjectives()
	noLimit := func(d time.Duration) time.Duration {
		if d == 0 {
			return -1
		}
		return d
	}
	pk, err := picker.New(router, picker.Options{MaxBodyBytes: int(fl.maxBody), MaxFallbacks: fl.fallbacks,
		MaxBufferedBytes: fl.maxBuffered, RequestTimeout: noLimit(fl.requestTimeout), ResponseTimeout: noLimit(fl.responseTimeout),
		DisableUpstreamStream: !fl.upstreamStream})
	if err != nil {
		return err
	}
	reg.MustRegister(pickerCollector(pk)...)
	// With --ha-enable-leader-election only the leader reports ready
	// (leaderflags.go).
	leading, stopLeader, err := fl.startLeader(reg, logger, pk.SetServing)
	if err != nil {
		return err
	}
	defer stopLeader()
	if synced := ready; fl.gie.leaderElection {
		ready = func() bool { return synced() && leading() }
	}
	handshakes := picker.NewHandshakeLog(picker.HandshakeLogOptions{Logger: logger})
	reg.MustRegister(handshakeCollector(handshakes)...)
	stopPprof, err := fl.startPprof(logger)
	if err != nil {
		return err
	}
	defer stopPprof()
	ln, err := net.Listen("tcp", fl.listen)
	if err != nil {
		return usagef("invalid --listen %q: %v", fl.listen, err)
	}
	healthAddr := "none"
	stopHealth := func() {}
	if fl.gie.grpcHealthPort > 0 {
		hln, err := net.Listen("tcp", net.JoinHostPort("", fmt.Sprint(fl.gie.grpcHealthPort)))
		if err != nil {
			ln.Close()
			return usagef("invalid --grpc-health-port %q: %v", fmt.Sprint(fl.gie.grpcHealthPort), err)
		}
		hg, down := healthPort(hln, ready)
		defer hg.Stop()
		stopHealth, healthAddr = down, hln.Addr().String()
	}
	var admin *http.Server
	var adminLn net.Listener
	if fl.adminListen != "" {
		if adminLn, err = net.Listen("tcp", fl.adminListen); err != nil {
			ln.Close()
			return usagef("invalid --admin-listen %q: %v", fl.adminListen, err)
		}
		admin = &http.Server{Handler: fleetpick.Admin(flt, reg), ReadHeaderTimeout: httpserver.DefaultReadHeaderTimeout,
			ReadTimeout: httpserver.DefaultReadTimeout, IdleTimeout: httpserver.DefaultIdleTimeout,
			ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	}
	// A request body arrives in Envoy's chunks, but allow a message as
	// large as the largest body accepted, plus framing.
	gopts := append(picker.GRPCOptions(fl.conns.limits(picker.GRPCLimits{MaxConcurrentStreams: fl.maxStreams,
		MaxConnectionAge: fl.maxConnAge, MaxConnectionAgeGrace: fl.maxConnAgeGrace})),
		grpc.MaxRecvMsgSize(max(4<<20, int(fl.maxBody)+1<<20)))
	if ic := logStreams(logger); ic != nil {
		gopts = append(gopts, grpc.StreamInterceptor(ic))
	}
	security := "plaintext"
	if tlsSrc != nil {
		gopts = append(gopts, grpc.Creds(handshakes.Credentials(credentials.NewTLS(tlsSrc.config()))))
		security = tlsSrc.describe()
	}
	g := grpc.NewServer(gopts...)
	pk.Register(g)
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	runCtx, cancelRun := context.WithCancel(context.Background())
	defer cancelRun()
	go func() { _ = flt.Run(runCtx) }()
	startMemoryGovernor(runCtx, fl.maxBuffered, pk)
	defer tlsSrc.watch(runCtx, fl.reload, logger)()
	serveErr := make(chan error, 2)
	lim := fl.conns.listen(ln, reg)
	go func() { serveErr <- g.Serve(lim) }()
	adminURL := "none"
	if admin != nil {
		go func() {
			if err := admin.Serve(adminLn); !errors.Is(err, http.ErrServerClosed) {
				serveErr <- fmt.Errorf("admin: %w", err)
			}
		}()
		adminURL = "http://" + adminLn.Addr().String()
	}
	js := fl.logFormat == "json"
	announce(cmd.OutOrStdout(), js, fmt.Sprintf("exa: picker listening on %s (ext_proc gRPC, %s), admin %s (config %s, %d models)",
		ln.Addr(), security, adminURL, path, len(flt.Stats().Models)),
		"address", ln.Addr().String(), "security", security, "admin", adminURL, "config", path, "models", len(flt.Stats().Models))
	if fl.disc.enabled() {
		announce(cmd.OutOrStdout(), js, fmt.Sprintf("exa: picker discovering replicas (pool %q, service %q, selector %q, namespace %q), gRPC health on %s",
			fl.disc.poolName, fl.disc.service, fl.gie.endpointSelector, fl.disc.namespace(), healthAddr),
			"pool", fl.disc.poolName, "service", fl.disc.service, "selector", fl.gie.endpointSelector, "namespace", fl.disc.namespace(), "health", healthAddr)
	} else if healthAddr != "none" {
		announce(cmd.OutOrStdout(), js, "exa: picker gRPC health on "+healthAddr, "health", healthAddr)
	}
	select {
	case err := <-serveErr:
		g.Stop()
		return fmt.Errorf("picker: serve: %w", err)
	case <-ctx.Done():
	}
	logger.Info("shutting down", "grace", fl.shutdownGrace)
	stopLeader() // releases the Lease: another replica takes over
	pk.SetServing(false)
	stopHealth()
	done := make(chan struct{})
	go func() { g.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(fl.shutdownGrace):
		g.Stop()
	}
	if admin != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = admin.Shutdown(sctx)
	}
	return nil
}

// pickerCollector exports pk's Stats: the streams open, the body memory
// they hold, and what the bounds refused.
func pickerCollector(pk *picker.Server) []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "exa_picker_streams",
			Help: "ext_proc streams being served."}, func() float64 { return float64(pk.Stats().Streams) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "exa_picker_reserved_bytes",
			Help: "Memory the streams hold by the picker's account, 32 KiB a stream and their bodies (at most --max-buffered-bytes)."}, func() float64 { return float64(pk.Stats().ReservedBytes) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "exa_picker_buffered_body_bytes",
			Help: "Request body buffer bytes the streams hold (part of exa_picker_reserved_bytes)."}, func() float64 { return float64(pk.Stats().BufferedBytes) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "exa_picker_request_timeouts_total",
			Help: "Streams answered 408 because their request phase outlasted --request-timeout."}, func() float64 { return float64(pk.Stats().RequestTimeouts) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "exa_picker_response_timeouts_total",
			Help: "Routed streams ended because no response headers came within --response-timeout."}, func() float64 { return float64(pk.Stats().ResponseTimeouts) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "exa_picker_overloaded_total",
			Help: "Streams refused (503, or RESOURCE_EXHAUSTED as they opened) because they would have taken the reserved bytes past --max-buffered-bytes."}, func() float64 { return float64(pk.Stats().Overloaded) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "exa_picker_assembled_bytes",
			Help: "Memory the non-streamed answers being assembled from engines' streams hold (--upstream-stream; part of exa_picker_reserved_bytes)."}, func() float64 { return float64(pk.Stats().AssembledBytes) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "exa_picker_upstream_streamed_total",
			Help: "Non-streamed chat and completions requests sent to the engine asking for a stream, their answer assembled (--upstream-stream)."}, func() float64 { return float64(pk.Stats().UpstreamStreamed) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "exa_picker_upstream_stream_skipped_total",
			Help: "Requests that could have been streamed from the engine, sent as they were because --max-buffered-bytes had no room for their answer."}, func() float64 { return float64(pk.Stats().UpstreamStreamSkipped) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "exa_picker_upstream_stream_failed_total",
			Help: "Answers streamed from the engine that could not be assembled (a malformed or cut stream, an error event, past a bound): their client's stream was ended with an error."}, func() float64 { return float64(pk.Stats().UpstreamStreamFailed) }),
	}
}

// handshakeCollector exports the TLS handshakes the gRPC server refused,
// by reason (picker.HandshakeReasons: a fixed set); zero without TLS.
func handshakeCollector(hl *picker.HandshakeLog) []prometheus.Collector {
	var cs []prometheus.Collector
	for _, r := range picker.HandshakeReasons() {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "exa_picker_tls_handshake_failures_total",
			Help:        "TLS handshakes the picker's gRPC server refused, by reason (no client certificate, unknown CA, ...; closed: before a TLS hello, as TCP probes).",
			ConstLabels: prometheus.Labels{"reason": r}}, func() float64 { return float64(hl.Failed(r)) }))
	}
	return cs
}

package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/examlops/gateway/httpgw"
	"github.com/examlops/gateway/httpgw/tracing"
	"github.com/examlops/gateway/internal/apikeys"
	"github.com/examlops/gateway/internal/httpclient"
	"github.com/examlops/gateway/internal/httpserver"
	"github.com/examlops/gateway/internal/netlimit"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
)

func init() { serveCmd.AddCommand(newGatewayCmd()) }

// gatewayFlags are the flags of `exa serve gateway`.
type gatewayFlags struct {
	serveFlags
	rateFlags
	listen                            string
	firstByteTimeout, responseTimeout time.Duration
	engineClient, httpServer          string
	corsOrigins                       []string
	otlpEndpoint                      string
	otlpInsecure                      bool
	otlpSampleRatio                   float64
	upstreamStream                    bool
	maxAssembled                      int64
	maxRequest                        int64
	maxConns, maxConnsPerClient       int
	tlsFlags                          // --tls-*
	apiKeysFile                       string
	disc                              discoveryFlags
	slo                               sloFlags // --slo-*
}

// newGatewayCmd returns the `exa serve gateway` command.
func newGatewayCmd() *cobra.Command {
	var fl gatewayFlags
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Run the OpenAI-compatible HTTP gateway that routes requests to model-server replicas",
		Long: `Run the OpenAI-compatible HTTP gateway.

It serves POST /v1/chat/completions, /v1/completions and /v1/responses, forwarding each
request to the replica that the model's routing mode picks (exa serve routing set MODEL
--mode ...), a Responses API conversation and GET/DELETE /v1/responses/{id} to the
replica that stored the response;
POST /v1/embeddings, /tokenize and /detokenize, forwarded to the least loaded replica
of the model named; GET /v1/models, /health (200 while a replica is healthy, as vLLM's),
/stats (routing statistics as JSON, read by "exa serve routing stats MODEL --gateway URL")
and /metrics (Prometheus). "model" may be left out when one model is served. The
client's address is appended to X-Forwarded-For. CORS is off unless --cors-origins.
With --otlp-endpoint each request is traced (OpenTelemetry, W3C traceparent in and on
to the engine, the routing decision as span attributes); off by default.

The models and replicas come from the routing configuration file: --config if given,
else $EXA_CONFIG if set, else the user config dir's exa/routing.json. The file is
re-read when it changes, without dropping requests. Engines are probed at /health
(ejected after --eject-after failures, readmitted after --readmit-after successes)
and their /metrics scraped for load (vLLM's num_requests_waiting, num_requests_running,
kv_cache_usage_perc, or SGLang's or TensorRT-LLM's names: exa serve routing set MODEL
--engine; by default detected from the page, with a warning when none is found). The prefix-key mapping and the /stats schema are documented in
package github.com/examlops/gateway/httpgw.

Models on the exact index (exa serve routing set MODEL --index exact) are routed on the
engines' own KV events, received over ZMQ (listening on the model's --kv-events-bind, or
connecting to each replica's --kv-events-connect), and their requests are tokenized on
an engine's /tokenize; see docs/kv-events.md.

Both front servers (--http-server) get the same limits: a request head must arrive
within 10s of its first byte and be at most 1 MiB (else 431), a whole request, body
included, within 1m (a client sending its body slowly is cut off), and a kept-alive
connection may idle 2m. The front servers do not time-bound responses (streams may run
long); --first-byte-timeout and --response-timeout bound the wait for an engine.`,
		Example: `  exa serve routing set JPCP --mode cache_aware
  exa serve gateway --listen 127.0.0.1:8080
  curl -s localhost:8080/v1/chat/completions -H 'Content-Type: application/json' \
    -d '{"model":"JPCP","messages":[{"role":"user","content":"hi"}]}'
  # Let a browser app on https://app.example call the gateway:
  exa serve gateway --cors-origins https://app.example
  # HTTPS, with a certificate re-read when it changes (cert-manager, a mounted Secret):
  exa serve gateway --listen 0.0.0.0:8443 --tls-cert /etc/exa/tls.crt --tls-key /etc/exa/tls.key`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := fl.tlsFlags.exclusive(cmd); err != nil {
				return err
			}
			return runGateway(cmd, fl)
		},
	}
	f := cmd.Flags()
	fl.register(f, serveHelp{
		discover:      "how often to list each engine's LoRA adapters (GET /v1/models); see docs/lora.md",
		ejectAfter:    "consecutive failures that eject an engine (a refused connection ejects at once)",
		shutdownGrace: "on SIGINT/SIGTERM, how long to let requests in flight finish",
		pprofListen:   "serve Go profiles (net/http/pprof, /debug/pprof/) on this address, e.g. 127.0.0.1:6060; off by default, and never on the gateway's own port",
	})
	f.StringVar(&fl.listen, "listen", "127.0.0.1:8080", "address to listen on, host:port")
	f.DurationVar(&fl.firstByteTimeout, "first-byte-timeout", httpgw.DefaultFirstByteTimeout,
		"how long an engine may take to send the first byte of a streamed answer (its first token: queueing and prefill) before it counts as failed and the request is retried on another replica (0 = no limit)")
	f.DurationVar(&fl.responseTimeout, "response-timeout", httpgw.DefaultResponseTimeout,
		"how long a non-streamed answer may take as a whole on one engine, from sending the request to its last byte (streamed from the engine and assembled, or sent whole); past it the request is retried on another replica if nothing was sent yet, else the client gets 504 (0 = no limit)")
	f.BoolVar(&fl.upstreamStream, "upstream-stream", true,
		"ask the engine to stream the answer of a chat or completions request whose client does not stream, and answer the client with the JSON assembled from the stream, so that the gateway learns the request's first token (its prefill's end) when it comes rather than at completion; --upstream-stream=false forwards such requests as they are")
	f.Int64Var(&fl.maxAssembled, "max-assembled-bytes", httpgw.DefaultMaxAssembledBytes,
		"memory all the non-streamed answers being assembled from engines' streams (--upstream-stream) may hold together, each charged twice what it holds (the Go collector's headroom); a request whose answer would go past it gets 503 with Retry-After")
	f.Int64Var(&fl.maxRequest, "max-request-bytes", 0,
		"memory the request bodies in flight may hold together, from their first byte read until the call ends (those flow control holds included), each charged twice its size and every body made from it by its own; a request whose body would go past it gets 503 overloaded with Retry-After (0 = 512 MiB, or 4 × --max-body-bytes if more; at least 4 × --max-body-bytes)")
	f.IntVar(&fl.maxConns, "max-connections", defaultGatewayMaxConns,
		"client connections the gateway keeps open at once, idle or busy; one past it is closed as it is accepted, before anything is read from it")
	f.IntVar(&fl.maxConnsPerClient, "max-connections-per-client", 0,
		"client connections the gateway keeps open from one IP address, within --max-connections; one past it is closed as it is accepted (0 = no bound per client, the default: behind a proxy or load balancer every client has its address)")
	f.StringVar(&fl.engineClient, "engine-client", "pool",
		"HTTP client to the engines: pool (keep-alive connections used on the request's goroutine, less latency per request) or std (net/http's Transport)")
	f.StringSliceVar(&fl.corsOrigins, "cors-origins", nil,
		"browser origins allowed to call the gateway cross-origin, http(s)://HOST[:PORT] or * (comma-separated or repeated); their preflight requests are answered. Off by default")
	f.StringVar(&fl.otlpEndpoint, "otlp-endpoint", "",
		"OTLP/gRPC collector (host:port, e.g. 127.0.0.1:4317) to send a trace span per request to, continuing the client's W3C traceparent, with the routing decision as attributes; off by default")
	f.BoolVar(&fl.otlpInsecure, "otlp-insecure", false, "send spans to --otlp-endpoint in plain text instead of TLS")
	f.Float64Var(&fl.otlpSampleRatio, "otlp-sample-ratio", 1, "share of requests without a sampled traceparent that are traced (0..1]")
	f.StringVar(&fl.httpServer, "http-server", "lean",
		"HTTP/1.1 front server: lean (minimal server, as strict as net/http's, less latency per request) or std (net/http's server)")
	f.StringVar(&fl.apiKeysFile, "api-keys-file", "",
		"ask clients of the model endpoints and /v1/models for an API key (Authorization: Bearer KEY) listed in this file, one per line (# comments), re-read when it changes; others get 401 invalid_api_key. /health, /stats and /metrics stay as they are. Default: no key asked for")
	fl.registerRate(f,
		"requests per second each client may send to the model endpoints on average (chat, completions, responses, embeddings, tokenize, detokenize, stored responses); one past it gets 429 rate_limited with Retry-After before its body is read (0 = no limit, the default)",
		"requests a client idle long enough may send at once under --rate-limit (0 = --rate-limit rounded up, at least 1)",
		"what tells clients apart for --rate-limit: ip (the connection's peer address, IPv6 by its /64: behind a proxy all clients share the proxy's) or header:NAME (that header's value, e.g. header:Authorization or header:x-gateway-inference-fairness-id, set by a proxy you trust; a request without it counts by address)")
	fl.registerTLS(f, tlsHelp{
		serves:     "serve HTTPS (HTTP/1.1 over TLS 1.2 or later)",
		selfSigned: "(ECDSA P-256; its SHA-256 is logged); clients must trust it or skip verification",
		client:     "every client",
		sanExample: "a SPIFFE ID",
	})
	fl.disc.register(f)
	fl.slo.register(f)
	return cmd
}

func runGateway(cmd *cobra.Command, fl gatewayFlags) error {
	if err := fl.validate(); err != nil {
		return err
	}
	if err := fl.disc.validate(); err != nil {
		return err
	}
	timeouts := map[string]*time.Duration{"first-byte-timeout": &fl.firstByteTimeout, "response-timeout": &fl.responseTimeout}
	for _, name := range []string{"first-byte-timeout", "response-timeout"} {
		v := timeouts[name]
		if *v < 0 {
			return usagef("invalid --%s %q: must not be negative (0 means no limit)", name, *v)
		}
		if *v == 0 {
			*v = -1 // httpgw: negative means no bound
		}
	}
	if fl.maxAssembled <= 0 {
		return usagef("invalid --max-assembled-bytes %q: must be positive", fmt.Sprint(fl.maxAssembled))
	}
	if fl.maxBody > 1<<40 { // httpgw's bound; also keeps 4 × it below from wrapping
		return usagef("invalid --max-body-bytes %q: at most %d (1 TiB)", fmt.Sprint(fl.maxBody), int64(1)<<40)
	}
	if fl.maxRequest < 0 || fl.maxRequest > 0 && fl.maxRequest < 4*fl.maxBody {
		return usagef("invalid --max-request-bytes %q: must be 0 (the default) or at least 4 × --max-body-bytes (%d)", fmt.Sprint(fl.maxRequest), 4*fl.maxBody)
	}
	if fl.maxConns < 1 {
		return usagef("invalid --max-connections %q: must be at least 1", fmt.Sprint(fl.maxConns))
	}
	if fl.maxConnsPerClient < 0 {
		return usagef("invalid --max-connections-per-client %q: must not be negative (0 = no bound per client)", fmt.Sprint(fl.maxConnsPerClient))
	}
	var engineClient http.RoundTripper // httpgw's default: the pool
	switch fl.engineClient {
	case "pool":
	case "std":
		engineClient = httpclient.NewTransport(0)
	default:
		return usagef("invalid --engine-client %q: want pool or std", fl.engineClient)
	}
	for _, o := range fl.corsOrigins {
		if err := httpgw.ValidCORSOrigin(o); err != nil {
			return usagef("invalid --cors-origins %q: want * or http(s)://HOST[:PORT], no path", o)
		}
	}
	if fl.httpServer != "lean" && fl.httpServer != "std" {
		return usagef("invalid --http-server %q: want lean or std", fl.httpServer)
	}
	objectives, err := fl.slo.options()
	if err != nil {
		return err
	}
	tlsSrc, err := loadTLS(cmd, fl.tlsFlags, fl.listen)
	if err != nil {
		return err
	}
	rate, err := fl.rateLimitOptions(cmd)
	if err != nil {
		return err
	}
	if cmd.Flags().Changed("api-keys-file") {
		if _, err := apikeys.Load(fl.apiKeysFile, nil); err != nil {
			return usagef("invalid --api-keys-file %q: %v", fl.apiKeysFile, err)
		}
	}
	path, logger, err := fl.setup(cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	if tlsSrc != nil && tlsSrc.kp != nil {
		warnValidity(tlsSrc.kp.Certificate(), time.Now(), logger)
	}
	upstream := httpgw.UpstreamStreamOn
	if !fl.upstreamStream {
		upstream = httpgw.UpstreamStreamOff
	}
	srvPath := path
	if fl.disc.enabled() {
		srvPath = "" // discovery reads the file and applies it with the replicas
	}
	o := httpgw.Options{
		FirstByteTimeout: fl.firstByteTimeout,
		ResponseTimeout:  fl.responseTimeout,
		Transport:        engineClient,
		CORSOrigins:      fl.corsOrigins,
		UpstreamStream:   upstream,

		RateLimit:         rate,
		APIKeysFile:       fl.apiKeysFile,
		MaxAssembledBytes: fl.maxAssembled,
		MaxRequestBytes:   fl.maxRequest,
		Objectives:        objectives,
	}
	reg := fl.disc.metrics(&o)
	metrics := reg
	if metrics == nil {
		metrics = processRegistry(&o)
	}
	srv, err := fl.newServer("gateway", srvPath, logger, o)
	if err != nil {
		return err
	}
	defer fl.cleanup()
	defer srv.Close() // idle engine connections
	if fl.disc.enabled() {
		_, stopDisc, err := fl.disc.start(path, fl.reload, srv.Fleet, reg, logger)
		if err != nil {
			return err
		}
		defer stopDisc()
	}
	stopObjectives, err := fl.disc.watchObjectives(fl.flow, srv.SetObjectives, logger)
	if err != nil {
		return err
	}
	defer stopObjectives()
	stopPprof, err := fl.startPprof(logger)
	if err != nil {
		return err
	}
	defer stopPprof()
	tcp, err := net.Listen("tcp", fl.listen)
	if err != nil {
		return usagef("invalid --listen %q: %v", fl.listen, err)
	}
	ln := netlimit.New(tcp, fl.maxConns).PerSource(fl.maxConnsPerClient)
	metrics.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "exa_gateway_connections",
			Help: "Client connections open (at most --max-connections)."}, func() float64 { return float64(ln.Open()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "exa_gateway_connections_refused_total",
			Help: "Client connections closed as they were accepted because --max-connections were open."}, func() float64 { return float64(ln.Refused()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "exa_gateway_connections_refused_per_client_total",
			Help: "Client connections closed as they were accepted because --max-connections-per-client were open from their address."}, func() float64 { return float64(ln.RefusedSources()) }))
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if !(fl.otlpSampleRatio > 0 && fl.otlpSampleRatio <= 1) { // NaN too
		ln.Close()
		return usagef("invalid --otlp-sample-ratio %v: want a share in (0, 1]", fl.otlpSampleRatio)
	}
	tp, stopTracing, err := tracing.Setup(cmd.Context(), tracing.Options{Endpoint: fl.otlpEndpoint, Insecure: fl.otlpInsecure, SampleRatio: fl.otlpSampleRatio})
	if err != nil {
		ln.Close()
		return usagef("invalid --otlp-endpoint %q: %v", fl.otlpEndpoint, err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = stopTracing(ctx)
	}()
	front, err := newFrontServer(fl.httpServer, tracing.Handler(logRequests(srv, logger), tp), logger, defaultFrontLimits)
	if err != nil {
		ln.Close()
		return err
	}
	runCtx, cancelRun := context.WithCancel(context.Background())
	defer cancelRun()
	go func() { _ = srv.Run(runCtx) }()
	var serving net.Listener = ln
	scheme, security := "http", ""
	if tlsSrc != nil {
		// The handshake is read within the front server's deadline for
		// a request head (10 s), as the first bytes of the connection.
		serving = tls.NewListener(ln, tlsSrc.httpConfig())
		scheme, security = "https", "; "+tlsSrc.describe()
		defer tlsSrc.watch(runCtx, fl.reload, logger)()
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- front.Serve(serving) }()
	announce(cmd.OutOrStdout(), fl.logFormat == "json",
		fmt.Sprintf("exa: gateway listening on %s://%s (config %s, %d models%s)", scheme, ln.Addr(), path, len(srv.Stats().Models), security),
		"address", scheme+"://"+ln.Addr().String(), "config", path, "models", len(srv.Stats().Models))
	select {
	case err := <-serveErr:
		return fmt.Errorf("gateway: serve: %w", err)
	case <-ctx.Done():
	}
	logger.Info("shutting down", "grace", fl.shutdownGrace)
	sctx, cancel := context.WithTimeout(context.Background(), fl.shutdownGrace)
	defer cancel()
	if err := front.Shutdown(sctx); err != nil {
		return fmt.Errorf("gateway: shutdown: %w", err)
	}
	return nil
}

// defaultGatewayMaxConns is the default of --max-connections: 16,384
// client connections, idle or busy, about 15 KiB of RSS each when idle
// (TestGatewayConnectionsRSS), some 240 MiB in all.
const defaultGatewayMaxConns = 16384

// frontLimits are the front server's limits, the same for both servers: a
// request head must arrive within readHeader of its first byte and be at
// most httpserver.DefaultMaxHeaderBytes (else 431), a whole request (head
// and body) within read (a client that sends its body slowly is cut off),
// and a kept-alive connection may idle for idle. Neither server bounds the
// handler or the response (an engine's stream may run for minutes).
type frontLimits struct{ readHeader, read, idle time.Duration }

// defaultFrontLimits: 10 s for a head, a minute for a whole request (the
// default 8 MiB body at 140 kB/s), two minutes idle.
var defaultFrontLimits = frontLimits{httpserver.DefaultReadHeaderTimeout, httpserver.DefaultReadTimeout, httpserver.DefaultIdleTimeout}

// frontServer is what runGateway needs of the HTTP/1.1 server.
type frontServer interface {
	Serve(net.Listener) error
	Shutdown(context.Context) error
	Close() error
}

var (
	_ frontServer = (*http.Server)(nil)
	_ frontServer = (*httpserver.Server)(nil)
)

// newFrontServer returns the HTTP/1.1 server of h: "std" is net/http's,
// "lean" internal/httpserver's.
func newFrontServer(kind string, h http.Handler, logger *slog.Logger, lim frontLimits) (frontServer, error) {
	if kind == "std" {
		return &http.Server{Handler: h, ReadHeaderTimeout: lim.readHeader, ReadTimeout: lim.read, IdleTimeout: lim.idle,
			MaxHeaderBytes: httpserver.DefaultMaxHeaderBytes, ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}, nil
	}
	return httpserver.New(h, httpserver.Options{ReadHeaderTimeout: lim.readHeader, ReadTimeout: lim.read, IdleTimeout: lim.idle,
		MaxHeaderBytes: httpserver.DefaultMaxHeaderBytes, Logger: logger})
}

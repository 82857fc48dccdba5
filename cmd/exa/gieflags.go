package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/k8s"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"sigs.k8s.io/yaml"
)

// gieFlags are GIE's endpoint-picker flags (cmd/epp v1.5.0,
// pkg/epp/server/options.go) that `exa serve picker` accepts, so the
// picker can replace GIE's in GIE's InferencePool chart. With --pool-name
// set ("GIE mode") the ports, TLS and probes default as GIE's do.
type gieFlags struct {
	grpcPort, grpcHealthPort, metricsPort int
	secureServing                         bool
	certPath, configFile                  string
	zapEncoder                            string
	// endpointSelector and endpointPorts are GIE's standalone mode
	// (applyStandalone).
	endpointSelector string
	endpointPorts    []string
	zap              gieLogFlags
	verbosity        int
	bools            map[string]*bool
	// leaderElection is --ha-enable-leader-election, with the lease
	// timings in leader (leaderflags.go).
	leaderElection bool
	leader         leaderFlags
	// metrics are the engine metric flags (gieMetricFlags); scrapePort,
	// metricsScheme and refreshMetrics are --model-server-metrics-port,
	// --model-server-metrics-scheme and --refresh-metrics-interval.
	metrics        map[string]*string
	scrapePort     int
	metricsScheme  string
	refreshMetrics time.Duration
	// metricsInsecure, refreshPool and staleness are
	// --model-server-metrics-https-insecure-skip-verify,
	// --refresh-prometheus-metrics-interval and
	// --metrics-staleness-threshold (giemetrics.go).
	metricsInsecure        bool
	refreshPool, staleness time.Duration
	// engineMetrics is what the metric flags name, nil when none is set
	// (the engines' types are then detected).
	engineMetrics *fleet.EngineMetrics
}

// GIE's defaults (v1.5.0 pkg/epp/server/options.go NewOptions).
const (
	gieGRPCPort       = 9002
	gieGRPCHealthPort = 9003
	gieMetricsPort    = 9090
)

// gieUnsupported are GIE endpoint-picker flags that have no counterpart
// here: setting one is a usage error saying why (rather than cobra's
// "unknown flag").
var gieUnsupported = map[string]string{
	"config-text": "GIE plugin configurations do not apply; routing comes from --config",
}

// gieBools are GIE's boolean flags accepted only with the value that
// matches this picker's behaviour; the other value is a usage error.
var gieBools = map[string]struct {
	ok  bool
	why string
}{
	"enable-cert-reload":             {true, "certificates in --cert-path are always re-read every --reload-interval"},
	"disable-endpoint-subset-filter": {false, "the subset filter is always honoured"},
	"health-checking":                {true, "engines are always health-checked (--probe-interval)"},
	"enable-pprof":                   {false, "use --pprof-listen to serve profiles"},
	"tracing":                        {false, "tracing is not implemented"},
	"metrics-endpoint-auth":          {false, "metrics authentication is not implemented"},
}

// register declares GIE's flags on f.
func (g *gieFlags) register(f *pflag.FlagSet) {
	f.IntVar(&g.grpcPort, "grpc-port", gieGRPCPort, "GIE: ext_proc gRPC port on all interfaces (same as --listen :PORT; the default applies with --pool-name)")
	f.IntVar(&g.grpcHealthPort, "grpc-health-port", gieGRPCHealthPort, "GIE: port of the gRPC health service (services inference-extension, liveness, readiness) on all interfaces; on with --pool-name or when set, 0 = none")
	f.IntVar(&g.metricsPort, "metrics-port", gieMetricsPort, "GIE: port of /metrics, /stats and /healthz on all interfaces (same as --admin-listen :PORT; the default applies with --pool-name)")
	f.BoolVar(&g.secureServing, "secure-serving", true, "GIE: serve ext_proc over TLS (--cert-path, else a self-signed certificate); applies with --pool-name or when set")
	f.StringVar(&g.certPath, "cert-path", "", "GIE: directory holding tls.crt and tls.key for --secure-serving (re-read every --reload-interval)")
	f.StringVar(&g.configFile, "config-file", "", "GIE: a routing configuration (as --config), or GIE's EndpointPickerConfig, whose plugins are ignored (logged)")
	f.StringVar(&g.zapEncoder, "zap-encoder", "", "GIE: log encoding, json or console (same as --log-format)")
	f.IntVarP(&g.verbosity, "v", "v", 0, "GIE: log verbosity; 4 or more logs at debug (same as --log-level debug)")
	g.zap.register(f)
	g.bools = map[string]*bool{}
	for name, b := range gieBools {
		g.bools[name] = f.Bool(name, b.ok, fmt.Sprintf("GIE flag; only %v is supported", b.ok))
		_ = f.MarkHidden(name)
	}
	for name := range gieUnsupported {
		f.String(name, "", "GIE flag, not supported")
		_ = f.MarkHidden(name)
	}
	g.registerMetrics(f)
	f.StringVar(&g.endpointSelector, "endpoint-selector", "", "GIE's standalone mode: discover the replicas from the ready pods with these labels (key=value,...), with no InferencePool; needs --endpoint-target-ports")
	f.StringSliceVar(&g.endpointPorts, "endpoint-target-ports", nil, "GIE's standalone mode: the pods' target ports (1 to 8; comma-separated or repeated), one replica each")
	f.BoolVar(&g.leaderElection, "ha-enable-leader-election", false,
		"GIE: elect one leader among the picker replicas with a Lease; only the leader reports ready (docs/kubernetes.md); needs --pool-name or --service")
	g.leader.register(f)
}

// apply translates the GIE flags set (or, in GIE mode, defaulted) into
// the picker's own flags. It returns a usage error for unsupported flags
// and conflicts.
func (g *gieFlags) apply(cmd *cobra.Command, fl *pickerFlags) error {
	f := cmd.Flags()
	for name, why := range gieUnsupported {
		if f.Changed(name) {
			return usagef("--%s (a GIE endpoint-picker flag) is not supported: %s", name, why)
		}
	}
	for name, b := range gieBools {
		if v := *g.bools[name]; v != b.ok {
			return usagef("invalid --%s %q (a GIE endpoint-picker flag): only %v is supported: %s", name, fmt.Sprint(v), b.ok, b.why)
		}
	}
	if err := g.applyMetrics(f, fl); err != nil {
		return err
	}
	if f.Changed("endpoint-selector") || f.Changed("endpoint-target-ports") {
		if err := g.applyStandalone(fl); err != nil {
			return err
		}
	}
	if g.leaderElection && !fl.disc.enabled() {
		return usagef("--ha-enable-leader-election needs --pool-name, --service or --endpoint-selector: the Lease is named after the pool")
	}
	for _, name := range []string{"leader-lease-duration", "leader-renew-deadline", "leader-retry-period"} {
		if f.Changed(name) && !g.leaderElection {
			return usagef("invalid --%s %q: needs --ha-enable-leader-election", name, f.Lookup(name).Value.String())
		}
	}
	if l := g.leader; g.leaderElection {
		if err := k8s.CheckLeaseTimes(l.lease, l.renew, l.retry); err != nil {
			return usagef("invalid --leader-lease-duration %q, --leader-renew-deadline %q, --leader-retry-period %q: want lease duration > renew deadline > 1.2 x retry period > 0",
				l.lease.String(), l.renew.String(), l.retry.String())
		}
	}
	gie := fl.disc.poolName != "" || fl.disc.selector != nil
	for _, p := range []struct {
		gieName, own string
		v            int
		dst          *string
	}{{"grpc-port", "listen", g.grpcPort, &fl.listen}, {"metrics-port", "admin-listen", g.metricsPort, &fl.adminListen}} {
		if p.v < 0 || p.v > 65535 {
			return usagef("invalid --%s %q: want a port, 0-65535", p.gieName, fmt.Sprint(p.v))
		}
		if f.Changed(p.gieName) && f.Changed(p.own) {
			return usagef("invalid --%s %q: --%s is set too; use one", p.gieName, fmt.Sprint(p.v), p.own)
		}
		if f.Changed(p.gieName) || (gie && !f.Changed(p.own)) {
			*p.dst = net.JoinHostPort("", strconv.Itoa(p.v))
		}
	}
	if g.grpcHealthPort < 0 || g.grpcHealthPort > 65535 {
		return usagef("invalid --grpc-health-port %q: want a port, 0-65535", fmt.Sprint(g.grpcHealthPort))
	}
	if !gie && !f.Changed("grpc-health-port") {
		g.grpcHealthPort = 0
	}
	tlsOwn := f.Changed("tls-cert") || f.Changed("tls-key") || f.Changed("tls-self-signed")
	if tlsOwn && (f.Changed("secure-serving") || f.Changed("cert-path")) {
		return usagef("--secure-serving/--cert-path and --tls-cert/--tls-key/--tls-self-signed cannot be used together")
	}
	if !tlsOwn && (gie || f.Changed("secure-serving") || f.Changed("cert-path")) {
		switch {
		case !g.secureServing && f.Changed("cert-path"):
			return usagef("invalid --cert-path %q: --secure-serving is false", g.certPath)
		case !g.secureServing:
		case g.certPath != "":
			fl.tlsCert, fl.tlsKey = filepath.Join(g.certPath, "tls.crt"), filepath.Join(g.certPath, "tls.key")
		default:
			fl.tlsSelfSigned = true
		}
	}
	switch g.zapEncoder {
	case "":
	case "json", "console":
		if f.Changed("log-format") {
			return usagef("invalid --zap-encoder %q: --log-format is set too; use one", g.zapEncoder)
		}
		fl.logFormat = map[string]string{"json": "json", "console": "text"}[g.zapEncoder]
	default:
		return usagef("invalid --zap-encoder %q: want json or console", g.zapEncoder)
	}
	if f.Changed("v") && !f.Changed("log-level") && g.verbosity >= 4 {
		fl.logLevel = "debug"
	}
	switch level, err := g.zap.apply(f); {
	case err != nil:
		return err
	case level != "":
		fl.logLevel = level
	}
	if g.configFile != "" {
		if f.Changed("config") {
			return usagef("invalid --config-file %q: --config is set too; use one", g.configFile)
		}
		own, data, err := routingOrGIEConfig(g.configFile)
		if err != nil {
			return err
		}
		if own {
			fl.config = g.configFile
		} else {
			fl.gieConfigIgnored = true // logged by logIgnored
			fl.gieUnread = gieUnread(data, g.engineMetrics != nil)
		}
	}
	return nil
}

// routingOrGIEConfig reports whether the file at path is a routing
// configuration (true) or GIE's EndpointPickerConfig (false), and returns
// its bytes; anything else is a usage error naming the file.
func routingOrGIEConfig(path string) (bool, []byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return false, nil, usagef("invalid --config-file %q: %v", path, err)
	}
	own, err := classifyConfig(path, data)
	return own, data, err
}

// gieUnread returns the settings of GIE's EndpointPickerConfig data that
// change what GIE's picker scrapes and that this picker, which reads the
// metric flags instead, does not: a metrics-data-source scheme or path
// other than GIE's defaults (http, /metrics) and, unless metricFlags (a
// metric flag is set), a core-metrics-extractor defaultEngine other than
// vllm (GIE's chart passes no metric flag with its latency predictor).
func gieUnread(data []byte, metricFlags bool) []string {
	var c struct {
		Plugins []struct {
			Type       string         `json:"type"`
			Parameters map[string]any `json:"parameters"`
		} `json:"plugins"`
	}
	if yaml.Unmarshal(data, &c) != nil {
		return nil
	}
	var out []string
	for _, p := range c.Plugins {
		for _, s := range []struct{ plugin, param, def string }{
			{"metrics-data-source", "scheme", "http"}, {"metrics-data-source", "path", "/metrics"},
			{"core-metrics-extractor", "defaultEngine", "vllm"},
		} {
			v, ok := p.Parameters[s.param]
			if p.Type != s.plugin || !ok || fmt.Sprint(v) == s.def || s.param == "defaultEngine" && metricFlags {
				continue
			}
			out = append(out, fmt.Sprintf("%s %s %q", s.plugin, s.param, fmt.Sprint(v)))
		}
	}
	return out
}

// classifyConfig is routingOrGIEConfig on the file's bytes. GIE reads the
// file as YAML, so its configuration may be JSON too: a JSON object of
// kind EndpointPickerConfig is GIE's.
func classifyConfig(path string, data []byte) (bool, error) {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if t := bytes.TrimSpace(data); len(t) > 0 && t[0] == '{' && json.Valid(t) {
		if json.Unmarshal(t, &head) == nil && head.Kind == "EndpointPickerConfig" {
			return false, nil
		}
		if _, err := config.Decode(path, data); err != nil {
			return false, err
		}
		return true, nil
	}
	if err := yaml.Unmarshal(data, &head); err != nil || head.Kind != "EndpointPickerConfig" {
		return false, usagef("invalid --config-file %q: neither a routing configuration (JSON) nor GIE's EndpointPickerConfig (kind %q)", path, head.Kind)
	}
	return false, nil
}

// healthServices are the gRPC health services the health port answers:
// GIE's chart probes inference-extension (one replica) or liveness and
// readiness; "" and the ext_proc service are the overall status.
var healthServices = []string{"", "inference-extension", "liveness", "readiness", extprocv3.ExternalProcessor_ServiceDesc.ServiceName}

// healthPort serves grpc.health.v1.Health on ln (plaintext, as the kubelet
// probes it): liveness SERVING at once, the others once ready() reports
// true, polled on every check. It returns the server to stop and a
// function marking every service NOT_SERVING (at shutdown).
func healthPort(ln net.Listener, ready func() bool) (*grpc.Server, func()) {
	hs := &readyHealth{Server: health.NewServer(), ready: ready}
	hs.Server.SetServingStatus("liveness", healthpb.HealthCheckResponse_SERVING)
	g := grpc.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	go func() { _ = g.Serve(ln) }()
	return g, func() { hs.down.Store(true); hs.Server.Shutdown() }
}

// readyHealth answers the readiness services by ready() and otherwise as
// the wrapped health server.
type readyHealth struct {
	*health.Server
	ready func() bool
	down  atomic.Bool
}

// Check answers SERVING for a known service when ready (liveness: always
// until shutdown), NOT_SERVING otherwise, and NotFound for other services.
func (h *readyHealth) Check(ctx context.Context, in *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	known := false
	for _, s := range healthServices {
		known = known || s == in.Service
	}
	if !known {
		return h.Server.Check(ctx, in) // NotFound
	}
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if !h.down.Load() && (in.Service == "liveness" || h.ready()) {
		st = healthpb.HealthCheckResponse_SERVING
	}
	return &healthpb.HealthCheckResponse{Status: st}, nil
}

// logIgnored logs what GIE mode ignores.
func (fl *pickerFlags) logIgnored(logger *slog.Logger) {
	if fl.gieConfigIgnored {
		logger.Warn("GIE EndpointPickerConfig given with --config-file: its plugins are ignored; routing comes from the routing configuration and --pool-model",
			"file", fl.gie.configFile)
	}
	if len(fl.gieUnread) > 0 {
		logger.Warn("GIE EndpointPickerConfig sets how engines are scraped, not read here: the engines' metric names and path come from the metric flags (--total-queued-requests-metric, --model-server-metrics-path, ...), else are detected (docs/kubernetes.md)",
			"file", fl.gie.configFile, "settings", fl.gieUnread)
	}
}

// applyStandalone reads GIE's standalone mode (--endpoint-selector and
// --endpoint-target-ports, checked as GIE v1.5.0's Options.Validate does)
// into fl's discovery.
func (g *gieFlags) applyStandalone(fl *pickerFlags) error {
	ports := strings.Join(g.endpointPorts, ",")
	switch {
	case g.endpointSelector == "":
		return usagef("invalid --endpoint-target-ports %q: needs --endpoint-selector", ports)
	case len(g.endpointPorts) == 0:
		return usagef("invalid --endpoint-selector %q: needs --endpoint-target-ports", g.endpointSelector)
	}
	sel, err := k8s.ParseSelector(g.endpointSelector)
	if err != nil {
		return usagef("invalid --endpoint-selector %q: %v", g.endpointSelector, err)
	}
	p, err := k8s.ParsePorts(ports)
	if err != nil {
		return usagef("invalid --endpoint-target-ports %q: %v", ports, err)
	}
	fl.disc.selector, fl.disc.ports = sel, p
	return nil
}

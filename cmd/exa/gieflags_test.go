package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/examlops/gateway/internal/testport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// GIE's endpoint-picker flags without a counterpart, or with a value this
// picker does not implement, are usage errors saying so.
func TestPickerGIEBadFlags(t *testing.T) {
	gieCfg := filepath.Join(t.TempDir(), "epp.yaml")
	require.NoError(t, os.WriteFile(gieCfg, []byte("apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins: []\n"), 0o600))
	junk := filepath.Join(t.TempDir(), "junk.yaml")
	require.NoError(t, os.WriteFile(junk, []byte("kind: Deployment\n"), 0o600))
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--ha-enable-leader-election"}, `--ha-enable-leader-election needs --pool-name, --service or --endpoint-selector`},
		{[]string{"--pool-name", "p", "--ha-enable-leader-election", "--leader-lease-duration", "5s"}, `invalid --leader-lease-duration "5s", --leader-renew-deadline "10s", --leader-retry-period "2s": want lease duration > renew deadline`},
		{[]string{"--tracing=true"}, `invalid --tracing "true"`},
		{[]string{"--metrics-endpoint-auth=true"}, `invalid --metrics-endpoint-auth "true"`},
		{[]string{"--endpoint-selector", "app=x"}, `invalid --endpoint-selector "app=x": needs --endpoint-target-ports`},
		{[]string{"--endpoint-target-ports", "8000"}, `invalid --endpoint-target-ports "8000": needs --endpoint-selector`},
		{[]string{"--endpoint-selector", "app", "--endpoint-target-ports", "8000"}, `invalid --endpoint-selector "app": k8s: invalid endpoint selector "app"`},
		{[]string{"--endpoint-selector", "app=x", "--endpoint-target-ports", "8000,0"}, `invalid --endpoint-target-ports "8000,0": k8s: invalid endpoint target ports "8000,0": "0" is not a port`},
		{[]string{"--endpoint-selector", "app=x", "--endpoint-target-ports", "8000", "--pool-name", "p"}, `invalid --endpoint-selector: --pool-name "p" or --service "" is set`},
		{[]string{"--total-queued-requests-metric", "m{"}, `invalid --total-queued-requests-metric "m{": invalid metric spec "m{": missing or malformed label block`},
		{[]string{"--model-server-metrics-path", "metrics"}, `invalid --model-server-metrics-path "metrics": want an absolute path`},
		{[]string{"--model-server-metrics-port", "70000"}, `invalid --model-server-metrics-port "70000": want a port`},
		{[]string{"--model-server-metrics-scheme", "https"}, `invalid --model-server-metrics-scheme "https": only http is supported`},
		{[]string{"--refresh-metrics-interval", "1s", "--scrape-interval", "1s"}, `invalid --refresh-metrics-interval "1s": --scrape-interval is set too`},
		{[]string{"--refresh-metrics-interval", "0s"}, `invalid --refresh-metrics-interval "0s": must be positive`},
		{[]string{"--refresh-prometheus-metrics-interval", "0s"}, `invalid --refresh-prometheus-metrics-interval "0s": must be positive`},
		{[]string{"--metrics-staleness-threshold", "-1s"}, `invalid --metrics-staleness-threshold "-1s": must be positive`},
		{[]string{"--pool-group", "inference.networking.x-k8s.io"}, `invalid --pool-group "inference.networking.x-k8s.io": only inference.networking.k8s.io`},
		{[]string{"--pool-name", "p", "--service", "s"}, `invalid --service "s": --pool-name "p" is set`},
		{[]string{"--pool-name", "p", "--pool-model", " m"}, `invalid --pool-model " m": gateway: invalid model " m": must not start or end with spaces`},
		{[]string{"--grpc-port", "70000"}, `invalid --grpc-port "70000": want a port`},
		{[]string{"--grpc-health-port", "-1"}, `invalid --grpc-health-port "-1": want a port`},
		{[]string{"--grpc-port", "9002", "--listen", "127.0.0.1:0"}, `invalid --grpc-port "9002": --listen is set too`},
		{[]string{"--secure-serving=false", "--cert-path", "/x"}, `invalid --cert-path "/x": --secure-serving is false`},
		{[]string{"--cert-path", "/x", "--tls-self-signed"}, `--secure-serving/--cert-path and --tls-cert/--tls-key/--tls-self-signed cannot be used together`},
		{[]string{"--zap-encoder", "yaml"}, `invalid --zap-encoder "yaml": want json or console`},
		{[]string{"--zap-log-level", "warn"}, `invalid --zap-log-level "warn": want debug, info, error, panic or an integer > 0`},
		{[]string{"--zap-log-level", "0"}, `invalid --zap-log-level "0"`},
		{[]string{"--zap-log-level", "debug", "--log-level", "info"}, `invalid --zap-log-level "debug": --log-level is set too`},
		{[]string{"--zap-stacktrace-level", "debug"}, `invalid --zap-stacktrace-level "debug": want info, error or panic`},
		{[]string{"--zap-time-encoding", "unix"}, `invalid --zap-time-encoding "unix"`},
		{[]string{"--log-format", "xml"}, `invalid --log-format "xml": want text or json`},
		{[]string{"--config-file", junk}, `invalid --config-file "` + junk + `": neither a routing configuration (JSON) nor GIE's EndpointPickerConfig (kind "Deployment")`},
		{[]string{"--config-file", gieCfg, "--config", gieCfg}, `invalid --config-file "` + gieCfg + `": --config is set too`},
		{[]string{"--pool-name", "p", "--kubeconfig", "/nonexistent/kubeconfig"}, `invalid --kubeconfig "/nonexistent/kubeconfig"`},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			args := append([]string{"serve", "picker", "--admin-listen", "", "--grpc-health-port", "0"}, tt.args...)
			if !strings.Contains(strings.Join(tt.args, " "), "--listen") && !strings.Contains(strings.Join(tt.args, " "), "--grpc-port") {
				args = append(args, "--listen", "127.0.0.1:0")
			}
			r := exa(t, newConfig(t), args...)
			assert.Equal(t, 2, r.code, "stderr: %s", r.stderr)
			assert.Contains(t, r.stderr, "exa: "+tt.want)
		})
	}
}

// freePort returns a loopback port free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	return testport.Port(t) // outside the ephemeral ports: see package testport
}

// healthStatus asks the gRPC health service at addr about service.
func healthStatus(t *testing.T, addr, service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	return r.GetStatus(), err
}

// --grpc-health-port serves the health services GIE's chart probes, and
// no others; GIE's flags --grpc-port and --zap-encoder work as --listen
// and --log-format.
func TestPickerHealthPort(t *testing.T) {
	port := freePort(t)
	addr, line := startPickerBin(t, "--grpc-health-port", fmt.Sprint(port), "--zap-encoder", "json")
	assert.Contains(t, line, "(ext_proc gRPC, plaintext)")
	require.NoError(t, healthCheck(t, addr, insecure.NewCredentials()))
	hp := fmt.Sprintf("127.0.0.1:%d", port)
	for _, s := range []string{"inference-extension", "liveness", "readiness", "", "envoy.service.ext_proc.v3.ExternalProcessor"} {
		st, err := healthStatus(t, hp, s)
		require.NoError(t, err, "service %q", s)
		assert.Equal(t, healthpb.HealthCheckResponse_SERVING, st, "service %q", s)
	}
	_, err := healthStatus(t, hp, "nope")
	assert.Equal(t, codes.NotFound, status.Code(err))
}

// `exa --version` prints the build's version; --log-format json logs one
// JSON object per line.
func TestVersionAndJSONLogs(t *testing.T) {
	r := exa(t, newConfig(t), "--version")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `^exa version \S+ go\d`, r.stdout)
	// The missing configuration file is warned about before the bad
	// --listen fails the start.
	r = exa(t, newConfig(t), "serve", "picker", "--log-format", "json", "--admin-listen", "", "--listen", "256.0.0.1:x")
	require.Equal(t, 2, r.code)
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	require.GreaterOrEqual(t, len(lines), 2, r.stderr)
	var rec map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &rec), "line %q", lines[0])
	assert.Equal(t, "WARN", rec["level"])
	assert.Contains(t, rec["msg"], "configuration file does not exist yet")
}

// The image's build (deploy/image/Dockerfile, .ko.yaml) links exa
// statically (CGO_ENABLED=0) and stamps the version with -X main.version.
// The stamp is checked on the package's one binary (TestMain links it the
// same way); the static configuration by resolving every dependency with
// CGO_ENABLED=0, which fails when a package exa needs has no pure-Go
// files. It does not compile that configuration a second time: doing so
// recompiled every dependency and was most of this package's test time on
// a cold cache (issue 30).
func TestStaticBuildVersion(t *testing.T) {
	out, err := exec.Command(exaBin, "--version").Output()
	require.NoError(t, err)
	assert.Regexp(t, `^exa version `+regexp.QuoteMeta(testVersion)+` go\d`, string(out))

	list := exec.Command("go", "list", "-e", "-deps", "-f", "{{if .Error}}{{.ImportPath}}: {{.Error}}{{end}}{{range .DepsErrors}}{{.}}{{end}}", ".")
	list.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err = list.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Empty(t, strings.TrimSpace(string(out)), "packages exa cannot build without cgo")
}

// GIE reads --config-file with sigs.k8s.io/yaml, so its
// EndpointPickerConfig may be written as JSON: it is GIE's configuration
// (plugins ignored) then too, not a routing configuration refused for
// its unknown fields.
func TestClassifyConfigGIEAsJSON(t *testing.T) {
	for _, data := range []string{
		`{"apiVersion":"inference.networking.x-k8s.io/v1alpha1","kind":"EndpointPickerConfig","plugins":[{"type":"queue-scorer"}]}`,
		" {\"kind\": \"EndpointPickerConfig\"}\n",
	} {
		own, err := classifyConfig("epp.json", []byte(data))
		require.NoError(t, err, data)
		assert.False(t, own, data)
	}
	own, err := classifyConfig("r.json", []byte(`{"version":1,"models":{"m":{"mode":"cache_aware"}}}`))
	require.NoError(t, err)
	assert.True(t, own)
}

// GIE's zap flags: --zap-log-level maps onto --log-level (a verbosity as
// -v, and over -v, as in GIE); the others are checked and accepted.
func TestGIEZapLogLevel(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{nil, "info"},
		{[]string{"--zap-log-level", "debug"}, "debug"},
		{[]string{"--zap-log-level", "INFO"}, "info"},
		{[]string{"--zap-log-level", "panic"}, "error"},
		{[]string{"--zap-log-level", "4"}, "debug"},
		{[]string{"--zap-log-level", "2"}, "info"},
		{[]string{"-v", "5", "--zap-log-level", "error"}, "error"},
		{[]string{"-v", "5"}, "debug"},
		{[]string{"--zap-devel=false", "--zap-stacktrace-level", "panic", "--zap-time-encoding", "RFC3339Nano"}, "info"},
	} {
		var fl pickerFlags
		cmd := pickerCommand(&fl)
		require.NoError(t, cmd.ParseFlags(tt.args), "%q", tt.args)
		require.NoError(t, fl.gie.apply(cmd, &fl), "%q", tt.args)
		assert.Equal(t, tt.want, fl.logLevel, "%q", tt.args)
	}
}

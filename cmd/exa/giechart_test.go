package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/fronttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gieChartRender is one rendering of GIE v1.5.0's InferencePool chart
// (config/charts/inferencepool with config/charts/epplib, templates
// _deployment.yaml and _config.yaml): the epp container's args and the
// ConfigMap's default-plugins.yaml, as deploy/chart/charttest's
// TestGIEChartArgs renders them with Helm's Go packages.
type gieChartRender struct {
	ModelServerType string   `json:"modelServerType"`
	Replicas        int      `json:"replicas"`
	Args            []string `json:"args"`
	PluginsFile     string   `json:"pluginsFile"`
}

func gieChartRenders(t *testing.T) []gieChartRender {
	return readChartRenders(t, "testdata/gie-chart-v1.5.0.json")
}

func readChartRenders(t *testing.T, path string) []gieChartRender {
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var rs []gieChartRender
	require.NoError(t, json.Unmarshal(b, &rs))
	require.Len(t, rs, 8)
	return rs
}

// pickerFlags parses r's args as `exa serve picker` does and checks
// that they are accepted.
func (r gieChartRender) pickerFlags(t *testing.T) *pickerFlags {
	t.Helper()
	fl := &pickerFlags{}
	cmd := pickerCommand(fl)
	require.NoError(t, cmd.ParseFlags(r.chartArgs(t, t.TempDir())))
	require.NoError(t, fl.gie.apply(cmd, fl))
	require.NoError(t, fl.validate())
	require.NoError(t, fl.disc.validate())
	return fl
}

// chartArgs returns r's args with the plugins file written to dir in
// place of the chart's /config mount.
func (r gieChartRender) chartArgs(t *testing.T, dir string) []string {
	path := filepath.Join(dir, "default-plugins.yaml")
	require.NoError(t, os.WriteFile(path, []byte(r.PluginsFile), 0o600))
	args := append([]string(nil), r.Args...)
	for i, a := range args {
		args[i] = strings.Replace(a, "/config/default-plugins.yaml", path, 1)
	}
	return args
}

// Every argument list GIE's chart renders (vllm, sglang, trtllm-serve,
// triton-tensorrt-llm; 1 and 3 replicas) is accepted by `exa serve
// picker`'s flags, and the options honour it: the pool, GIE's ports, TLS
// and probes, JSON logs, the plugins file ignored, leader election with
// more than one replica, and the engine metric names and path the chart
// gives (none for vllm: the engines' types are detected).
func TestPickerGIEChartArgs(t *testing.T) {
	wantMetrics := map[string]*fleet.EngineMetrics{
		"vllm": nil,
		"sglang": {Queued: "sglang:num_queue_reqs", Running: "sglang:num_running_reqs", KVUsage: "sglang:token_usage",
			LoRAInfo: "vllm:lora_requests_info", CacheInfo: "sglang:cache_config_info", Path: "/metrics"},
		"trtllm-serve": {Queued: "trtllm_num_requests_waiting", Running: "trtllm_num_requests_running", KVUsage: "trtllm_kv_cache_utilization",
			CacheInfo: "trtllm_cache_config_info", Path: "/prometheus/metrics"},
		"triton-tensorrt-llm": {Queued: "nv_trt_llm_request_metrics{request_type=waiting}", Running: "nv_trt_llm_request_metrics{request_type=scheduled}",
			KVUsage: "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}", CacheInfo: "vllm:cache_config_info", Path: "/metrics"},
	}
	for _, r := range gieChartRenders(t) {
		t.Run(fmt.Sprintf("%s/%d", r.ModelServerType, r.Replicas), func(t *testing.T) {
			fl := r.pickerFlags(t)
			assert.Equal(t, "pool", fl.disc.poolName)
			assert.Equal(t, "llm", fl.disc.namespace())
			assert.Equal(t, ":9002", fl.listen)
			assert.Equal(t, ":9090", fl.adminListen)
			assert.Equal(t, 9003, fl.gie.grpcHealthPort)
			assert.True(t, fl.tlsSelfSigned)
			assert.Equal(t, "json", fl.logFormat)
			assert.Equal(t, "info", fl.logLevel, "--v 1")
			assert.True(t, fl.gieConfigIgnored)
			assert.Equal(t, r.Replicas > 1, fl.gie.leaderElection)
			want := wantMetrics[r.ModelServerType]
			if want == nil {
				assert.Nil(t, fl.gie.engineMetrics)
				return
			}
			got := fl.gie.engineMetrics
			require.NotNil(t, got)
			// The specs as read: the chart's quotes removed.
			for _, p := range [][2]string{{got.Queued, want.Queued}, {got.Running, want.Running}, {got.KVUsage, want.KVUsage},
				{got.LoRAInfo, want.LoRAInfo}, {got.CacheInfo, want.CacheInfo}} {
				g, err := fleet.ParseMetricSpec(p[0])
				require.NoError(t, err)
				w, err := fleet.ParseMetricSpec(p[1])
				require.NoError(t, err)
				assert.Equal(t, w, g, "spec %q", p[0])
			}
			assert.Equal(t, want.Path, got.Path)
			_, err := fleet.New(fleet.Options{EngineMetrics: got})
			require.NoError(t, err)
		})
	}
}

// Every argument list GIE's standalone chart renders without an
// InferencePool (every modelServerType, 1 and 3 replicas) is accepted:
// discovery from the pods labelled app=vllm on port 8000 (GIE's
// standalone mode), GIE's ports and TLS, leader election with more than
// one replica, the Lease and pool series named after the picker's
// Deployment (from $POD_NAME, as GIE names it).
func TestPickerGIEStandaloneChartArgs(t *testing.T) {
	t.Setenv("POD_NAME", "epp-6d8f7b9c5-x2x9q")
	for _, r := range readChartRenders(t, "testdata/gie-standalone-chart-v1.5.0.json") {
		t.Run(fmt.Sprintf("%s/%d", r.ModelServerType, r.Replicas), func(t *testing.T) {
			fl := r.pickerFlags(t)
			assert.True(t, fl.disc.enabled())
			assert.Equal(t, map[string]string{"app": "vllm"}, fl.disc.selector)
			assert.Equal(t, []int{8000}, fl.disc.ports)
			assert.Equal(t, "epp", fl.disc.sourceName())
			assert.Equal(t, ":9002", fl.listen)
			assert.True(t, fl.tlsSelfSigned)
			assert.Equal(t, r.Replicas > 1, fl.gie.leaderElection)
			assert.Equal(t, r.ModelServerType != "vllm", fl.gie.engineMetrics != nil)
		})
	}
	t.Setenv("POD_NAME", "")
	assert.Equal(t, "standalone", (&discoveryFlags{selector: map[string]string{"app": "x"}}).sourceName())
}

// The metric flags GIE's chart gives a trtllm-serve pool are honoured by
// the running picker: the engine's page is read at /prometheus/metrics
// with trtllm-serve's names (/stats shows its load, engine "custom"),
// where without them its load would read zero.
func TestPickerGIEMetricFlagsScrape(t *testing.T) {
	var chart gieChartRender
	for _, r := range gieChartRenders(t) {
		if r.ModelServerType == "trtllm-serve" && r.Replicas == 1 {
			chart = r
		}
	}
	var metricArgs []string
	for i := 0; i < len(chart.Args); i++ {
		a := chart.Args[i]
		if strings.Contains(a, "-metric") || strings.Contains(a, "metrics-path") {
			metricArgs = append(metricArgs, a)
			if !strings.Contains(a, "=") {
				i++
				metricArgs = append(metricArgs, chart.Args[i])
			}
		}
	}
	require.Len(t, metricArgs, 7, "%q", metricArgs)
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/prometheus/metrics":
			fmt.Fprint(w, "trtllm_num_requests_waiting 5\ntrtllm_num_requests_running 2\ntrtllm_kv_cache_utilization 0.25\n")
		case "/health":
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(engine.Close)
	cfg := newConfig(t)
	ok(t, cfg, "serve", "routing", "set", "m", "--mode", "cache_aware", "--replica", "e0="+engine.URL)
	admin := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	args := append([]string{"serve", "picker", "--listen", "127.0.0.1:0", "--admin-listen", admin, "--scrape-interval", "50ms"}, metricArgs...)
	cmd := exec.Command(exaBin, args...)
	cmd.Env = append(os.Environ(), config.EnvVar+"="+cfg, "EXA_GATEWAY=")
	stderr := &fronttest.SyncBuffer{}
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	require.True(t, sc.Scan(), "no start-up line; stderr: %s", stderr.String())
	require.Regexp(t, regexp.MustCompile(`picker listening on`), sc.Text())
	var engines []fleet.EngineStats
	deadline := time.Now().Add(20 * time.Second)
	for {
		var st fleet.Stats
		if resp, err := http.Get("http://" + admin + "/stats"); err == nil {
			err = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			require.NoError(t, err)
			engines = st.Engines
			if len(engines) == 1 && engines[0].Load != nil {
				break
			}
		}
		require.True(t, time.Now().Before(deadline), "no load scraped within 20 s: %+v; stderr: %s", engines, stderr.String())
		time.Sleep(20 * time.Millisecond)
	}
	assert.Equal(t, fleet.EngineCustom, engines[0].Engine)
	assert.Equal(t, fleet.EngineLoad{Waiting: 5, Running: 2, KVUtilization: 0.25}, *engines[0].Load)
	assert.Empty(t, engines[0].LoadWarning)
}

// GIE's other metric flags: --refresh-metrics-interval sets the scrape
// interval, --model-server-metrics-port the port scraped (GIE's names
// then, vLLM's), --metrics-staleness-threshold the pool series' staleness,
// and --model-server-metrics-scheme http,
// --refresh-prometheus-metrics-interval and
// --model-server-metrics-https-insecure-skip-verify are accepted.
func TestPickerGIEMetricOptions(t *testing.T) {
	var fl pickerFlags
	cmd := pickerCommand(&fl)
	require.NoError(t, cmd.ParseFlags([]string{"--refresh-metrics-interval", "250ms", "--model-server-metrics-port", "9400", "--model-server-metrics-scheme", "http",
		"--metrics-staleness-threshold", "3s", "--refresh-prometheus-metrics-interval", "1s", "--model-server-metrics-https-insecure-skip-verify=false"}))
	require.NoError(t, fl.gie.apply(cmd, &fl))
	assert.Equal(t, 250*time.Millisecond, fl.scrape)
	assert.Equal(t, 3*time.Second, fl.disc.staleness, "the pool series' staleness")
	want := fleet.DefaultEngineMetrics()
	want.Port = 9400
	require.NotNil(t, fl.gie.engineMetrics)
	assert.Equal(t, want, *fl.gie.engineMetrics)
}

// The EndpointPickerConfig settings that change what GIE's picker
// scrapes, which this picker does not read, are logged rather than
// dropped in silence: a metrics-data-source scheme or path other than
// GIE's defaults, and a core-metrics-extractor defaultEngine other than
// vllm when no metric flag carries the same choice (GIE's chart passes
// none with inferenceExtension.latencyPredictor.enabled). The chart's
// default renders log nothing.
func TestPickerGIEConfigUnreadLogged(t *testing.T) {
	for _, r := range gieChartRenders(t) {
		var fl pickerFlags
		cmd := pickerCommand(&fl)
		require.NoError(t, cmd.ParseFlags(r.chartArgs(t, t.TempDir())))
		require.NoError(t, fl.gie.apply(cmd, &fl))
		assert.Empty(t, fl.gieUnread, "%s/%d", r.ModelServerType, r.Replicas)
	}
	// The trtllm-serve plugins file without the chart's metric flags, its
	// metrics page moved.
	var plugins string
	for _, r := range gieChartRenders(t) {
		if r.ModelServerType == "trtllm-serve" {
			plugins = strings.Replace(r.PluginsFile, `path: "/metrics"`, `path: "/prometheus/metrics"`, 1)
		}
	}
	path := filepath.Join(t.TempDir(), "default-plugins.yaml")
	require.NoError(t, os.WriteFile(path, []byte(plugins), 0o600))
	var fl pickerFlags
	cmd := pickerCommand(&fl)
	require.NoError(t, cmd.ParseFlags([]string{"--pool-name", "pool", "--config-file", path}))
	require.NoError(t, fl.gie.apply(cmd, &fl))
	assert.Equal(t, []string{`metrics-data-source path "/prometheus/metrics"`, `core-metrics-extractor defaultEngine "trtllm-serve"`}, fl.gieUnread)
	var logs bytes.Buffer
	fl.logIgnored(slog.New(slog.NewTextHandler(&logs, nil)))
	assert.Contains(t, logs.String(), `not read here`)
	assert.Contains(t, logs.String(), `core-metrics-extractor defaultEngine \"trtllm-serve\"`)
}

// GIE's chart gives its epp container args and no command, so with this
// image (ENTRYPOINT /exa, or ko's) the process gets GIE's picker flags
// with no subcommand: exa then runs `serve picker`. Each chart render,
// pointed at a missing kubeconfig, gets as far as the picker's cluster
// connection (every flag parsed and checked); exa's own invocations keep
// their meaning.
func TestGIEChartArgsWithoutCommand(t *testing.T) {
	for _, r := range gieChartRenders(t) {
		args := append(r.chartArgs(t, t.TempDir()), "--kubeconfig", "/nonexistent/kubeconfig", "--admin-listen", "", "--grpc-health-port", "0", "--grpc-port", "0")
		res := exa(t, newConfig(t), args...)
		assert.Equal(t, 2, res.code, "%s/%d: %s", r.ModelServerType, r.Replicas, res.stderr)
		// JSON logs (--zap-encoder json): the quotes are escaped.
		assert.Contains(t, res.stderr, `exa: invalid --kubeconfig \"/nonexistent/kubeconfig\"`, "%s/%d", r.ModelServerType, r.Replicas)
	}
	r := exa(t, newConfig(t), "--version")
	assert.Equal(t, 0, r.code)
	assert.Contains(t, r.stdout, "exa version")
	r = exa(t, newConfig(t), "--bogus")
	assert.Equal(t, 2, r.code)
	assert.Contains(t, r.stderr, "unknown flag: --bogus")
	r = exa(t, newConfig(t), "--help")
	assert.Equal(t, 0, r.code)
	assert.Contains(t, r.stdout, "Usage:")
}

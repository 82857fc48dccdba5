package charttest

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
)

// gieArgsGolden holds the endpoint picker's arguments and plugins file as
// GIE's InferencePool chart renders them; cmd/exa's TestPickerGIEChartArgs
// runs each argument list through `exa serve picker`'s flags.
const gieArgsGolden = "../../../cmd/exa/testdata/gie-chart-v1.5.0.json"

// gieStandaloneGolden holds them as GIE's standalone chart renders them
// without an InferencePool (--endpoint-selector, --endpoint-target-ports).
const gieStandaloneGolden = "../../../cmd/exa/testdata/gie-standalone-chart-v1.5.0.json"

// checkGolden compares renders (of chart) with the golden file path, which
// EXA_UPDATE_GOLDEN=1 rewrites.
func checkGolden(t *testing.T, path, chart string, renders any) {
	t.Helper()
	b, err := json.MarshalIndent(renders, "", "  ")
	require.NoError(t, err)
	b = append(b, '\n')
	if os.Getenv("EXA_UPDATE_GOLDEN") != "" {
		require.NoError(t, os.WriteFile(path, b, 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, string(want), string(b), "%s renders other arguments; EXA_UPDATE_GOLDEN=1 rewrites %s", chart, path)
}

// gieRender is one rendering of GIE's chart: the epp container's args and
// the ConfigMap's default-plugins.yaml.
type gieRender struct {
	ModelServerType string   `json:"modelServerType"`
	Replicas        int      `json:"replicas"`
	Args            []string `json:"args"`
	PluginsFile     string   `json:"pluginsFile"`
}

// renderGIE renders GIE v1.5.0's chart (config/charts/inferencepool with
// its epplib dependency, from the module cache) as `helm install pool
// --namespace llm --set inferencePool.modelServerType=TYPE --set
// inferenceExtension.replicas=N --set
// inferencePool.modelServers.matchLabels.app=vllm` would.
func renderGIE(t *testing.T, modelServerType string, replicas int) gieRender {
	t.Helper()
	return renderGIEChart(t, "inferencepool", modelServerType, replicas, map[string]any{
		"inferencePool":      map[string]any{"modelServerType": modelServerType, "modelServers": map[string]any{"matchLabels": map[string]any{"app": "vllm"}}},
		"inferenceExtension": map[string]any{"replicas": replicas},
	})
}

// renderStandalone renders GIE v1.5.0's standalone chart
// (config/charts/standalone: the picker with an Envoy sidecar) without an
// InferencePool, as `helm install epp --namespace llm --set
// inferenceExtension.endpointsServer.createInferencePool=false --set
// inferenceExtension.endpointsServer.endpointSelector=app=vllm --set
// inferenceExtension.endpointsServer.modelServerType=TYPE` would.
func renderStandalone(t *testing.T, modelServerType string, replicas int) gieRender {
	t.Helper()
	return renderGIEChart(t, "standalone", modelServerType, replicas, map[string]any{
		"inferenceExtension": map[string]any{"replicas": replicas, "endpointsServer": map[string]any{
			"createInferencePool": false, "endpointSelector": "app=vllm", "modelServerType": modelServerType}},
	})
}

// renderGIEChart renders GIE's chart name with its epplib dependency,
// from the module cache, with vals.
func renderGIEChart(t *testing.T, name, modelServerType string, replicas int, vals map[string]any) gieRender {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api-inference-extension").Output()
	require.NoError(t, err)
	charts := filepath.Join(strings.TrimSpace(string(out)), "config", "charts")
	ch, err := loader.Load(filepath.Join(charts, name))
	require.NoError(t, err)
	lib, err := loader.Load(filepath.Join(charts, "epplib"))
	require.NoError(t, err)
	ch.AddDependency(lib)
	require.NoError(t, chartutil.ProcessDependenciesWithMerge(ch, vals))
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: "pool", Namespace: "llm", IsInstall: true}, nil)
	require.NoError(t, err)
	files, err := engine.Render(ch, rv)
	require.NoError(t, err)
	r := gieRender{ModelServerType: modelServerType, Replicas: replicas}
	for _, o := range objects(t, files) {
		switch o.GetKind() {
		case "Deployment":
			spec := o.Object["spec"].(map[string]any)
			require.EqualValues(t, replicas, spec["replicas"])
			for _, c := range spec["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any) {
				if c := c.(map[string]any); c["name"] == "epp" {
					for _, a := range c["args"].([]any) {
						r.Args = append(r.Args, a.(string))
					}
				}
			}
		case "ConfigMap":
			if p, ok := o.Object["data"].(map[string]any)["default-plugins.yaml"]; ok {
				r.PluginsFile = p.(string)
			}
		}
	}
	require.NotEmpty(t, r.Args)
	require.NotEmpty(t, r.PluginsFile)
	return r
}

// GIE's chart renders, for every modelServerType and for one and three
// replicas, the arguments recorded in cmd/exa's testdata (which
// cmd/exa's TestPickerGIEChartArgs feeds to `exa serve picker`).
// EXA_UPDATE_GOLDEN=1 rewrites the file.
func TestGIEChartArgs(t *testing.T) {
	var got, standalone []gieRender
	for _, typ := range []string{"vllm", "sglang", "trtllm-serve", "triton-tensorrt-llm"} {
		for _, n := range []int{1, 3} {
			got = append(got, renderGIE(t, typ, n))
			standalone = append(standalone, renderStandalone(t, typ, n))
		}
	}
	checkGolden(t, gieArgsGolden, "GIE's chart", got)
	checkGolden(t, gieStandaloneGolden, "GIE's standalone chart", standalone)
	for _, r := range standalone {
		joined := strings.Join(r.Args, " ")
		require.Contains(t, joined, "--endpoint-selector app=vllm --endpoint-target-ports 8000", "%s/%d", r.ModelServerType, r.Replicas)
		require.NotContains(t, joined, "--pool-name", "%s/%d", r.ModelServerType, r.Replicas)
	}
	for _, r := range got {
		joined := strings.Join(r.Args, " ")
		require.Equal(t, r.Replicas > 1, strings.Contains(joined, "--ha-enable-leader-election"), "%s/%d", r.ModelServerType, r.Replicas)
		require.Equal(t, r.ModelServerType != "vllm", strings.Contains(joined, "--total-queued-requests-metric"), fmt.Sprintf("%s/%d", r.ModelServerType, r.Replicas))
	}
}

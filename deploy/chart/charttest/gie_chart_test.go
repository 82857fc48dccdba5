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
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api-inference-extension").Output()
	require.NoError(t, err)
	charts := filepath.Join(strings.TrimSpace(string(out)), "config", "charts")
	ch, err := loader.Load(filepath.Join(charts, "inferencepool"))
	require.NoError(t, err)
	lib, err := loader.Load(filepath.Join(charts, "epplib"))
	require.NoError(t, err)
	ch.AddDependency(lib)
	vals := map[string]any{
		"inferencePool":      map[string]any{"modelServerType": modelServerType, "modelServers": map[string]any{"matchLabels": map[string]any{"app": "vllm"}}},
		"inferenceExtension": map[string]any{"replicas": replicas},
	}
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
	var got []gieRender
	for _, typ := range []string{"vllm", "sglang", "trtllm-serve", "triton-tensorrt-llm"} {
		for _, n := range []int{1, 3} {
			got = append(got, renderGIE(t, typ, n))
		}
	}
	b, err := json.MarshalIndent(got, "", "  ")
	require.NoError(t, err)
	b = append(b, '\n')
	if os.Getenv("EXA_UPDATE_GOLDEN") != "" {
		require.NoError(t, os.WriteFile(gieArgsGolden, b, 0o644))
	}
	want, err := os.ReadFile(gieArgsGolden)
	require.NoError(t, err)
	require.Equal(t, string(want), string(b), "GIE's chart renders other arguments; EXA_UPDATE_GOLDEN=1 rewrites %s", gieArgsGolden)
	for _, r := range got {
		joined := strings.Join(r.Args, " ")
		require.Equal(t, r.Replicas > 1, strings.Contains(joined, "--ha-enable-leader-election"), "%s/%d", r.ModelServerType, r.Replicas)
		require.Equal(t, r.ModelServerType != "vllm", strings.Contains(joined, "--total-queued-requests-metric"), fmt.Sprintf("%s/%d", r.ModelServerType, r.Replicas))
	}
}

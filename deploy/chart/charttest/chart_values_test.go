package charttest

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/strvals"
)

// container returns the exa container of the chart rendered with vals,
// and the objects by kind and name.
func container(t *testing.T, vals map[string]any) (map[string]any, map[string]map[string]any) {
	return containerAs(t, vals, "exa")
}

// containerAs is container for the release named release.
func containerAs(t *testing.T, vals map[string]any, release string) (map[string]any, map[string]map[string]any) {
	t.Helper()
	objs := map[string]map[string]any{}
	for _, o := range objects(t, renderAs(t, vals, release, "llm")) {
		objs[o.GetKind()+"/"+o.GetName()] = o.Object
	}
	dep := objs["Deployment/"+release+"-"+modeOf(vals)]
	require.NotNil(t, dep, "no Deployment among %v", keys(objs))
	pod := dep["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	return pod["containers"].([]any)[0].(map[string]any), objs
}

func modeOf(vals map[string]any) string {
	if m, ok := vals["mode"].(string); ok {
		return m
	}
	return "picker"
}

func keys(m map[string]map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// A model name is any non-empty string without control characters or
// surrounding spaces (config.ValidateModelName): one with " #" or ": "
// reaches the process as written, not cut at a YAML comment or turned
// into a mapping.
func TestChartModelNamesVerbatim(t *testing.T) {
	for _, name := range []string{"llama #2", "org/model: v2", "it's \"quoted\""} {
		c, _ := container(t, map[string]any{"models": []any{name}, "pool": map[string]any{"name": "p"}})
		require.Contains(t, c["args"], "--pool-model="+name)
	}
}

// With more than one picker replica the chart elects a leader, as GIE's
// chart does (--ha-enable-leader-election and a Role on Leases), so that
// one picker, with one cache state, takes the traffic; with one replica,
// or in mode gateway (peers share state instead), it does not.
func TestChartPickerReplicasElectLeader(t *testing.T) {
	leases := map[string]any{"apiGroups": []any{"coordination.k8s.io"}, "resources": []any{"leases"},
		"verbs": []any{"get", "create", "update"}}
	for _, tt := range []struct {
		vals  map[string]any
		elect bool
	}{
		{map[string]any{"replicas": 3, "models": []any{"llama"}}, true},
		{map[string]any{"replicas": 1, "models": []any{"llama"}}, false},
		{map[string]any{"models": []any{"llama"}}, false},
		{map[string]any{"mode": "gateway", "replicas": 3, "models": []any{"llama"}, "service": map[string]any{"name": "vllm"}}, false},
	} {
		c, objs := container(t, tt.vals)
		require.Equal(t, tt.elect, contains(c["args"].([]any), "--ha-enable-leader-election"), "%v", tt.vals)
		role := objs["Role/exa-"+modeOf(tt.vals)]
		require.NotNil(t, role)
		require.Equal(t, tt.elect, contains(role["rules"].([]any), leases), "%v: rules %v", tt.vals, role["rules"])
	}
}

func contains(list []any, v any) bool {
	for _, x := range list {
		if reflect.DeepEqual(x, v) {
			return true
		}
	}
	return false
}

// Values the picker would refuse at start fail the render instead of
// crash-looping the pod.
func TestChartRefusesWhatThePickerWould(t *testing.T) {
	for _, tt := range []struct {
		vals map[string]any
		want string
	}{
		// --secure-serving=false --cert-path=...: "invalid --cert-path".
		{map[string]any{"picker": map[string]any{"secureServing": false, "certSecret": "tls"}}, "picker.certSecret (--cert-path) needs picker.secureServing"},
	} {
		ch, err := loader.Load(chartDir)
		require.NoError(t, err)
		rv, err := chartutil.ToRenderValues(ch, tt.vals, chartutil.ReleaseOptions{Name: "exa", Namespace: "llm"}, nil)
		require.NoError(t, err)
		_, err = engine.Render(ch, rv)
		require.ErrorContains(t, err, tt.want)
	}
}

// The container gets NAMESPACE and POD_NAME from the downward API, as GIE's
// chart gives its picker: the leader election's holder identity is
// $POD_NAME and a random suffix (docs/kubernetes.md, Leader election); the
// host name it falls back to is cut at 63 bytes, which a Deployment's pod
// name may pass.
func TestChartPodEnv(t *testing.T) {
	for _, vals := range []map[string]any{
		{"replicas": 3, "models": []any{"llama"}},
		{"mode": "gateway", "models": []any{"llama"}, "service": map[string]any{"name": "vllm"}},
	} {
		c, _ := container(t, vals)
		env := map[string]any{}
		for _, e := range c["env"].([]any) {
			e := e.(map[string]any)
			env[e["name"].(string)] = e["valueFrom"]
		}
		for name, field := range map[string]string{"NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"} {
			require.Equal(t, map[string]any{"fieldRef": map[string]any{"fieldPath": field}}, env[name], "%v: env %s", vals, name)
		}
	}
}

// pool.selector's values reach the InferencePool as strings, as the CRD's
// matchLabels want them, whatever type Helm's --set gives them
// (`--set pool.selector.version=1` is a number, `...gpu=true` a
// boolean); GIE's chart quotes them likewise.
func TestChartPoolSelectorValuesAreStrings(t *testing.T) {
	vals := map[string]any{}
	require.NoError(t, strvals.ParseInto("models[0]=llama,pool.create=true,pool.selector.app=vllm,pool.selector.version=1,pool.selector.gpu=true", vals))
	_, objs := container(t, vals)
	pool := objs["InferencePool/exa"]
	require.NotNil(t, pool, "no InferencePool among %v", keys(objs))
	sel := pool["spec"].(map[string]any)["selector"].(map[string]any)["matchLabels"]
	require.Equal(t, map[string]any{"app": "vllm", "version": "1", "gpu": "true"}, sel)
}

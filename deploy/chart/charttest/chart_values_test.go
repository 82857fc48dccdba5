package charttest

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// container returns the exa container of the chart rendered with vals,
// and the objects by kind and name.
func container(t *testing.T, vals map[string]any) (map[string]any, map[string]map[string]any) {
	t.Helper()
	objs := map[string]map[string]any{}
	for _, o := range objects(t, render(t, vals)) {
		objs[o.GetKind()+"/"+o.GetName()] = o.Object
	}
	dep := objs["Deployment/exa-"+modeOf(vals)]
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

package charttest

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/chartutil"
)

// TestChartRateLimitLargeNumbers: values read from a YAML file (helm -f)
// hold numbers as float64; a burst of a million must still render as an
// integer flag value that --rate-limit-burst (an int flag) parses.
func TestChartRateLimitLargeNumbers(t *testing.T) {
	vals, err := chartutil.ReadValues([]byte(`
mode: gateway
models: [llama]
service: {name: vllm}
gateway:
  rateLimit: {perSecond: 1000000, burst: 2000000}
`))
	require.NoError(t, err)
	out := render(t, vals.AsMap())
	dep := out["exa/templates/deployment.yaml"]
	require.True(t, strings.Contains(dep, "--rate-limit-burst=2000000"), "burst rendered as: %s", line(dep, "--rate-limit-burst"))
	require.True(t, strings.Contains(dep, "--rate-limit=1000000") || strings.Contains(dep, "--rate-limit=1e+06"), line(dep, "--rate-limit="))
}

func line(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}

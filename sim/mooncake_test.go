package sim

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/stretchr/testify/require"
)

const mooncakePath = "../../shared/traces/mooncake_synthetic_trace.jsonl"

func mooncake(t testing.TB) Workload {
	t.Helper()
	if _, err := os.Stat(mooncakePath); err != nil {
		t.Skipf("trace %s absent", mooncakePath)
	}
	w, err := TraceFile(mooncakePath, TraceOptions{})
	require.NoError(t, err)
	return w
}

// TestMooncakeTable prints the comparison on the real trace, 4 and 8
// replicas. Skipped with -short.
func TestMooncakeTable(t *testing.T) {
	if testing.Short() {
		t.Skip("full trace")
	}
	w := mooncake(t)
	for _, n := range []int{4, 8} {
		start := time.Now()
		rep, err := Run(Config{Workload: w, Replicas: n, Seed: 1, Index: gateway.IndexExact})
		require.NoError(t, err)
		var b strings.Builder
		require.NoError(t, rep.WriteTable(&b))
		t.Logf("%d replicas (%v wall):\n%s", n, time.Since(start), b.String())
	}
}

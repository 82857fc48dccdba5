package main

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestChartArgsAccepted: every argument list the exa chart renders
// (deploy/chart/charttest's TestChartArgsGolden records them for the
// chart's defaults, its tests' value sets and docs/kubernetes.md's
// `helm install` commands) parses with the command's flags, and the
// picker's pass every check made before it starts serving, so that no
// documented install crash-loops on a usage error.
func TestChartArgsAccepted(t *testing.T) {
	b, err := os.ReadFile("testdata/exa-chart-args.json")
	require.NoError(t, err)
	var sets []struct {
		Set  string   `json:"set"`
		Args []string `json:"args"`
	}
	require.NoError(t, json.Unmarshal(b, &sets))
	require.GreaterOrEqual(t, len(sets), 10)
	for _, s := range sets {
		require.GreaterOrEqual(t, len(s.Args), 2, s.Set)
		require.Equal(t, "serve", s.Args[0], s.Set)
		args := s.Args[2:]
		switch s.Args[1] {
		case "gateway":
			require.NoError(t, newGatewayCmd().ParseFlags(args), s.Set)
		case "picker":
			var fl pickerFlags
			cmd := pickerCommand(&fl)
			require.NoError(t, cmd.ParseFlags(args), s.Set)
			require.NoError(t, fl.gie.apply(cmd, &fl), s.Set)
			require.NoError(t, fl.tlsFlags.exclusive(cmd), s.Set)
			require.NoError(t, fl.validate(), s.Set)
			require.NoError(t, fl.disc.validate(), s.Set)
			require.NoError(t, fl.conns.validate(), s.Set)
			_, err := fl.slo.options()
			require.NoError(t, err, s.Set)
			_, err = fl.rateLimitOptions(cmd)
			require.NoError(t, err, s.Set)
		default:
			t.Fatalf("%s: command %q", s.Set, s.Args[1])
		}
	}
}

package k8s

import (
	"testing"

	"github.com/examlops/gateway/config"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"
)

// GIE's standalone mode: --endpoint-selector and --endpoint-target-ports
// read as GIE v1.5.0 reads them, with errors naming the value.
func TestParseSelectorAndPorts(t *testing.T) {
	m, err := ParseSelector("app=sim, tier = gpu")
	require.NoError(t, err)
	require.Equal(t, map[string]string{"app": "sim", "tier": "gpu"}, m)
	for _, bad := range []string{"", "app", "app!=sim", "app==sim", "app=sim,=x"} {
		_, err := ParseSelector(bad)
		require.ErrorContains(t, err, `invalid endpoint selector "`+bad+`"`)
	}
	ports, err := ParsePorts("8000, 8001,8000")
	require.NoError(t, err)
	require.Equal(t, []int{8000, 8001}, ports, "duplicates dropped, as GIE's removeDuplicatePorts")
	for bad, want := range map[string]string{
		"":                  `"" is not a port`,
		"0":                 `"0" is not a port`,
		"8000,x":            `"x" is not a port`,
		"70000":             `"70000" is not a port`,
		"1,2,3,4,5,6,7,8,9": "at most 8 ports",
	} {
		_, err := ParsePorts(bad)
		require.ErrorContains(t, err, want, bad)
	}
}

// Options: exactly one source; target ports only with a selector, 1 to 8
// distinct ports.
func TestStandaloneOptions(t *testing.T) {
	cfg := &rest.Config{Host: "http://127.0.0.1:1"} // refused before any connection
	rec := newRecorder()
	for _, tt := range []struct {
		o    Options
		want string
	}{
		{Options{Pool: "p", Selector: map[string]string{"app": "x"}, TargetPorts: []int{1}}, "set exactly one"},
		{Options{Selector: map[string]string{}, TargetPorts: []int{1}}, "want at least one label"},
		{Options{Selector: map[string]string{"app": "x"}}, "want 1 to 8 with a selector"},
		{Options{Selector: map[string]string{"app": "x"}, TargetPorts: []int{8000, 8000}}, "listed twice"},
		{Options{Selector: map[string]string{"app": "x"}, TargetPorts: []int{0}}, "0 is not a port"},
		{Options{Pool: "p", TargetPorts: []int{8000}}, "only with a selector"},
	} {
		tt.o.Config, tt.o.Namespace = cfg, "default"
		_, err := New(tt.o, rec)
		require.ErrorContains(t, err, tt.want, "%+v", tt.o)
	}
}

// Standalone discovery on a real API server: the ready pods matching the
// selector, on each target port, with no InferencePool object.
func TestDiscoveryStandalone(t *testing.T) {
	cfg, c := apiServer(t)
	ns := newNamespace(t, c)
	startPod(t, c, ns, "sim-a", "sim", "127.0.0.21")
	startPod(t, c, ns, "other", "other", "127.0.0.29") // not selected
	rec := newRecorder()
	base := &config.File{Version: config.Version, Models: map[string]config.Model{"m": {Mode: 1}}}
	runDiscovery(t, Options{Config: cfg, Namespace: ns, Selector: map[string]string{"app": "sim"}, TargetPorts: []int{8000, 8001},
		Models: []string{"m"}, Base: func() (*config.File, error) { return base, nil }}, rec)
	f, _ := rec.await(t, "m", "sim-a-rank-0", "sim-a-rank-1")
	require.Equal(t, "http://127.0.0.21:8001", f.Models["m"].Replicas[1].Address)
	startPod(t, c, ns, "sim-b", "sim", "127.0.0.22")
	rec.await(t, "m", "sim-a-rank-0", "sim-a-rank-1", "sim-b-rank-0", "sim-b-rank-1")
	deletePod(t, c, ns, "sim-a")
	rec.await(t, "m", "sim-b-rank-0", "sim-b-rank-1")
}

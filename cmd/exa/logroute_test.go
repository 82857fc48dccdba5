package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/internal/fronttest"
	"github.com/examlops/gateway/internal/k8stest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// requireJSONLines requires every line of out to be one JSON object with
// a level and a msg, and returns them.
func requireJSONLines(t *testing.T, what, out string) []map[string]any {
	t.Helper()
	var recs []map[string]any
	for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if l == "" {
			continue
		}
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &rec), "%s: a line that is not JSON: %q", what, l)
		require.Contains(t, rec, "level", "%s: %q", what, l)
		require.Contains(t, rec, "msg", "%s: %q", what, l)
		recs = append(recs, rec)
	}
	return recs
}

// With --log-format json, every line the gateway writes, on stdout and
// stderr, is JSON: its start, a configuration reload, an engine's
// ejection (with its reason), its shutdown, and a usage error's exit.
func TestGatewayJSONLogs(t *testing.T) {
	e := enginetest.New(enginetest.Options{Name: "e0", Model: "m"})
	t.Cleanup(e.Close)
	cfg := filepath.Join(t.TempDir(), "routing.json")
	write := func(models string) {
		require.NoError(t, os.WriteFile(cfg+".tmp", []byte(`{"version":1,"models":{`+models+`}}`), 0o600))
		require.NoError(t, os.Rename(cfg+".tmp", cfg))
	}
	// r1 refuses connections: ejected (1 of 2 is within the default cap).
	write(fmt.Sprintf(`"m":{"replicas":[{"name":"r0","address":%q},{"name":"r1","address":"127.0.0.1:1"}]}`, e.URL()))
	cmd := exec.Command(exaBin, "serve", "gateway", "--log-format", "json", "--listen", "127.0.0.1:0", "--config", cfg,
		"--probe-interval", "20ms", "--reload-interval", "20ms")
	cmd.Env = append(os.Environ(), "EXA_GATEWAY=")
	stderr := &fronttest.SyncBuffer{}
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	stdout := make(chan string, 1)
	go func() {
		var b strings.Builder
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			b.WriteString(sc.Text() + "\n")
		}
		stdout <- b.String()
	}()
	// waitFor waits (at most 30 s) until stderr holds n lines with msg.
	waitFor := func(msg string, n int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for strings.Count(stderr.String(), `"msg":"`+msg+`"`) < n {
			require.True(t, time.Now().Before(deadline), "no %d× %q within 30 s; stderr: %s", n, msg, stderr.String())
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("gateway: configuration loaded", 1)
	waitFor("gateway: engine ejected", 1)
	write(fmt.Sprintf(`"m":{"replicas":[{"name":"r0","address":%q},{"name":"r1","address":"127.0.0.1:1"}]},"m2":{"replicas":[{"name":"r0","address":%q}]}`, e.URL(), e.URL()))
	waitFor("gateway: configuration loaded", 2)
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	require.NoError(t, cmd.Wait())

	start := requireJSONLines(t, "stdout", <-stdout)
	require.Len(t, start, 1)
	assert.Contains(t, start[0]["msg"], "exa: gateway listening on http://127.0.0.1:")
	assert.EqualValues(t, 1, start[0]["models"])
	var ejected, loaded int
	for _, rec := range requireJSONLines(t, "stderr", stderr.String()) {
		switch rec["msg"] {
		case "gateway: engine ejected":
			ejected++
			assert.Equal(t, "http://127.0.0.1:1", rec["address"])
			assert.Equal(t, "refused", rec["reason"])
			assert.Equal(t, "probe", rec["source"])
		case "gateway: configuration loaded":
			loaded++
		}
	}
	assert.Equal(t, 1, ejected)
	assert.Equal(t, 2, loaded)

	// A usage error's exit line, and one from an unknown flag.
	for _, args := range [][]string{
		{"serve", "gateway", "--log-format", "json", "--probe-interval", "0s"},
		{"serve", "gateway", "--log-format", "json", "--bogus"},
		{"serve", "picker", "--zap-encoder", "json", "--grpc-port", "x"},
	} {
		r := exa(t, newConfig(t), args...)
		require.Equal(t, 2, r.code, r.stderr)
		recs := requireJSONLines(t, strings.Join(args, " "), r.stderr)
		require.NotEmpty(t, recs)
		last := recs[len(recs)-1]
		assert.Equal(t, "ERROR", last["level"])
		assert.Contains(t, last["msg"], "exa: ")
	}
}

// The Kubernetes libraries' lines are JSON too: a gateway discovering a
// Service's replicas as a user the API server forbids to list
// EndpointSlices logs its informer's errors as JSON objects. Before,
// controller-runtime's logger, never set, dropped them and 30 s later
// wrote "[controller-runtime] log.SetLogger(...) was never called" and a
// stack, in plain text.
func TestGatewayJSONLogsKlog(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver and etcd; not with -short")
	}
	env, _, err := k8stest.Start()
	if errors.Is(err, k8stest.ErrNoAssets) {
		t.Skip(err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Stop() })
	u, err := env.ControlPlane.AddUser(envtest.User{Name: "nobody"}, nil) // no RBAC: lists are forbidden
	require.NoError(t, err)
	kc, err := u.KubeConfig()
	require.NoError(t, err)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig, kc, 0o600))
	cmd := exec.Command(exaBin, "serve", "gateway", "--log-format", "json", "--listen", "127.0.0.1:0", "--config", newConfig(t),
		"--service", "vllm", "--pool-namespace", "default", "--pool-model", "m", "--kubeconfig", kubeconfig)
	cmd.Env = append(os.Environ(), "EXA_GATEWAY=")
	stderr, stdout := &fronttest.SyncBuffer{}, &fronttest.SyncBuffer{}
	cmd.Stderr, cmd.Stdout = stderr, stdout
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(stderr.String(), "forbidden") {
		require.True(t, time.Now().Before(deadline), "no line saying forbidden within 60 s; stderr: %s", stderr.String())
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	_ = cmd.Wait()
	requireJSONLines(t, "stdout", stdout.String())
	for _, rec := range requireJSONLines(t, "stderr", stderr.String()) {
		t.Logf("%v", rec)
	}
}

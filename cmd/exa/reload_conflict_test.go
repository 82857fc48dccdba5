package main

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway/config"
)

// Two fronts on one configuration (here two gateways; a gateway and a
// picker alike): when a model gets a KV-event bind endpoint, the process
// that binds second cannot apply the change, and `set` says so, naming
// the endpoint and the fix, and exits 1 instead of 0. A change both can
// apply exits 0.
func TestSetReportsReloadFailure(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two gateway processes")
	}
	cfg := newConfig(t)
	ok(t, cfg, "serve", "routing", "set", "JPCP", "--replica", "r0=http://127.0.0.1:1")
	var procs []*exec.Cmd
	for range 2 {
		cmd := exec.Command(exaBin, "serve", "gateway", "--listen", "127.0.0.1:0", "--config", cfg, "--reload-interval", "100ms")
		cmd.Env = append(os.Environ(), "EXA_GATEWAY=")
		var errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &errb, &errb
		require.NoError(t, cmd.Start())
		procs = append(procs, cmd)
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		})
	}
	// Both have loaded the file once.
	deadline := time.Now().Add(30 * time.Second)
	for len(readStatuses(cfg)) < 2 {
		require.True(t, time.Now().Before(deadline), "the gateways did not record their first load")
		time.Sleep(20 * time.Millisecond)
	}

	out := ok(t, cfg, "serve", "routing", "set", "JPCP", "--mode", "cache_aware")
	assert.Contains(t, out, "saved JPCP")

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ep := "tcp://" + l.Addr().String()
	require.NoError(t, l.Close())
	r := exa(t, cfg, "serve", "routing", "set", "JPCP", "--index", "exact", "--kv-events-bind", ep)
	assert.Equal(t, 1, r.code, "stdout %q stderr %q", r.stdout, r.stderr)
	t.Logf("set: %s", r.stderr)
	assert.Contains(t, r.stdout, "saved JPCP", "the file keeps the change")
	assert.Contains(t, r.stderr, "exa serve gateway (pid ")
	assert.Contains(t, r.stderr, ep)
	assert.Contains(t, r.stderr, "only one process can bind a KV-event endpoint")
	assert.Contains(t, r.stderr, "--kv-events-connect")
	m, err := config.Load(cfg)
	require.NoError(t, err)
	assert.Equal(t, ep, m.Models["JPCP"].KVEventsBind)
	for _, p := range procs {
		assert.Nil(t, p.ProcessState, "both gateways keep running")
	}
}

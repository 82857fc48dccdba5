package main

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"testing"

	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/internal/fronttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --otlp-sample-ratio NaN is refused as a usage error naming the flag
// and the value, as -1 and 2 are, rather than starting a gateway whose
// sampler is given NaN. The command either exits or prints its start-up
// line; whichever comes first decides.
func TestGatewayRefusesNaNSampleRatio(t *testing.T) {
	for _, v := range []string{"NaN", "-1", "2", "0"} {
		cmd := exec.Command(exaBin, "serve", "gateway", "--listen", "127.0.0.1:0", "--otlp-sample-ratio", v)
		cmd.Env = append(os.Environ(), config.EnvVar+"="+newConfig(t), "EXA_GATEWAY=")
		stderr := &fronttest.SyncBuffer{}
		cmd.Stderr = stderr
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		started := make(chan string, 1)
		go func() {
			sc := bufio.NewScanner(out)
			if sc.Scan() {
				started <- sc.Text()
			}
			close(started)
		}()
		line, serving := <-started
		if serving {
			_ = cmd.Process.Kill()
		}
		err = cmd.Wait()
		require.False(t, serving, "--otlp-sample-ratio %s: the gateway started: %q", v, line)
		var ee *exec.ExitError
		require.True(t, errors.As(err, &ee), "--otlp-sample-ratio %s: %v", v, err)
		assert.Equal(t, 2, ee.ExitCode(), "--otlp-sample-ratio %s: stderr %s", v, stderr.String())
		assert.Contains(t, stderr.String(), "invalid --otlp-sample-ratio "+v+": want a share in (0, 1]")
	}
}

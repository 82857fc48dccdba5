package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The discovery flags that only mean something with discovery on (and
// --service-port only with --service), and the lease timings only with
// --ha-enable-leader-election, are usage errors naming the flag and its
// value otherwise, rather than accepted and ignored.
func TestDiscoveryFlagsNeedDiscovery(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--pool-model", "llama"}, `invalid --pool-model "llama": needs --pool-name or --service`},
		{[]string{"--pool-namespace", "llm"}, `invalid --pool-namespace "llm": needs --pool-name or --service`},
		{[]string{"--kubeconfig", "/k/config"}, `invalid --kubeconfig "/k/config": needs --pool-name or --service`},
		{[]string{"--service-port", "http"}, `invalid --service-port "http": needs --service`},
		{[]string{"--pool-name", "p", "--service-port", "http"}, `invalid --service-port "http": needs --service`},
		{[]string{"--pool-name", "p", "--leader-lease-duration", "30s"}, `invalid --leader-lease-duration "30s": needs --ha-enable-leader-election`},
		{[]string{"--leader-retry-period", "1s"}, `invalid --leader-retry-period "1s": needs --ha-enable-leader-election`},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var fl pickerFlags
			cmd := pickerCommand(&fl)
			require.NoError(t, cmd.ParseFlags(tt.args))
			err := fl.gie.apply(cmd, &fl)
			if err == nil {
				err = fl.disc.validate()
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.Equal(t, 2, exitCode(err))
		})
	}
	// The same through the gateway's command (refused before its bad
	// --listen is tried), and the combinations that are meant still pass.
	r := exa(t, newConfig(t), "serve", "gateway", "--listen", "256.0.0.1:x", "--pool-model", "llama")
	assert.Equal(t, 2, r.code, "stderr: %s", r.stderr)
	assert.Contains(t, r.stderr, `exa: invalid --pool-model "llama": needs --pool-name or --service`)
	for _, args := range [][]string{
		{"--pool-name", "p", "--pool-namespace", "llm", "--pool-model", "llama", "--kubeconfig", "/k/config"},
		{"--service", "s", "--service-port", "http", "--pool-model", "llama"},
		{"--pool-name", "p", "--ha-enable-leader-election", "--leader-lease-duration", "30s"},
	} {
		var fl pickerFlags
		cmd := pickerCommand(&fl)
		require.NoError(t, cmd.ParseFlags(args))
		require.NoError(t, fl.gie.apply(cmd, &fl), "%q", args)
		require.NoError(t, fl.disc.validate(), "%q", args)
	}
}

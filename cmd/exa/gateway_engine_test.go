package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestGatewayBadEngineFlags: a bad --engine-client or a negative engine
// timeout is a usage error naming the flag, reported before anything
// listens.
func TestGatewayBadEngineFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--engine-client", "bogus"}, `invalid --engine-client "bogus": want pool or std`},
		{[]string{"--first-byte-timeout", "-1s"}, `invalid --first-byte-timeout "-1s": must not be negative`},
		{[]string{"--response-timeout", "-1s"}, `invalid --response-timeout "-1s": must not be negative`},
	} {
		t.Run(tt.args[0], func(t *testing.T) {
			r := exa(t, newConfig(t), append([]string{"serve", "gateway", "--listen", "127.0.0.1:0"}, tt.args...)...)
			assert.Equal(t, 2, r.code, "stderr: %s", r.stderr)
			assert.Contains(t, r.stderr, tt.want)
			assert.True(t, strings.HasPrefix(r.stderr, "exa: "), r.stderr)
		})
	}
}

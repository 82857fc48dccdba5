package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestPickerBadFlags: bad flags of `exa serve picker` are usage errors
// naming the flag and value, reported before anything serves.
func TestPickerBadFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-fallbacks", "-1"}, `invalid --max-fallbacks "-1": must not be negative`},
		{[]string{"--shed-above", "-2"}, `invalid --shed-above "-2": must not be negative`},
		{[]string{"--probe-interval", "0s"}, `invalid --probe-interval "0s": must be positive`},
		{[]string{"--discover-interval", "-1s"}, `invalid --discover-interval "-1s": must be positive`},
		{[]string{"--max-body-bytes", "0"}, `invalid --max-body-bytes "0": must be at least 1`},
		{[]string{"--kv-events-max-blocks", "0"}, `invalid --kv-events-max-blocks "0": must be at least 1`},
		{[]string{"--tokenize-max-bytes", "-1"}, `invalid --tokenize-max-bytes "-1": must be at least 1`},
		{[]string{"--log-level", "loud"}, `invalid --log-level "loud"`},
		{[]string{"--request-timeout", "-1s"}, `invalid --request-timeout "-1s": must not be negative`},
		{[]string{"--response-timeout", "-2s"}, `invalid --response-timeout "-2s": must not be negative`},
		{[]string{"--max-connection-age", "-1m"}, `invalid --max-connection-age "-1m0s": must not be negative`},
		{[]string{"--max-buffered-bytes", "8388608"}, `invalid --max-buffered-bytes "8388608": must be at least --max-body-bytes (8388608) + 32768`},
		{[]string{"--max-connections", "0"}, `invalid --max-connections "0": must be at least 1`},
		{[]string{"--handshake-timeout", "0s"}, `invalid --handshake-timeout "0s": must be positive`},
		{[]string{"--max-connection-idle", "-1s"}, `invalid --max-connection-idle "-1s": must not be negative`},
		{[]string{"--peer-token-file", "/nonexistent/token"}, `invalid --peer-token-file "/nonexistent/token"`},
		{[]string{"--ejection-time", "-1s"}, `invalid --ejection-time "-1s": must not be negative`},
		{[]string{"--max-ejection-percent", "101"}, `invalid --max-ejection-percent "101": want 1 to 100`},
		{[]string{"--shed-queue-depth", "-1"}, `invalid --shed-queue-depth "-1": must not be negative`},
		{[]string{"--shed-kv", "1.5"}, `invalid --shed-kv "1.5": want 0..1`},
		{[]string{"--shed-outstanding", "-3"}, `invalid --shed-outstanding "-3": must not be negative`},
		{[]string{"--shed-pending-prefill", "-2"}, `invalid --shed-pending-prefill "-2": must not be negative`},
		{[]string{"--flow-control", "--flow-usage-limit", "0=1.5"}, `invalid --flow-usage-limit "0=1.5": want PRIORITY=FRACTION`},
		{[]string{"--flow-control", "--flow-usage-limit", "0=0.5", "--flow-usage-limit", "0=0.7"}, `invalid --flow-usage-limit "0=0.7": priority 0 is named twice`},
		{[]string{"--flow-usage-limit", "0=0.5"}, `invalid --flow-usage-limit "0=0.5": usage limits need --flow-control`},
		{[]string{"--shed-staleness", "-1s"}, `invalid --shed-staleness "-1s": must not be negative`},
		{[]string{"--max-concurrent-streams", "0"}, `invalid --max-concurrent-streams "0": must be at least 1`},
		{[]string{"--listen", "256.0.0.1:x"}, `invalid --listen "256.0.0.1:x"`},
		{[]string{"--admin-listen", "256.0.0.1:x"}, `invalid --admin-listen "256.0.0.1:x"`},
	} {
		t.Run(tt.args[0], func(t *testing.T) {
			args := append([]string{"serve", "picker", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, tt.args...)
			r := exa(t, newConfig(t), args...)
			assert.Equal(t, 2, r.code, "stderr: %s", r.stderr)
			assert.Contains(t, r.stderr, "exa: "+tt.want)
		})
	}
}

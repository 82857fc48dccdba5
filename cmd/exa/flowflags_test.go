package main

import (
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway/flow"
)

// Flow control's flags: a bad value is a usage error naming the flag and
// the value, in both serve commands; good ones become flow.Options.
func TestFlowFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--flow-control", "--flow-ttl", "0s"}, `invalid --flow-ttl "0s"`},
		{[]string{"--flow-control", "--flow-max-bytes", "0"}, `invalid --flow-max-bytes "0"`},
		{[]string{"--flow-control", "--flow-fairness", "lottery"}, `invalid --flow-fairness "lottery"`},
		{[]string{"--flow-control", "--flow-order", "lifo"}, `invalid --flow-order "lifo"`},
		{[]string{"--flow-control", "--objective", "chat"}, `invalid --objective "chat"`},
		{[]string{"--flow-control", "--objective", "chat=1", "--objective", "chat=2"}, `objective "chat" is named twice`},
		{[]string{"--objective", "chat=1"}, `objectives need --flow-control`},
		{[]string{"--flow-control", "--fairness-header", "a b"}, `invalid --fairness-header "a b"`},
	} {
		for _, cmd := range []string{"gateway", "picker"} {
			r := exa(t, newConfig(t), append([]string{"serve", cmd}, tc.args...)...)
			assert.Equal(t, 2, r.code, "%s %v: %s", cmd, tc.args, r.stderr)
			assert.Contains(t, r.stderr, tc.want, "%s %v", cmd, tc.args)
		}
	}
	r := exa(t, newConfig(t), "serve", "picker", "--flow-control", "--flow-ttl", "90s")
	assert.Equal(t, 2, r.code, r.stderr)
	assert.Contains(t, r.stderr, `invalid --flow-ttl "1m30s": must be shorter than --request-timeout (1m0s)`)
	var f flowFlags
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	f.register(fs)
	require.NoError(t, fs.Parse([]string{"--flow-control", "--flow-ttl", "3s", "--flow-fairness", "global-strict", "--flow-order", "edf",
		"--objective", "interactive=10", "--objective", "batch=-1", "--flow-max-requests", "99", "--fairness-header", "x-tenant"}))
	o, err := f.options()
	require.NoError(t, err)
	assert.Equal(t, flow.Options{Enabled: true, FairnessHeader: "x-tenant", Retry: flow.DefaultRetry, Objectives: map[string]int{"interactive": 10, "batch": -1},
		Queue: flow.Config{TTL: 3 * time.Second, MaxFlows: flow.DefaultMaxFlows, Fairness: flow.GlobalStrict, Order: flow.EDF,
			Total: flow.Limits{MaxBytes: flow.DefaultMaxBytes, MaxRequests: 99}}}, o)
}

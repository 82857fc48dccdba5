package main

import (
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway/internal/front"
)

// The objectives' flags: a bad value is a usage error naming the flag
// and the value; good ones become front.Objectives.
func TestSLOFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--slo-ttft", "fast"}, `invalid --slo-ttft "fast"`},
		{[]string{"--slo-ttft", "m=0s"}, `invalid --slo-ttft "m=0s"`},
		{[]string{"--slo-tpot", "m=-1ms"}, `invalid --slo-tpot "m=-1ms"`},
		{[]string{"--slo-tpot", "2h"}, `invalid --slo-tpot "2h": want [MODEL=]DURATION, a duration in (0, 1h0m0s]`},
		{[]string{"--slo-ttft", "=1s"}, `invalid --slo-ttft "=1s"`},
		{[]string{"--slo-ttft", "m=1s", "--slo-ttft", "m=2s"}, `model "m" is given twice`},
		{[]string{"--slo-unattainable", "drop"}, `invalid --slo-unattainable "drop": want best-effort or reject`},
	} {
		for _, front := range []string{"gateway", "picker"} {
			r := exa(t, newConfig(t), append([]string{"serve", front}, tc.args...)...)
			assert.Equal(t, 2, r.code, "%s %v: %s", front, tc.args, r.stderr)
			assert.Contains(t, r.stderr, tc.want, "%s %v", front, tc.args)
		}
	}
	var f sloFlags
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	f.register(fs)
	require.NoError(t, fs.Parse([]string{"--slo-ttft", "500ms", "--slo-ttft", "org/model=v1=2s", "--slo-tpot", "org/model=v1=40ms",
		"--slo-unattainable", "reject"}))
	o, err := f.options()
	require.NoError(t, err)
	assert.Equal(t, front.Objectives{Unattainable: front.Reject, Defaults: map[string]front.SLO{
		"*":            {TTFT: 500 * time.Millisecond},
		"org/model=v1": {TTFT: 2 * time.Second, TPOT: 40 * time.Millisecond},
	}}, o)
	var none sloFlags
	fs = pflag.NewFlagSet("t", pflag.ContinueOnError)
	none.register(fs)
	require.NoError(t, fs.Parse(nil))
	o, err = none.options()
	require.NoError(t, err)
	assert.Equal(t, front.Objectives{}, o)
}

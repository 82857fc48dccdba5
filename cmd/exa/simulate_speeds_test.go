package main

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Mixed pools, speed changes and per-request objectives from the command
// line: the report states them, the same flags give the same output, and
// bad flags are usage errors naming the flag and value.
func TestSimulateSpeedsAndObjectives(t *testing.T) {
	cfg := newConfig(t)
	args := []string{"serve", "routing", "simulate", "--replicas", "4", "--requests", "600", "--policies", "cache_aware",
		"--replica-speeds", "1,0.5", "--speed-change", "0@5s=0.25", "--speed-change", "1@8s=2,2@9s=1"}
	out := ok(t, cfg, args...)
	for _, want := range []string{
		"compute speeds 1, 0.5 × the preset's, cycled over the replicas; r0 at 5s → 0.25×; r1 at 8s → 2×; r2 at 9s → 1×",
		"work by replica speed",
		"cache_aware: speed 1→0.25@5s ×1: requests ",
		"speed 0.5 ×1: requests ",
	} {
		assert.Contains(t, out, want)
	}
	assert.Equal(t, out, ok(t, cfg, args...))

	slo := ok(t, cfg, "serve", "routing", "simulate", "--replicas", "2", "--workload", "slo-classes", "--requests", "300", "--policies", "cache_aware")
	assert.Contains(t, slo, "classes interactive (priority 2, SLO 250ms, TPOT 25ms, share 1)")
	assert.Contains(t, slo, "per class objectives")
	own := ok(t, cfg, "serve", "routing", "simulate", "--replicas", "2", "--workload", "chat", "--requests", "300", "--policies", "cache_aware",
		"--slo-classes", "fast:ttft=200ms,tpot=20ms;slow:ttft=5s,tpot=200ms,share=3", "--json")
	assert.Contains(t, own, `"tpot_attainment"`)
	assert.Contains(t, own, `fast (priority 0, SLO 200ms, TPOT 20ms, share 1), slow (priority 0, SLO 5s, TPOT 200ms, share 3)`)
	plain := ok(t, cfg, "serve", "routing", "simulate", "--replicas", "2", "--requests", "100", "--policies", "cache_aware")
	assert.NotContains(t, plain, "speed")
	assert.NotContains(t, plain, "objectives")

	ok(t, cfg, "serve", "routing", "set", "JPCP", "--mode", "cache_aware")
	before, err := os.ReadFile(cfg)
	require.NoError(t, err)
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--replica-speeds", "1,0"}, "invalid --replica-speeds 0: want multipliers 0.001..1000"},
		{[]string{"--replica-speeds", "NaN"}, "invalid --replica-speeds NaN"},
		{[]string{"--replica-speeds", "fast"}, `invalid --replica-speeds "fast"`},
		{[]string{"--replicas", "2", "--replica-speeds", "1,1,1"}, "invalid --replica-speeds: 3 speeds for 2 replicas"},
		{[]string{"--speed-change", "0@5s"}, `invalid --speed-change "0@5s": speed change "0@5s": want REPLICA@AT=SPEED`},
		{[]string{"--replicas", "2", "--speed-change", "2@5s=1"}, `invalid --speed-change "2@5s=1": replica 2, want 0..1`},
		{[]string{"--speed-change", "0@5s=-1"}, `Speed -1, want a finite multiplier`},
		{[]string{"--slo-classes", "a:colour=red"}, `invalid --slo-classes "a:colour=red": class "a": key "colour" unknown`},
		{[]string{"--slo-classes", "a;a"}, `class "a" named twice`},
		{[]string{"--workload", "interactive-batch", "--slo-classes", "a"}, "--slo-classes does not apply to --workload interactive-batch"},
	} {
		r := exa(t, cfg, append([]string{"serve", "routing", "simulate", "--requests", "10"}, tc.args...)...)
		assertRejected(t, r, tc.msg, cfg, before)
	}
}

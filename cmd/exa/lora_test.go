package main

import (
	"testing"

	"github.com/examlops/gateway/config"
	"github.com/stretchr/testify/assert"
)

func TestSetAdapters(t *testing.T) {
	testListFlag(t, listFlagCase{
		flag: "--adapter", clear: "--clear-adapters",
		first:  []string{"sql", "support"},
		shown:  "adapters:     sql, support (allow-list)",
		label:  "adapters:",
		second: "chat",
		other:  []string{"--mode", "load_aware"},
		get:    func(m config.Model) []string { return m.Adapters },
		rejected: []rejectCase{
			{[]string{"--adapter", "a", "--adapter", "a"}, `invalid --adapter: adapters[1] "a": listed twice`},
			{[]string{"--adapter", ""}, `invalid --adapter: adapters[0] "": must not be empty`},
			{[]string{"--adapter", "a", "--clear-adapters"}, `--adapter and --clear-adapters cannot be used together`},
		},
	})
}

func TestSimulateLoRA(t *testing.T) {
	cfg := newConfig(t)
	out := ok(t, cfg, "serve", "routing", "simulate", "--workload", "lora", "--requests", "200", "--policies", "cache_aware,gie_lora", "--progress", "never")
	assert.Contains(t, out, "workload: lora: 200 requests, Poisson 24/s, 8 adapters (Zipf 1.1)")
	assert.Contains(t, out, "adapters: 1 slot(s) per replica (max_loras), 30ms per adapter load")
	assert.Regexp(t, `(?m)^gie_lora\s+\d+`, out)
	assert.Regexp(t, `(?m)^round_robin\s+\d+`, out, "round_robin is always included")
	out = ok(t, cfg, "serve", "routing", "simulate", "--workload", "lora", "--requests", "100", "--policies", "cache_aware",
		"--lora-adapters", "3", "--max-loras", "2", "--adapter-load-ms", "0", "--progress", "never")
	assert.Contains(t, out, "3 adapters")
	assert.Contains(t, out, "adapters: 2 slot(s) per replica (max_loras), 0 per adapter load")

	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--max-loras", "2"}, "--max-loras applies to --workload lora only"},
		{[]string{"--workload", "chat", "--lora-adapters", "2"}, "--lora-adapters applies to --workload lora only"},
		{[]string{"--workload", "lora", "--lora-adapters", "0"}, "invalid --lora-adapters 0: want 1..65536"},
		{[]string{"--workload", "lora", "--max-loras", "-1"}, "invalid --max-loras -1: want 1..65536"},
		{[]string{"--workload", "lora", "--adapter-load-ms", "NaN"}, "invalid --adapter-load-ms NaN: want 0..3600000 milliseconds"},
	} {
		r := exa(t, cfg, append([]string{"serve", "routing", "simulate"}, tc.args...)...)
		assert.Equal(t, 2, r.code, "%v: %s", tc.args, r.stderr)
		assert.Contains(t, r.stderr, tc.msg)
	}
}

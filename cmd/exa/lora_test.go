package main

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSetAdapters(t *testing.T) {
	cfg := newConfig(t)
	out := ok(t, cfg, "serve", "routing", "set", "M", "--mode", "cache_aware", "--adapter", "sql", "--adapter", "support")
	assert.Contains(t, out, "adapters:     sql, support (allow-list)")
	assert.Equal(t, []string{"sql", "support"}, getModel(t, cfg, "M").Adapters)
	ok(t, cfg, "serve", "routing", "set", "M", "--adapter", "chat")
	assert.Equal(t, []string{"chat"}, getModel(t, cfg, "M").Adapters, "replaces the list")
	ok(t, cfg, "serve", "routing", "set", "M", "--mode", "load_aware")
	assert.Equal(t, []string{"chat"}, getModel(t, cfg, "M").Adapters, "kept when not given")
	out = ok(t, cfg, "serve", "routing", "set", "M", "--clear-adapters")
	assert.NotContains(t, out, "adapters:")
	assert.Nil(t, getModel(t, cfg, "M").Adapters)

	before, err := os.ReadFile(cfg)
	require.NoError(t, err)
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--adapter", "a", "--adapter", "a"}, `invalid --adapter: adapters[1] "a": listed twice`},
		{[]string{"--adapter", ""}, `invalid --adapter: adapters[0] "": must not be empty`},
		{[]string{"--adapter", "a", "--clear-adapters"}, `--adapter and --clear-adapters cannot be used together`},
	} {
		r := exa(t, cfg, append([]string{"serve", "routing", "set", "M"}, tc.args...)...)
		assertRejected(t, r, tc.msg, cfg, before)
	}
}

package main

import (
	"os"
	"testing"

	"github.com/examlops/gateway/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// listFlagCase is a list flag of "exa serve routing set" (--adapter,
// --peer) with its --clear- flag, as testListFlag exercises it.
type listFlagCase struct {
	flag, clear string                      // "--adapter", "--clear-adapters"
	first       []string                    // the values set with --mode cache_aware
	shown       string                      // the line set prints for first
	label       string                      // that line's label, gone once cleared
	second      string                      // the value that then replaces first
	other       []string                    // a set that does not name the flag
	get         func(config.Model) []string // the list in the stored model
	rejected    []rejectCase                // bad uses of the flags
}

// rejectCase is arguments of "exa serve routing set M" and the error they get.
type rejectCase struct {
	args []string
	msg  string
}

// testListFlag checks that the flag sets the list, replaces it when given
// again, keeps it when not given, clears it with the --clear- flag, and that
// bad uses are rejected with the config file untouched.
func testListFlag(t *testing.T, lc listFlagCase) {
	cfg := newConfig(t)
	args := []string{"serve", "routing", "set", "M", "--mode", "cache_aware"}
	for _, v := range lc.first {
		args = append(args, lc.flag, v)
	}
	out := ok(t, cfg, args...)
	assert.Contains(t, out, lc.shown)
	assert.Equal(t, lc.first, lc.get(getModel(t, cfg, "M")))
	ok(t, cfg, "serve", "routing", "set", "M", lc.flag, lc.second)
	assert.Equal(t, []string{lc.second}, lc.get(getModel(t, cfg, "M")), "replaces the list")
	ok(t, cfg, append([]string{"serve", "routing", "set", "M"}, lc.other...)...)
	assert.Equal(t, []string{lc.second}, lc.get(getModel(t, cfg, "M")), "kept when not given")
	out = ok(t, cfg, "serve", "routing", "set", "M", lc.clear)
	assert.NotContains(t, out, lc.label)
	assert.Nil(t, lc.get(getModel(t, cfg, "M")))

	before, err := os.ReadFile(cfg)
	require.NoError(t, err)
	for _, tc := range lc.rejected {
		r := exa(t, cfg, append([]string{"serve", "routing", "set", "M"}, tc.args...)...)
		assertRejected(t, r, tc.msg, cfg, before)
	}
}

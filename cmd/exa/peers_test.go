package main

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSetPeers(t *testing.T) {
	cfg := newConfig(t)
	out := ok(t, cfg, "serve", "routing", "set", "M", "--mode", "cache_aware", "--peer", "http://gw-b:8080", "--peer", "gw-c:8080")
	assert.Contains(t, out, "peers:        http://gw-b:8080, gw-c:8080 (their pending prefill is added to this gateway's)")
	assert.Equal(t, []string{"http://gw-b:8080", "gw-c:8080"}, getModel(t, cfg, "M").Peers)
	ok(t, cfg, "serve", "routing", "set", "M", "--peer", "http://gw-d:8080")
	assert.Equal(t, []string{"http://gw-d:8080"}, getModel(t, cfg, "M").Peers, "replaces the list")
	ok(t, cfg, "serve", "routing", "set", "M", "--slo-latency-ms", "400")
	assert.Equal(t, []string{"http://gw-d:8080"}, getModel(t, cfg, "M").Peers, "kept when not given")
	out = ok(t, cfg, "serve", "routing", "set", "M", "--clear-peers")
	assert.NotContains(t, out, "peers:")
	assert.Nil(t, getModel(t, cfg, "M").Peers)

	before, err := os.ReadFile(cfg)
	require.NoError(t, err)
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--peer", "http://a:1", "--peer", "http://a:1/"}, `invalid --peer: peers[1] "http://a:1/": the same gateway as peers[0]`},
		{[]string{"--peer", "ftp://a"}, `invalid --peer: peers[0] "ftp://a": scheme "ftp", want http or https`},
		{[]string{"--peer", ""}, `invalid --peer: peers[0] "": must not be empty`},
		{[]string{"--peer", "http://a:1", "--clear-peers"}, `--peer and --clear-peers cannot be used together`},
	} {
		r := exa(t, cfg, append([]string{"serve", "routing", "set", "M"}, tc.args...)...)
		assertRejected(t, r, tc.msg, cfg, before)
	}
}

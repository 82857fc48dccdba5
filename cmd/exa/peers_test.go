package main

import (
	"testing"

	"github.com/examlops/gateway/config"
)

func TestSetPeers(t *testing.T) {
	testListFlag(t, listFlagCase{
		flag: "--peer", clear: "--clear-peers",
		first:  []string{"http://gw-b:8080", "gw-c:8080"},
		shown:  "peers:        http://gw-b:8080, gw-c:8080 (their pending prefill is added to this gateway's)",
		label:  "peers:",
		second: "http://gw-d:8080",
		other:  []string{"--slo-latency-ms", "400"},
		get:    func(m config.Model) []string { return m.Peers },
		rejected: []rejectCase{
			{[]string{"--peer", "http://a:1", "--peer", "http://a:1/"}, `invalid --peer: peers[1] "http://a:1/": the same gateway as peers[0]`},
			{[]string{"--peer", "ftp://a"}, `invalid --peer: peers[0] "ftp://a": scheme "ftp", want http or https`},
			{[]string{"--peer", ""}, `invalid --peer: peers[0] "": must not be empty`},
			{[]string{"--peer", "http://a:1", "--clear-peers"}, `--peer and --clear-peers cannot be used together`},
		},
	})
}

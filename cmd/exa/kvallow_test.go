package main

import (
	"testing"

	"github.com/examlops/gateway/config"
)

func TestSetKVEventsAllow(t *testing.T) {
	testListFlag(t, listFlagCase{
		flag: "--kv-events-allow", clear: "--clear-kv-events-allow",
		first:  []string{"10.0.1.5", "10.0.2.0/24"},
		shown:  "events from:  10.0.1.5, 10.0.2.0/24 (may publish KV events besides the replicas' hosts)",
		label:  "events from:",
		second: "fd00::/8",
		other:  []string{"--slo-latency-ms", "400"},
		get:    func(m config.Model) []string { return m.KVEventsAllow },
		rejected: []rejectCase{
			{[]string{"--kv-events-allow", "pod-1"}, `invalid --kv-events-allow: kv_events_allow[0] "pod-1": want an IP address or a CIDR prefix (10.0.0.0/24)`},
			{[]string{"--kv-events-allow", "10.0.0.1", "--kv-events-allow", "10.0.0.1"}, `invalid --kv-events-allow: kv_events_allow[1] "10.0.0.1": listed twice (kv_events_allow[0])`},
			{[]string{"--kv-events-allow", "10.0.0.1", "--clear-kv-events-allow"}, `--kv-events-allow and --clear-kv-events-allow cannot be used together`},
		},
	})
}

// Command quickstart routes a few requests with the cache-aware policy and
// prints each decision: the first request for a prefix goes by load, the
// repeats go by affinity to the replica that holds it.
//
//	go run ./examples/quickstart
package main

import (
	"fmt"
	"log"
	"time"

	"github.com/examlops/gateway"
)

func main() {
	gw, err := gateway.New(
		[]gateway.Replica{{Name: "r0", Address: "http://127.0.0.1:8001"}, {Name: "r1", Address: "http://127.0.0.1:8002"}, {Name: "r2", Address: "http://127.0.0.1:8003"}},
		gateway.WithMode(gateway.ModeCacheAware),
		gateway.WithSLOLatency(500*time.Millisecond),
	)
	if err != nil {
		log.Fatal(err)
	}
	system := "You are a support assistant for Example Corp. Answer briefly and cite the manual."
	for _, req := range []struct{ session, rag string }{
		{"sess-1", "manual-ch1"},
		{"sess-2", "manual-ch7"},
		{"sess-1", "manual-ch1"},
		{"sess-3", ""},
		{"sess-2", "manual-ch7"},
	} {
		key := gateway.PrefixKey(system, req.session, req.rag)
		d, err := gw.Route(key)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%-7s %-11s -> %s (%s) %-10s matched %d/%d blocks, hit=%v\n",
			req.session, req.rag, d.Replica, d.Address, d.Kind, d.Matched, d.Blocks, d.Hit)
		d.Done(gateway.DoneInfo{Latency: 80 * time.Millisecond})
	}

	res, err := gateway.DisaggregatedRoute(gateway.PrefixKey(system, "sess-9", ""),
		[]gateway.Replica{{Name: "p0"}, {Name: "p1"}}, []gateway.Replica{{Name: "d0"}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("disaggregated: prefill %s, decode %s, identical output: %v (%d-byte KV transfer)\n",
		res.PrefillReplica, res.DecodeReplica, res.IdenticalOutput, res.KVBytes)
	s := gw.Stats()
	fmt.Printf("decisions: %v, hit rate %.0f%%\n", s.ByKind, 100*s.HitRate())
}

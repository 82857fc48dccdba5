// Command quickstart is the README's quick start made runnable: it routes
// requests with the cache-aware policy and prints each decision. The
// first request for a prefix goes by load; repeats, and later turns that
// extend it, go by affinity to the replica that holds it, while a new
// system prompt goes to another replica.
//
//	go run ./examples/quickstart
package main

import (
	"fmt"
	"log"
	"slices"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/keys"
)

func main() {
	gw, err := gateway.New(
		[]gateway.Replica{{Name: "r0"}, {Name: "r1"}, {Name: "r2"}, {Name: "r3"}},
		gateway.WithMode(gateway.ModeCacheAware),
		gateway.WithSLOLatency(500*time.Millisecond), // avoid replicas over the latency SLO
	)
	if err != nil {
		log.Fatal(err)
	}
	key := keys.PrefixKey("You are a helpful assistant.", "sess-42", "doc-hash") // system prompt, session, RAG context

	d, err := gw.Route(key)
	if err != nil {
		log.Fatal(err)
	}
	show("sess-42", d)
	// ... send the request to d.Address ...
	d.FirstToken()
	d.Done(gateway.DoneInfo{Latency: 40 * time.Millisecond})

	// More requests: the same session again, another session of the same
	// assistant, and a session of another assistant.
	for _, r := range []struct{ system, session, rag string }{
		{"You are a helpful assistant.", "sess-42", "doc-hash"},
		{"You are a helpful assistant.", "sess-43", ""},
		{"You are a Go reviewer. Point out bugs first, then style.", "sess-44", ""},
	} {
		d, err := gw.Route(keys.PrefixKey(r.system, r.session, r.rag))
		if err != nil {
			log.Fatal(err)
		}
		show(r.session, d)
		d.Done(gateway.DoneInfo{Latency: 40 * time.Millisecond})
	}

	rate, err := gateway.MeasureHitRate(gw, slices.Repeat([]gateway.Key{key}, 100))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("hit rate of 100 repeats: %.2f\n", rate)

	prefill, _ := gateway.New([]gateway.Replica{{Name: "p0"}}, gateway.WithMode(gateway.ModeCacheAware))
	decode, _ := gateway.New([]gateway.Replica{{Name: "d0"}}, gateway.WithMode(gateway.ModeLoadAware))
	pd := gateway.PD{Prefill: prefill, Decode: decode, MinUncached: 32} // split when 32+ prompt tokens are uncached
	plan, err := pd.Route(key, 16, gateway.Target{}, gateway.Target{})  // 16 tokens a block
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("disaggregated: split %v, prefill %s, decode %s, %d tokens uncached on the decode replica\n",
		plan.Split, plan.Prefill.Replica, plan.Decode.Replica, plan.Uncached)
	plan.Prefill.Done(gateway.DoneInfo{})
	plan.Decode.Done(gateway.DoneInfo{})
	s := gw.Stats()
	fmt.Printf("decisions: %v, hit rate %.0f%%\n", s.ByKind, 100*float64(s.Hits)/float64(s.Routed))
}

func show(session string, d gateway.Decision) {
	fmt.Printf("%-7s -> %s  %-10s matched %d/%d blocks, hit=%v\n", session, d.Replica, d.Kind, d.Matched, d.Blocks, d.Hit)
}

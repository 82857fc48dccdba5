package gateway_test

import (
	"fmt"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/keys"
)

func repeat(k gateway.Key, n int) []gateway.Key {
	keys := make([]gateway.Key, n)
	for i := range keys {
		keys[i] = k
	}
	return keys
}

// The README's quick start, line for line (TestReadmeQuickStart checks
// it): cache-aware routing with a latency SLO.
func Example() {
	gw, err := gateway.New(
		[]gateway.Replica{{Name: "r0"}, {Name: "r1"}, {Name: "r2"}, {Name: "r3"}},
		gateway.WithMode(gateway.ModeCacheAware),
		gateway.WithSLOLatency(500*time.Millisecond), // avoid replicas over the latency SLO
	)
	if err != nil {
		panic(err)
	}
	key := keys.PrefixKey("You are a helpful assistant.", "sess-42", "doc-hash") // system prompt, session, RAG context

	d, err := gw.Route(key)
	if err != nil {
		panic(err)
	}
	fmt.Println(d.Replica, d.Kind, d.Hit, d.Matched, d.Blocks)
	// ... send the request to d.Address ...
	d.FirstToken()
	d.Done(gateway.DoneInfo{Latency: 40 * time.Millisecond})

	rate, err := gateway.MeasureHitRate(gw, repeat(key, 100))
	if err != nil {
		panic(err)
	}
	fmt.Printf("cache-aware hit rate: %.2f\n", rate)
	rr, _ := gateway.New([]gateway.Replica{{Name: "r0"}, {Name: "r1"}, {Name: "r2"}, {Name: "r3"}})
	rrRate, _ := gateway.MeasureHitRate(rr, repeat(key, 100))
	fmt.Printf("round-robin hit rate: %.2f\n", rrRate)

	prefill, _ := gateway.New([]gateway.Replica{{Name: "p0"}}, gateway.WithMode(gateway.ModeCacheAware))
	decode, _ := gateway.New([]gateway.Replica{{Name: "d0"}}, gateway.WithMode(gateway.ModeLoadAware))
	pd := gateway.PD{Prefill: prefill, Decode: decode, MinUncached: 32} // split when 32+ prompt tokens are uncached
	plan, err := pd.Route(key, 16, gateway.Target{}, gateway.Target{})  // 16 tokens a block
	if err != nil {
		panic(err)
	}
	fmt.Println(plan.Split, plan.Prefill.Replica, plan.Decode.Replica, plan.Uncached)
	// Output:
	// r0 load_aware false 0 3
	// cache-aware hit rate: 1.00
	// round-robin hit rate: 0.96
	// true p0 d0 48
}

// Replicas over the SLO are avoided; if all breach, the healthy set is used.
func ExampleWithSLOLatency() {
	now := time.Unix(0, 0)
	gw, _ := gateway.New(
		[]gateway.Replica{{Name: "fast"}, {Name: "slow"}},
		gateway.WithMode(gateway.ModeLoadAware),
		gateway.WithSLOLatency(500*time.Millisecond),
		gateway.WithClock(func() time.Time { return now }),
	)
	_ = gw.UpdateLoad("slow", gateway.Load{Latency: 900 * time.Millisecond})
	_ = gw.UpdateLoad("fast", gateway.Load{QueueDepth: 8, Latency: 100 * time.Millisecond})
	d, _ := gw.Route(keys.PrefixKey("sys", "", ""))
	fmt.Println(d.Replica, d.Fallback)

	_ = gw.UpdateLoad("fast", gateway.Load{Latency: 700 * time.Millisecond})
	d, _ = gw.Route(keys.PrefixKey("sys", "", ""))
	fmt.Println(d.Replica, d.Fallback)
	// Output:
	// fast none
	// slow slo
}

// Keys share leading blocks exactly as far as their content agrees.
func ExamplePrefixKey() {
	a := keys.PrefixKey("You are a helpful assistant.", "user-1", "")
	b := keys.PrefixKey("You are a helpful assistant.", "user-2", "")
	shared := 0
	for shared < min(len(a), len(b)) && a[shared] == b[shared] {
		shared++
	}
	fmt.Println(len(a), len(b), shared)
	// Output: 2 2 1
}

package gateway_test

import (
	"fmt"
	"slices"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/keys"
)

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

	rate, err := gateway.MeasureHitRate(gw, slices.Repeat([]gateway.Key{key}, 100))
	if err != nil {
		panic(err)
	}
	fmt.Printf("cache-aware hit rate: %.2f\n", rate)
	rr, _ := gateway.New([]gateway.Replica{{Name: "r0"}, {Name: "r1"}, {Name: "r2"}, {Name: "r3"}})
	rrRate, _ := gateway.MeasureHitRate(rr, slices.Repeat([]gateway.Key{key}, 100))
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

// The gateway learns each replica's speed from what the front reports at
// each request's end, then routes a request with its own objective to a
// replica predicted to meet it.
func ExampleTarget_objective() {
	gw, _ := gateway.New([]gateway.Replica{{Name: "h100"}, {Name: "l40s"}}, gateway.WithMode(gateway.ModeCacheAware))
	perBlock := map[string]time.Duration{"h100": 10 * time.Millisecond, "l40s": 40 * time.Millisecond}
	for i := range 200 { // what the front saw of 200 requests, one at a time
		d, _ := gw.Route(keys.AppendHashes(nil, []uint64{uint64(i), 1, 2, 3}))
		ttft := perBlock[d.Replica] * time.Duration(d.Blocks-d.Matched+1)
		d.Done(gateway.DoneInfo{TTFT: ttft, Elapsed: ttft + 100*perBlock[d.Replica], OutputTokens: 101})
	}
	for _, st := range gw.Replicas() {
		fmt.Println(st.Name, st.BlockTime.Round(time.Millisecond), st.TokenTime.Round(time.Millisecond))
	}
	d, _ := gw.RouteWith(keys.AppendHashes(nil, []uint64{999, 1, 2, 3}), gateway.Target{TTFT: 100 * time.Millisecond})
	fmt.Println(d.Replica, d.PredictedTTFT.Round(time.Millisecond), d.Fallback)
	// Output:
	// h100 10ms 10ms
	// l40s 40ms 40ms
	// h100 50ms no_match
}

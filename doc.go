// Package gateway routes LLM inference requests across model-server
// replicas (vLLM, SGLang and the like) by KV/prefix-cache affinity: a
// replica that already holds the KV cache of a request's leading tokens
// (system prompt, session, RAG context) skips computing them again.
//
// A Gateway keeps a table of replicas with their load signals and an index
// of the prefix blocks each holds, and picks a replica per request with a
// Policy: RoundRobin (the default), CacheAware (the longest cached prefix,
// guarded by load, hot prefixes replicated; when every engine has requests
// waiting, long prompts sent where few wait, CacheAware.WaitingWeight) or
// LoadAware (the least loaded). Unhealthy replicas are never chosen; replicas over the latency
// SLO are left out unless every healthy one breaches it.
//
// The gateway learns each replica's speed from what the caller reports at
// a request's end (DoneInfo's TTFT, Elapsed and OutputTokens; speed.go):
// its time per block of prefill and per output token, which CacheAware
// prices candidates by (between classes of speed, a hot prefix's placement
// over the requests that will hit it) and which predict a request's TTFT and TPOT
// (Decision.PredictedTTFT). A request may carry its own latency objective
// (Target.TTFT, Target.TPOT); with no data, routing is as before.
//
// Every routing decision a front makes is a function here, called alike by
// the HTTP gateway (package httpgw), the endpoint picker (package picker)
// and the simulator (package sim):
//
//   - Route and RouteWith: a replica for a request, within a Target (the
//     replicas allowed, one a retry leaves out, a LoRA adapter; or a
//     request without a prompt, such as embeddings, routed by load);
//   - PD.Route: the plan of a disaggregated model (decode replica, whether
//     to split, prefill replica);
//   - Saturated: whether to shed a request (Admission's rule);
//   - Spares: the replicas a data plane may fall back to.
//
// A request's prefix is a Key, a chain of block hashes; package keys builds
// every Key, from text, token ids, hash ids or an OpenAI request body.
// Every decision is a function of the key and the gateway's state alone,
// so the rules are testable without an engine:
//
//	gw, err := gateway.New(replicas, gateway.WithMode(gateway.ModeCacheAware))
//	d, err := gw.Route(keys.PrefixKey(system, session, rag))
//	// ... send the request to d.Address ...
//	d.FirstToken()                             // optional: prefill finished
//	d.Done(gateway.DoneInfo{Latency: elapsed, // frees load, feeds latency
//		TTFT: ttft, Elapsed: elapsed, OutputTokens: n}) // and the replica's speed
//
// Every exported function and method is safe for concurrent use. Load and
// health updates are atomics, and so is each replica's published speed
// (its fit is updated under a lock of its own, at Done); Route does not
// allocate and holds one short mutex, under which a Policy's Pick runs, so
// Pick must not block.
// Saturated and Spares read an immutable snapshot of the replica table and
// take no lock.
package gateway

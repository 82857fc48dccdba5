// Package gateway routes LLM inference requests across model-server
// replicas (vLLM, SGLang and the like) by KV/prefix-cache affinity: a
// replica that already holds the KV cache of a request's leading tokens
// (system prompt, session, RAG context) skips computing them again.
//
// A Gateway keeps a table of replicas with their load signals and an index
// of the prefix blocks each holds, and picks a replica per request with a
// Policy: RoundRobin (the default), CacheAware (the longest cached prefix,
// guarded by load, hot prefixes replicated) or LoadAware (the least
// loaded). Unhealthy replicas are never chosen; replicas over the latency
// SLO are left out unless every healthy one breaches it.
//
// A request's prefix is a Key, a chain of block hashes built from text
// (keys.PrefixKey, keys.Hasher), token ids (keys.AppendTokens) or pre-hashed block ids
// (keys.AppendHashes). Every decision is a function of the key and the
// gateway's state alone, so the rules are testable without an engine:
//
//	gw, err := gateway.New(replicas, gateway.WithMode(gateway.ModeCacheAware))
//	d, err := gw.Route(keys.PrefixKey(system, session, rag))
//	// ... send the request to d.Address ...
//	d.FirstToken()                             // optional: prefill finished
//	d.Done(gateway.DoneInfo{Latency: elapsed}) // frees load, feeds latency
//
// Disaggregated routes prefill and decode to separate pools. Package sim
// compares the policies on simulated clusters; packages httpgw and picker
// put a Gateway in front of real engines.
//
// Every exported function and method is safe for concurrent use. Load and
// health updates are atomics; Route does not allocate and holds one short
// mutex, under which a Policy's Pick runs, so Pick must not block.
package gateway

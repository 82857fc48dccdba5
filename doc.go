// Package gateway routes LLM inference requests across model-server
// replicas (vLLM, SGLang and the like) by KV/prefix-cache affinity.
//
// A replica that already holds the KV cache for a request's leading
// tokens (system prompt, then session, then RAG context) skips computing
// them again. The gateway keeps a table of replicas (health, queue depth,
// KV-cache utilisation, latency) and an index of which prefix blocks each
// holds, and picks a replica per request with a Policy:
//
//   - RoundRobin, the default (ModeRoundRobin), rotates across replicas;
//   - CacheAware (ModeCacheAware) minimises an estimate of the wait a
//     request would see and impose: prefill queued at the replica, plus the
//     part of the prompt not cached there (charged more when the cluster is
//     busy), plus the batch it is decoding. That prefers the replica with
//     the longest cached prefix while its queue is short and falls back to
//     load as it grows, so traffic sharing one system prompt does not pile
//     onto one replica. A hot prefix held by fewer replicas than its share
//     of recent traffic calls for is replicated to the least loaded one
//     (Request.Demand). An optional bounded-load cap
//     (CacheAware.LoadFactor) adds a hard limit on in-flight requests;
//   - LoadAware (ModeLoadAware) picks the least loaded replica by a weighted
//     mix of queue depth (outstanding requests and queued prefill), KV
//     utilisation and latency.
//
// Whatever the policy, unhealthy replicas are never chosen, and replicas
// over the latency SLO are left out unless every healthy replica breaches
// it, in which case the gateway routes within the healthy set rather than
// to nothing.
//
// A request's prefix is a Key: a chain of block hashes built by PrefixKey
// (text segments), KeyFromTokens (engine-style token blocks) or
// KeyFromHashes (pre-hashed block ids, as in request traces). Every
// decision is a function of the key and the gateway's state alone (the
// replicas and their signals, the index of cached blocks, and how many
// recent requests shared each held prefix), so the rules are testable
// without an engine.
//
// Basic use:
//
//	gw, err := gateway.New(replicas, gateway.WithMode(gateway.ModeCacheAware))
//	...
//	d, err := gw.Route(gateway.PrefixKey(system, session, rag))
//	... send the request to d.Address ...
//	d.FirstToken()                              // optional: prefill finished
//	d.Done(gateway.DoneInfo{Latency: elapsed})  // frees load, feeds latency
//
// Disaggregated routes prefill and decode to separate pools;
// DisaggregatedRoute checks on a reference engine that the split leaves
// the output unchanged. Package sim simulates whole clusters to compare
// policies on time to first token, hit rate and balance.
//
// # Concurrency
//
// Every exported function and method is safe for concurrent use. The
// replica set is an immutable snapshot replaced on AddReplica and
// RemoveReplica; load signals and health are atomics, so UpdateLoad and
// SetHealthy never wait for routing. The cache index changes on every
// routed request (the chosen replica is warmed), so Route, ApplyEvent and
// membership changes share one short mutex; Route does not allocate and
// holds it for about a microsecond. A Policy's Pick runs under that mutex
// and must not block.
package gateway

// Package reference implements routing policies from the field as
// gateway.Policy values, each written from its own source code, so that
// the simulator (package sim) can compare the gateway's policies with
// them side by side. Each type's documentation names the repository,
// commit and files followed, and where every default comes from:
//
//   - SGLang: SGLang's router (sgl-model-gateway) cache-aware policy, its
//     approximate radix tree and periodic eviction; miss paths of three
//     periods (SGLangMiss); library and command-line defaults.
//   - Dynamo: NVIDIA Dynamo's KV router: overlap-weighted prefill plus
//     decode blocks it tracks itself, ties by indexer tree size then at
//     random, on the engines' KV events.
//   - GIE: the Gateway API Inference Extension's default endpoint picker:
//     2·queue + 2·KV + 3·prefix from its own approximate index.
//   - LLMDPrecise: llm-d's precise prefix-cache scorer in the same profile.
//   - LLMDPredicted: llm-d's predicted-latency scheduling: TTFT and TPOT
//     learned online (a Bayesian ridge in place of its default XGBoost),
//     SLO headroom tiers, least-headroom scoring, a weighted random pick.
//   - CHWBL: consistent hashing with bounded loads, as in KubeAI.
//   - P2C: power of two random choices, least loaded.
//   - PrefixAffinity: the longest cached prefix, with no regard for load.
//
// Routers that follow requests themselves implement Tracker (and
// KVListener for KV events, Clocked for the time), which the simulator
// drives; random tie-breaks draw from a seed, so that the same seed gives
// the same decisions. Every policy is safe for concurrent use.
package reference

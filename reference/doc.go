// Package reference implements routing policies from the field as
// gateway.Policy values, written from their published descriptions, so the
// simulator (package sim) can compare the gateway's own policies with them
// side by side:
//
//   - SGLang: SGLang router's cache-aware policy (prefix match threshold,
//     then balance guard switching to the shortest queue).
//   - Dynamo: NVIDIA Dynamo's KV router (lowest overlap-weighted prefill
//     plus decode blocks).
//   - CHWBL: consistent hashing with bounded loads, as in KubeAI.
//   - P2C: power of two random choices, least loaded.
//   - PrefixAffinity: the longest cached prefix, with no regard for load.
//
// Every policy is safe for concurrent use and deterministic given its
// inputs (P2C given its seed).
package reference

// Package config is the routing configuration store shared by the exa
// command line (`exa serve routing set|get|list`) and the HTTP gateway
// (`exa serve gateway --config FILE`).
//
// # Location
//
// The configuration is one JSON file. [Path] returns its location: the value
// of the EXA_CONFIG environment variable when it is set and non-empty,
// otherwise routing.json in the "exa" directory under [os.UserConfigDir]
// (for example ~/.config/exa/routing.json on Linux). Files the CLI keeps
// beside it, such as the latest simulation result per model, live in the
// same directory (see [StatsDir]).
//
// # Format
//
// The file is indented JSON with map keys sorted, so it is stable under
// rewriting and easy to read and diff:
//
//	{
//	  "version": 1,
//	  "models": {
//	    "JPCP": {
//	      "mode": "cache_aware",
//	      "slo_latency_ms": 500,
//	      "load_weights": {"queue": 1, "kv": 0.5, "latency": 0.25},
//	      "disaggregate": true,
//	      "prefill_pool": "prefill",
//	      "decode_pool": "decode",
//	      "pd_mode": "gateway",
//	      "pd_min_uncached_tokens": 512,
//	      "replicas": [
//	        {"name": "r0", "address": "http://10.0.0.1:8000"},
//	        {"name": "r1", "address": "http://10.0.0.2:8000", "cache_blocks": 8192}
//	      ],
//	      "pools": {
//	        "prefill": [{"name": "p0", "address": "http://10.0.1.1:8000"}],
//	        "decode":  [{"name": "d0", "address": "http://10.0.2.1:8000"}]
//	      }
//	    }
//	  }
//	}
//
// Fields of a model (see [Model]):
//
//   - mode: round_robin (the default when absent or empty), cache_aware or
//     load_aware: a gateway.Mode in its text form (hyphens are read as
//     underscores; the file is written with underscores).
//   - slo_latency_ms: latency SLO in whole milliseconds; 0 or absent means
//     no SLO. Never negative.
//   - load_weights: weights of the load-aware score (queue, kv, latency, as
//     in gateway.LoadWeights); absent means gateway.DefaultLoadWeights().
//     Each weight is finite and not negative, and not all are zero.
//   - disaggregate: prefill/decode disaggregation on or off (default off).
//   - prefill_pool, decode_pool: names of the pools used when disaggregate
//     is true; both must then be set and differ. They are kept, inactive,
//     when disaggregation is switched off.
//   - pd_mode: how the HTTP gateway splits a disaggregated model's
//     requests: gateway (the default when absent or empty: it sends the
//     prefill and decode requests itself) or sidecar (decode replicas run
//     behind llm-d's pd-sidecar; the gateway names the prefill replica in
//     x-prefiller-host-port).
//   - pd_min_uncached_tokens: the P/D decider's threshold: a request is
//     split only when at least this many prompt tokens are not cached on
//     its decode replica; absent means [DefaultPDMinUncachedTokens] (512),
//     0 splits every request, at most [MaxPDMinUncachedTokens].
//   - engine: the engines' type, whose /metrics names the HTTP gateway
//     reads for their load: vllm, sglang or trtllm; absent or empty means
//     detected from each engine's page (vLLM's names first, then SGLang's,
//     then TensorRT-LLM's; none found is logged as a warning and shown in
//     /stats as load_warning).
//   - replicas: the replicas serving the model when it is not
//     disaggregated, each with a unique name and an address: an http:// or
//     https:// base URL with a host, an optional port in 1..65535 and an
//     optional path, or a bare host:port meaning http:// (no other scheme,
//     no credentials, query, fragment, spaces or control characters; see
//     [ValidateAddress]); cache_blocks is optional (at most
//     gateway.MaxCacheBlocks; 0 means the KV-cache size the engine reports
//     in vllm:cache_config_info or sglang:cache_config_info, converted to
//     the index's blocks, else the gateway's default).
//   - pools: named replica pools, for example the prefill and decode pools.
//   - index: approximate (the default) or exact: routing on the engines' own
//     KV events (see docs/kv-events.md). exact needs mode cache_aware (or
//     disaggregation, whose pools it informs: docs/disaggregation.md) and
//     an event source for every replica.
//   - block_size: the engines' KV block size in tokens for the exact index,
//     0..[MaxBlockSize] (0 or absent means 16).
//   - kv_events_bind: a ZMQ endpoint (tcp://HOST:PORT, HOST the address
//     to listen on, * or 0.0.0.0 for every interface; or ipc://PATH) the
//     gateway listens on for the KV events of engines whose publisher
//     connects; topics kv@POD@MODEL name them, and an engine's messages
//     are taken only from its replicas' hosts.
//   - kv_events_allow: source addresses (IP addresses or CIDR prefixes,
//     see [ParseKVAllow]) that may also publish on kv_events_bind, under
//     any topic (relays, NAT); at most [MaxKVAllow], each once; inactive
//     without kv_events_bind.
//   - a replica's kv_events: the endpoint of its engine's publisher, which
//     the gateway connects to (tcp://HOST:PORT, HOST not * or 0.0.0.0); no
//     endpoint is both bound by a model and connected to by a replica.
//   - a replica's kv_events_replay: the endpoint of its engine's replay
//     socket (vLLM's replay_endpoint), connected to on a sequence gap to
//     fetch the missed batches; on the engine's host (that of kv_events,
//     else of the address), ipc:// only with an ipc:// kv_events; absent
//     means none.
//   - a replica's pod: the name its engine gives in its topics (no '@');
//     absent means the address's host:port, or its host alone. Two
//     replicas heard on one endpoint may not answer to the same pod.
//   - adapters: the model's LoRA adapter allow-list (names as replica
//     names, each once, at most [MaxAdapters]); absent or empty serves
//     every adapter its engines list in GET /v1/models (see docs/lora.md).
//   - peers: base URLs of the other gateway processes routing the model to
//     the same replicas (addresses as a replica's, or "dns+http://NAME:PORT"
//     or "dns+https://NAME:PORT" for every address NAME resolves to, over
//     https verified for NAME; each entry once, at most
//     [MaxPeers]); the HTTP gateway scrapes their /metrics for the
//     prefill each has pending at each replica and cache_aware adds it to
//     its own, ignoring itself when listed (see docs/multi-gateway.md).
//     Absent or empty means none.
//
// Model, pool and replica names are at most [MaxNameBytes] (255) bytes of
// valid UTF-8, without surrounding spaces or control characters.
//
// The file must hold one JSON object. {} is a valid empty configuration
// (version 1, no models), as a missing file is; null, an array or a
// scalar is not. Unknown fields (names are case-sensitive), a key given
// twice, a null value (leave a field out instead), a value of the wrong
// kind, a syntax error, trailing data or a version other than 1 make the
// file corrupt ([ErrCorrupt]); a well-formed file with an invalid value (an
// unknown mode, a negative SLO, an ftp:// address, ...) is rejected with
// [ErrInvalid]. In both cases the error names the file and the offending
// field by its path (models.JPCP.replicas[0].address), and nothing is
// written.
//
// The gateway side turns a [Model] into gateway options with
// [Model.Options] and its replicas into gateway.Replica values with
// [GatewayReplicas].
//
// # Routing statistics
//
// [RoutingStats] is the JSON record of one model's routing statistics:
// decisions by kind, hit rates, share of requests per replica, SLO
// exclusions and fallbacks. The HTTP gateway serves a [StatsDocument]
// (models keyed by name) at GET /stats, built with [StatsFromGateway];
// `exa serve routing simulate MODEL` saves the latest simulated record of a
// model in stats/<model>.json beside the configuration file ([SaveStats],
// [LoadStats], [StatsPath]; the model name is path-escaped, and a name
// whose escaped form exceeds 200 bytes is shortened with a hash so the file
// can always be written), and
// `exa serve routing stats MODEL` shows the live record when a gateway is
// reachable and the saved one otherwise. [DecodeGatewayStats] reads a
// gateway's /stats body.
//
// # Concurrency and durability
//
// [Load] reads the file without locking: writes are atomic renames, so a
// reader sees either the old or the new file, never a torn one. [Update]
// serialises writers across processes with an exclusive flock(2) on a lock
// file beside the configuration (routing.json.lock), re-reads the file
// under the lock, applies the change and writes the result to a temporary
// file in the same directory, fsyncs it, renames it over the configuration
// and fsyncs the directory. Two concurrent updates therefore never lose
// each other's changes.
package config

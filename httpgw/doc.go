// Package httpgw is an embeddable OpenAI-compatible HTTP gateway that
// routes requests across model-server replicas (vLLM, SGLang, or anything
// speaking the OpenAI API and exposing vLLM's Prometheus metrics) with the
// routing library github.com/examlops/gateway. `exa serve gateway` runs it;
// other Go servers can mount a *Server as an http.Handler.
//
//	srv, err := httpgw.New(httpgw.Options{ConfigPath: "/etc/exa/routing.json"})
//	if err != nil { ... }
//	go srv.Run(ctx) // reloads, /health probes, /metrics scrapes
//	http.ListenAndServe("127.0.0.1:8080", srv)
//
// # Endpoints
//
//   - POST /v1/chat/completions, POST /v1/completions: forwarded unchanged
//     to the replica the model's policy picks (except that a non-streamed
//     request is streamed from the engine: see Non-streamed requests).
//     Streamed (SSE) answers are
//     relayed chunk by chunk, flushed as they arrive; a client that goes
//     away cancels the upstream request. Responses carry X-Exa-Replica (the
//     replica) and X-Exa-Decision (kind and prefix match, e.g.
//     "affinity; matched=12/14").
//   - GET /v1/models: the configured models, in OpenAI's list format,
//     then the LoRA adapters served, each with its model as "parent".
//   - GET /stats: routing statistics as JSON (schema below); ?model=NAME
//     narrows it to one model.
//   - GET /metrics: the gateway's Prometheus metrics (list below).
//   - GET /healthz: 200 while the process serves.
//   - Any other path: 404 with an OpenAI-style error.
//
// # Endpoint picker
//
// Server.Picker serves the same routing to Envoy as a picker.Router, for
// the ext_proc endpoint picker of package picker (`exa serve picker`):
// Envoy sends each request's headers and body, the Picker parses, keys
// and routes them as the handler does, and Envoy sends the request to the
// engine's ip:port itself; the response phase feeds first token, end,
// passive health and metrics. Errors are the handler's (status, OpenAI
// error object); GET /v1/models is answered from the configuration;
// replicas whose address has a host name are never picked (Envoy's
// ORIGINAL_DST cluster takes IP addresses); a disaggregated model is
// served in sidecar P/D mode only. See Picker and docs/picker.md.
//
// # Configuration
//
// The models, their routing options (mode, latency SLO, load weights) and
// their replicas come from the file of package config, the one that
// `exa serve routing set` writes. Run polls its size and modification time
// every ReloadInterval and applies a changed file without dropping
// traffic (see Server.Apply): requests in flight finish where they were
// sent, a model whose routing options are unchanged keeps its cache
// index, and an invalid file is logged and ignored: Apply checks the whole
// new configuration (every model's gateway built or its replica changes
// checked against the gateway's limits) before it changes any running
// gateway, so a file that fails part way changes nothing. A model marked
// disaggregate whose prefill and decode pools are defined is served split
// (see Disaggregation); until they are it is proxied over its replicas,
// and with none (as `exa serve routing set --disaggregate` leaves it) it
// answers 503 naming the missing pools.
//
// # Disaggregation
//
// A disaggregated model's request is routed to a decode replica first,
// load-aware over the decode pool. The decider then estimates the prompt
// tokens not cached there (the key blocks the decode pool's index does
// not match that replica with, at Options.BlockSize/4 tokens a block) and
// splits the request only when they reach pd_min_uncached_tokens
// (config.DefaultPDMinUncachedTokens, 512); otherwise the decode replica
// serves it co-located. A split request gets a prefill replica,
// cache-aware over the prefill pool. In gateway mode (pd_mode "gateway",
// the default) the gateway sends the prefill request (the client's body
// with stream false, no stream_options, max_tokens and
// max_completion_tokens 1, kv_transfer_params asking for a remote decode,
// and an x-request-id), then the decode request (the client's body with
// the prefill answer's kv_transfer_params and the same x-request-id),
// whose answer is relayed as any other: vLLM's NixlConnector protocol as
// llm-d's pd-sidecar v0.7.1 runs it. A prefill 4xx (400-451) is relayed
// to the client; any other prefill failure (status, transport, first-byte
// timeout), or an answer without kv_transfer_params, falls back to
// decoding co-located. A decode failure before the first byte is retried
// once on another decode replica with the same decode request. In sidecar
// mode (pd_mode "sidecar", for decode replicas behind pd-sidecar) the
// gateway sends the client's request to the decode replica with the
// prefill replica's host:port in x-prefiller-host-port and the sidecar
// runs the two requests. A client's own x-prefiller-host-port never
// reaches an engine. Answers carry X-Exa-Disagg ("split; uncached=N",
// "colocated; uncached=N" or the fallback reason) and, when split,
// X-Exa-Prefill-Replica. docs/disaggregation.md has the setup and figures.
//
// # Prefix key
//
// Each request's prefix key is built with keys.Hasher.AppendSegment
// (Options.BlockSize bytes per block, default 64), one segment per part,
// each in its role (keys.Segment) so that equal text in different roles
// differs. The parts, in order:
//
//  1. the system prompt: every message whose role is "system" or
//     "developer", in order, wherever it stands in the conversation;
//  2. the session: the X-Session-ID header, or else the body's "user" field;
//  3. the RAG context: the X-RAG-Context header, an opaque name for the
//     retrieved context the prompt embeds (a document set id, a corpus
//     version, a hash of the passages);
//  4. the conversation: every other message in order, each in its role
//     (user, assistant, tool; other roles share one) — or, for
//     /v1/completions, the prompt (a string; a list of strings joined by
//     newlines; token arrays by their JSON text).
//
// With one system message and no conversation, the key is the library's
// keys.PrefixKey(system, session, rag) (at the default block size), so
// keys built by a Go service and by the HTTP gateway agree.
//
// Message content is its text: a string as is, a list of parts as its text
// parts concatenated (non-text parts contribute their JSON). Every turn of
// a chat therefore extends the key of the turn before, and the replica
// that served the earlier turns holds their prefix. Empty parts add
// nothing; a request with no text at all gets a one-block key naming the
// model.
//
// # Exact index
//
// A model configured with index exact (`exa serve routing set MODEL
// --index exact`) routes on an index that only its engines' KV events
// change (package kvevents: vLLM's ZMQ publisher, or
// llm-d-inference-sim's), received on the model's kv_events_bind
// endpoint (the gateway listens; each message's topic kv@POD@MODEL names
// the replica whose pod, or else address host:port or host, is POD) or
// from each replica's kv_events endpoint (the gateway connects). Its
// requests are keyed from the engine's own tokens instead of the prefix
// key below: Options.Tokenizer, by default a healthy replica's POST
// /tokenize behind a cache of tokenized requests, bounded by
// Options.TokenizeTimeout; the tokens, cut into the model's block_size
// (default 16), chain from the model name as the events do. A request
// that cannot be keyed so (tokenization failed, fewer tokens than a
// block, a list of prompts, a field that changes the engine's tokens such
// as cache_salt) is routed with its prefix key, which the exact index
// never holds, so as if nothing were cached (load-aware), and counted by
// reason; its X-Exa-Decision ends "; index=exact; fallback=REASON", that
// of a keyed request "; index=exact" (matched counts blocks of block_size
// tokens: the engine's cached tokens as predicted). Reloads open new bind
// endpoints before applying (a port in use rejects the configuration),
// reset engines removed or reconfigured, and give a replica newly attached
// to an engine heard before the blocks the index holds for it; an engine
// ejected by the health checks is reset. docs/kv-events.md has the
// operator's guide, figures and limits.
//
// # Engine signals
//
// Health: every ProbeInterval each engine address gets GET /health; after
// EjectAfter consecutive failed probes, or EjectAfter consecutive failed
// answers (5xx, transport errors, answers whose first byte misses the
// first-byte timeout; a refused connection ejects at once, and so does one
// prefill timeout), the engine is ejected from every model that uses it,
// and after ReadmitAfter consecutive successful probes it is readmitted.
// As in Envoy's outlier detection, the two counts are apart: a passing
// probe does not reset the failed answers, and an engine ejected for its
// answers stays out for EjectionTime times the number of such ejections
// (at most 10 times), whatever its probes say (health.go). Load: every ScrapeInterval each engine's
// /metrics is parsed with the Prometheus text parser (ParseEngineMetrics)
// and fed to gateway.UpdateLoad; the gateway adds its own in-flight counts,
// and time to first byte feeds each replica's smoothed latency through
// Decision.Done. Decision.FirstToken is called at the first response byte
// (for a non-streamed request streamed from the engine, at the first
// chunk). The same scrape reads vllm:lora_requests_info into
// gateway.UpdateAdapters.
//
// # Non-streamed requests
//
// A non-streamed answer's first byte is its completion, so a gateway that
// forwards it as it is learns its first token (Decision.FirstToken, which
// releases the request's pending prefill that cache_aware prices) only when
// the whole answer is generated, and overstates the replica's queued
// prefill for the whole generation. By default (Options.UpstreamStream, `exa
// serve gateway --upstream-stream`) the gateway therefore asks the engine to
// stream every chat and completions request whose "stream" is false or
// absent, as Dynamo's frontend does: it appends
// "stream":true,"stream_options":{"include_usage":true} as the body's last
// members, after removing the client's own "stream" and "stream_options"
// (so that no member is repeated; the rest of the body is kept byte for
// byte; were one left, spelled with escapes, engines reading JSON with
// Python's json module or Go's encoding/json take the last), calls
// FirstToken at the first SSE chunk, and answers the client with the
// non-streamed JSON assembled from the chunks (aggregate.go): top-level
// members in the order first seen with their last non-null value ("object"
// chat.completion.chunk becomes chat.completion), choices by index with the
// chat deltas merged into "message" (content, reasoning_content, reasoning,
// refusal concatenated; tool_calls merged by index, function name and
// arguments concatenated), completions "text" concatenated, the arrays of
// "logprobs" and "token_ids" concatenated, finish_reason and other members
// last non-null, and "usage" from the final usage chunk. Strings are joined
// as the engine escaped them, never decoded and encoded again. The e2e
// test TestNonStreamedFirstToken (llm-d-inference-sim v0.10.2, time to first
// token 500ms, 10ms a token, 300 tokens) measured the pending prefill
// released at 518ms and the answer complete at 3.63s, against 3.60s for
// both with --upstream-stream=false; the answer's content, usage,
// finish_reason, role, model and top-level members equal the engine's own
// non-streamed answer's. Remaining differences from a non-streamed answer:
// members an engine's non-streamed answer carries at their defaults but its
// chunks leave out are absent (vLLM's message refusal, annotations, audio,
// function_call, tool_calls [] ; top-level prompt_logprobs,
// kv_transfer_params), while "logprobs": null and "finish_reason" are
// always present (llm-d-inference-sim omits the first); "created" is the
// chunks' (llm-d-inference-sim stamps its non-streamed answer at
// completion); the JSON is compact, in the engine's member order. The
// engine's headers are kept, with Content-Type application/json. Bodies
// naming "best_of" or "use_beam_search" (which vLLM does not stream) are
// forwarded as they are. A client's own "stream_options" is overridden (an
// engine that refuses stream_options without stream, as vLLM's request
// validation may, now accepts the request). The wait for the first chunk is
// bounded by FirstByteTimeout, as for a streamed request, and nothing bounds
// the rest (ResponseTimeout no longer applies). Errors: an engine's error
// status (the request is not streamed) is relayed as it is; an error event
// in the stream, a stream cut or ended without data: [DONE], or one that
// cannot be assembled gets the client a 502 OpenAI error naming the cause
// (nothing was sent to it yet), counted in
// upstream_stream_failures_total; a cut stream also counts against the
// engine's health. Bounds: each SSE event at most MaxBodyBytes (8 MiB by
// default), the assembled answer at most 4×MaxBodyBytes (32 MiB), else
// 502. Cost, measured with `go test ./httpgw -run '^$' -bench
// 'BenchmarkAggregate|BenchmarkUpstreamStream' -count 3` on the shared
// 2-core machine: assembling a 256-token chat answer from its 40 KiB
// stream takes 134–149 µs (about 560 ns a chunk, 40 allocations an answer,
// none per chunk); the whole handler path for a 64-chunk stream took
// 354–371 µs with it against 407–416 µs relaying the same stream as it
// is (the relay flushes each event). Against a real engine it costs more,
// since the engine streams even a one-token answer in several writes: the
// e2e TestAddedLatency run with EXA_E2E_LATENCY_N=1000,
// EXA_E2E_LATENCY_BASELINE_EXA set to the same binary and
// EXA_E2E_LATENCY_BASELINE_ARGS=--upstream-stream=false (one
// llm-d-inference-sim, non-streamed max_tokens 1 requests, 400/1000/2000
// req/s asked) measured the gateway with it 94, 80 and 79 µs slower at the
// median than with --upstream-stream=false (p99 302, 350, 263 µs). The
// assembly itself is a few µs of that (five chunks); the rest is the
// engine's and the connection's handling of a stream, not separated here.
//
// # LoRA adapters
//
// A request whose "model" is no configured model is resolved as a LoRA
// adapter of one: every DiscoverInterval (and when Run starts) each
// engine's GET /v1/models is read, and an adapter it lists with a parent
// belongs to the configured model the engine serves, routed over that
// model's replicas whose engines list it (gateway.Target.Adapter), with its
// prefix key salted by the adapter. A model's "adapters" allow-list limits
// it to those names (and routes a listed adapter no engine lists over all
// replicas). Anything else gets 404 model_not_found naming it. The body
// goes to the engine unchanged. See lora.go and docs/lora.md.
//
// # Engine client
//
// Requests go to the engines through Options.Transport, by default a
// keep-alive HTTP/1.1 connection pool (internal/httpclient) that writes
// each request and reads its answer on the handler's goroutine, where
// http.Transport hands both to two goroutines per connection. Measured
// side by side (e2e TestAddedLatency with a gateway on each, against the
// llm-d inference simulator; `exa serve gateway --engine-client std`
// selects http.Transport), it added 70–150 µs less per request at the
// median than http.Transport, over five runs at three rates. With engine,
// gateway and client in one process (BenchmarkTransportPaired) the gain is
// 3–7 µs per pair. Its answers match http.Transport's on engine responses
// (TestPoolMatchesTransport, FuzzPoolMatchesTransport). Response heads
// are bounded to 64 KiB.
//
// # Failures
//
// Malformed JSON, a missing model, messages or prompt: 400. Unknown model:
// 404. Body over MaxBodyBytes: 413. The body's JSON syntax is checked in
// full by a one-pass decoder (internal/jsonscan, about ten times faster
// than encoding/json) that reads only the routing fields (model, messages,
// prompt, user, stream) as an engine reading the body with Python's json
// module would: names match exactly, the last of repeated members counts;
// the body is forwarded byte for byte. No healthy replica, or a model with
// no replicas: 503. All as OpenAI error objects
// {"error": {"message", "type", "param", "code"}}. An engine that fails
// before sending a byte (transport error, 5xx, a response head over 64 KiB,
// a final 1xx status, or no byte within the first-byte timeout) is retried
// once on another replica; if that fails too the client gets the engine's
// 5xx, or 502. The first-byte timeout is FirstByteTimeout (default 30s)
// for a streamed request, whose first byte is its first token, and
// ResponseTimeout (default 10 minutes) for another, whose first byte
// comes when the whole answer is generated: an engine that accepts a
// request and never answers holds it that long. Interim 1xx answers (an
// unsolicited 100 Continue, 103 Early Hints) are skipped, as
// http.Transport skips them. An engine that fails mid-answer ends a stream with a final event
// "data: {"error": {...,"code":"upstream_error"}}" and cuts a plain
// answer's connection, so a client never mistakes a partial answer for a
// whole one. Every request is counted in exa_gateway_requests_total with
// the status sent, or stream_error, aborted or client_canceled.
//
// # Metrics
//
// All names start with exa_gateway_:
//
//	requests_total{model,endpoint,code}        every request and its outcome (endpoint chat,
//	                                           completions, models or other)
//	decisions_total{model,kind}                routing decisions by kind
//	routed_total{model}, prefix_hits_total{model}
//	prefix_blocks_total{model}, prefix_matched_blocks_total{model}
//	prefix_hit_rate{model}                     hits/routed of the current routing table
//	replica_requests_total{model,replica}      forwards per replica (retries included)
//	request_duration_seconds{model,endpoint}   histogram, receipt to end of answer
//	time_to_first_byte_seconds{model,endpoint} histogram, receipt to first upstream byte
//	retries_total{model}
//	upstream_streamed_total{model,endpoint}    non-streamed requests streamed from the engine
//	upstream_stream_failures_total{model,endpoint} those answered 502 (stream cut, error
//	                                           event, too large, not assembled)
//	ejections_total{address}, readmissions_total{address}, endpoint_healthy{address}
//	probe_failures_total{address}, scrape_errors_total{address}
//	config_reloads_total{result}, in_flight_requests
//	pending_prefill_blocks{model,replica}      uncached blocks routed and waiting for their
//	                                           first token: this gateway's own, which its
//	                                           peers scrape (docs/multi-gateway.md)
//	peer_prefill_blocks{model,replica}         the sum the model's peers report (with peers)
//	peer_up{peer}, peer_scrape_errors_total{peer}
//	index_cached_blocks{model,replica}         blocks the index holds per replica
//	disagg_requests_total{model,path}          P/D decider's choice: split or colocated
//	disagg_split_share{model}                  split/decided of the current routing table
//	disagg_fallbacks_total{model,reason}       prefill_unavailable, prefill_failed,
//	                                           prefill_no_kv_params, decode_retry
//	disagg_phase_seconds{model,phase}          histogram (gateway mode): prefill,
//	                                           decode_first_byte, decode
//
// and, for the exact index (see docs/kv-events.md):
//
//	kv_messages_total, kv_malformed_messages_total, kv_events_total,
//	kv_events_applied_total, kv_blocks_stored_total, kv_blocks_removed_total,
//	kv_sequence_gaps_total, kv_restarts_total, kv_overflows_total,
//	kv_clears_total, kv_messages_skipped_total, kv_messages_rejected_total,
//	kv_resets_total, kv_mapped_blocks                    {endpoint,topic} per engine
//	kv_events_dropped_total{endpoint,topic,reason}
//	kv_malformed_frames_total, kv_unresolved_total
//	kv_endpoint_connected, kv_endpoint_connects_total, kv_endpoint_failures_total {endpoint,bound}
//	kv_endpoint_open_connections {endpoint,bound}, kv_endpoint_closed_total {endpoint,bound,reason}
//	tokenize_requests_total, tokenize_engine_calls_total, tokenize_errors_total,
//	tokenize_seconds (histogram)                                    {model}
//	tokenize_cache_hits_total, tokenize_cache_entries
//	exact_fallbacks_total{model,reason}
//
// Served as an endpoint picker (Server.Picker, `exa serve picker`), the
// same metrics count the requests the picker routes, from the request
// headers reaching the picker to the end of the response Envoy reports;
// a request whose ext_proc stream ended before its response did is
// counted with code stream_ended (the client went away, or Envoy reset it).
//
// With its own registry (Options.Registerer nil) /metrics also carries the
// Go runtime's and the process's metrics (go_*, process_*). Profiling is
// not served here: `exa serve gateway --pprof-listen ADDR` serves
// net/http/pprof on an address of its own.
//
// # /stats schema
//
// GET /stats returns a Stats value: config.StatsDocument's "models" (so
// `exa serve routing stats MODEL --gateway URL` decodes it with package
// config) plus "engines":
//
//	{
//	  "models": {
//	    "JPCP": {
//	      "model": "JPCP", "source": "gateway", "mode": "cache_aware",
//	      "requests": 120, "hits": 84, "hit_rate": 0.7,
//	      "blocks": 2400, "matched_blocks": 1980, "block_hit_rate": 0.825,
//	      "decisions": {"affinity": 96, "load_aware": 24, "round_robin": 0},
//	      "slo_excluded": 0, "slo_fallbacks": 0, "no_match": 12, "load_guard": 12,
//	      "no_healthy": 0,
//	      "replicas": [
//	        {"name": "r0", "routed": 61, "hits": 44, "share": 0.508, "healthy": true},
//	        {"name": "r1", "routed": 59, "hits": 40, "share": 0.492, "healthy": false}
//	      ]
//	    }
//	  },
//	  "engines": [
//	    {"address": "http://10.0.0.1:8000", "healthy": true, "models": ["JPCP"],
//	     "load": {"waiting": 0, "running": 3, "kv_utilization": 0.41},
//	     "adapters": {"served": ["sql", "support"], "running": ["sql"], "max_loras": 2}},
//	    {"address": "http://10.0.0.2:8000", "healthy": false, "models": ["JPCP"],
//	     "load": {"waiting": 2, "running": 8, "kv_utilization": 0.93},
//	     "scrape_error": "gateway: scrape engine metrics: http://10.0.0.2:8000: ... connection refused"}
//	  ]
//	}
//
// Per model (config.RoutingStats): requests counts routing decisions;
// hits those whose chosen replica held the whole prefix key, hit_rate
// their share; blocks and matched_blocks sum the prefix blocks routed and
// those the chosen replica held (block_hit_rate, the better measure when
// every prompt ends in something new); decisions by kind; SLO exclusions
// and fallbacks; no_healthy counts requests refused for want of a healthy
// replica; replicas lists each replica's routed requests, hits, share and
// health. Per engine: its address, whether it is in rotation, the load last
// scraped (absent before the first good scrape) and the last scrape error,
// always "gateway: scrape engine metrics: ADDRESS: " followed by the cause
// (a transport error, "status N", or "parse: ..." for a page that is not
// Prometheus text). "adapters" (EngineAdapters) lists the LoRA adapters the
// engine's GET /v1/models lists, the last discovery's error, and its last
// vllm:lora_requests_info (running, waiting, max_loras).
//
// A disaggregated model's record is its decode pool's, with
// "disaggregation" added (config.DisaggregationStats): mode, the decider's
// min_uncached_tokens, decided and split requests and split_share,
// fallbacks by reason, and the prefill pool's own record under "prefill".
//
// Each model also has "index" (approximate or exact) and each replica
// "cached_blocks" (the index size) and "in_flight" (requests routed there
// that have not ended; omitted when 0); a model on the exact index has
// "kv_events" (config.KVEventsStats: block_size, tokenize, fallbacks, its
// engines' event counters, its endpoints), and the document a top-level
// "kv_events" (malformed frames, unresolved messages, every endpoint)
// when any model is on the exact index.
//
// Model figures are the routing library's counters (gateway.Stats) for the
// model's current routing table: they restart when a reload changes the
// model's routing options, and a retried request counts twice. The
// Prometheus counters are cumulative over the process's life.
package httpgw

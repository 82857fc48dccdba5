// Package kvevents keeps a gateway's exact prefix index current from the
// engines' own KV-cache events, as vLLM and llm-d-inference-sim publish
// them over ZMQ, and keys requests the same way.
//
// # Events in
//
//	Subscriber (ZMQ SUB: Bind and/or Connect per engine)
//	  → Translator.Handle(endpoint, frames)
//	      Frames: topic, 8-byte big-endian sequence number, msgpack payload
//	      per engine (Target.Replica): sequence check, Decoder, rehash
//	  → gateway.Gateway.ApplyEvent(replica, CacheEvent) with our keys
//
// The wire format is vLLM's vllm/distributed/kv_events.py (EventBatch,
// BlockStored, BlockRemoved, AllBlocksCleared), in both encodings: arrays
// (msgspec array_like, and llm-d-inference-sim v0.10.2 by default) and
// maps tagged under "type" (newer vLLM; the sim with
// --use-vllm-map-event-format). See Decoder.
//
// Engine hashes are not trusted as keys (their function and seed vary):
// the Translator rehashes each stored block's token ids into the chained
// keys of keys.AppendExact, keeping per engine a map from its block hashes to our
// keys to find parents and removals, as llm-d's kv-cache manager and
// Dynamo do. A sequence gap or restart, an unreadable payload or removal,
// or the map reaching its bound clears the engine's blocks from the index:
// a missed removal would otherwise leave a stale entry for good. All
// engines' maps share one bound too (Limits.MaxMapped): past it the
// engines holding the most are cleared. The
// message that shows a gap is not applied: nothing vouches for it. With
// Translator.SetReplay, a gap of an engine whose Target names a Replay
// endpoint (vLLM's replay_endpoint) is first asked of that endpoint: the
// missed batches, if it still holds them all and gives back the last one
// applied unchanged (else the engine restarted), are applied in order
// before the message that showed the gap, and nothing is cleared
// (replay.go).
//
// # Trust
//
// An engine is what the Resolver names (Target.Replica): every topic
// resolving to it shares its one state, so topic variants cannot act as
// new engines. On a bound endpoint, a SourcePolicy (Options.Policy) binds
// each connection's source address to the topics it may publish, checked
// in the transport before a message reaches the Translator; a Subscriber
// bounds message size, connections (in all and per address), the
// handshake (performed on each connection's own goroutine, so that a slow
// one holds back no other) and each message's time, and counts what it
// refuses (EndpointStatus.Guard).
//
// # Requests in
//
// A request on the exact index is tokenized as the engine tokenizes it
// (Tokenizer; by default the engine's own /tokenize, HTTPTokenizer,
// optionally behind a CachedTokenizer), then keyed with
//
//	key, err := keys.AppendExact(buf[:0], keys.ExactName(model, lora), tokens, blockSize)
//
// and routed with gateway.Route. model is the name the Target gives
// (Target.Model, or the topic's model), lora the LoRA adapter the request
// targets ("" for the base model), blockSize the engines' block size
// (Target.BlockSize).
//
// # Connecting engines
//
// vLLM (binds by default; connect to each engine, one endpoint per
// data-parallel rank, whose ports vLLM offsets by the rank):
//
//	vllm serve MODEL --kv-events-config \
//	  '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","topic":"kv@POD@MODEL"}'
//	sub.Connect("tcp://ENGINE_HOST:5557")
//
// With an empty topic, the endpoint alone names the engine (Source), so
// the Resolver maps the endpoint to the replica.
//
// Connecting is the safer mode: the Subscriber opens no port, and what
// arrives on a connection it dialled comes from the engine it dialled.
//
// llm-d-inference-sim (its PUB connects; bind once for all engines, each
// named by its topic kv@$POD_IP@MODEL):
//
//	POD_IP=10.0.0.7:8000 llm-d-inference-sim --enable-kvcache --block-size 16 \
//	  --zmq-endpoint tcp://10.0.0.2:5557 ...
//	sub := kvevents.NewSubscriber(tr, kvevents.Options{Policy: policy})
//	sub.Bind("tcp://10.0.0.2:5557") // the gateway's address on the engines' network
//
// A bound endpoint is open to anything that reaches its address: give the
// Subscriber a SourcePolicy that admits each engine's topics only from its
// own host (the HTTP gateway's does), and do not listen on 0.0.0.0 where
// other networks reach.
//
// The HTTP gateway (package httpgw, `exa serve gateway`) does all of this
// from its configuration for models on the exact index: see
// docs/kv-events.md.
//
// # Limits
//
// Blocks with extra keys (multimodal inputs, cache salts; the LoRA
// adapter's name, vLLM's first extra key, is keyed from its root), blocks
// of an adapter named by lora_id alone (vLLM before lora_name), and blocks of
// KV-cache groups other than full attention (hybrid models) are not
// indexed, nor blocks offloaded to another medium than the GPU. A hybrid
// model stores a block in each group under one hash: its removal from a
// group known (by its BlockStored's kv_cache_spec_kind) not to be indexed
// leaves the block indexed while the full-attention group holds it. A gap the
// engine's replay endpoint cannot fill (or without one), and a restart,
// clear the engine, whose blocks stored before are then relearnt only as
// the engine stores them anew (children of older blocks are orphans,
// counted and dropped). Tested
// against llm-d-inference-sim and its dummy tokenizer; vLLM itself, its
// sha256 hashes and real model tokenizers and chat templates could not be
// run here.
package kvevents

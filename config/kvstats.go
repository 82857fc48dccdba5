package config

// KVEventsStats is the exact index's part of a model's statistics on a
// gateway (RoutingStats.KVEvents): how its requests were keyed and what
// its engines' KV events did to the index.
type KVEventsStats struct {
	// BlockSize is the block size, in tokens, requests are keyed with.
	BlockSize int `json:"block_size"`
	// Tokenize counts the model's requests' tokenizations.
	Tokenize TokenizeStats `json:"tokenize"`
	// Fallbacks counts requests routed without a token key, by reason:
	// tokenize_error (the engine's /tokenize failed or timed out),
	// short_prompt (fewer tokens than a block), unsupported (a prompt the
	// gateway does not tokenize: a list of prompts, token arrays in a
	// list, or a field that changes the engine's tokens, such as
	// cache_salt or continue_final_message). They are routed as if
	// nothing were cached: by load, for a cache_aware model.
	Fallbacks map[string]uint64 `json:"fallbacks"`
	// Engines are the engines heard for the model's replicas, by endpoint
	// and topic.
	Engines []KVEngineStats `json:"engines"`
	// Endpoints are the ZMQ endpoints the model's events come from.
	Endpoints []KVEndpointStats `json:"endpoints"`
}

// TokenizeStats count tokenizations.
type TokenizeStats struct {
	// Requests counts requests tokenized (a prompt of token ids needs
	// none and is not counted).
	Requests uint64 `json:"requests"`
	// EngineCalls counts calls to an engine's /tokenize; the other
	// requests were answered from the gateway's cache of tokenized
	// requests (or shared a concurrent identical call).
	EngineCalls uint64 `json:"engine_calls"`
	// Errors counts requests whose tokenization failed.
	Errors uint64 `json:"errors"`
}

// KVEngineStats are one engine's KV-event counters, as the gateway's
// translator keeps them (see package kvevents, EngineStats). Counters
// only grow over the gateway process's life.
type KVEngineStats struct {
	// Endpoint and Topic identify the engine's messages; Pod is the
	// topic's pod (kv@POD@MODEL), "" for another topic.
	Endpoint string `json:"endpoint"`
	Topic    string `json:"topic"`
	Pod      string `json:"pod,omitempty"`
	// Replicas are the model/replica names the engine's events update
	// now; empty while it is not resolved.
	Replicas []string `json:"replicas"`
	// Messages counts messages received.
	Messages uint64 `json:"messages"`
	// Events counts events received, Applied those applied, Dropped the
	// others, broken down by reason in DroppedBy (malformed, unknown,
	// limit, medium, block_size, orphan, apply).
	Events    uint64            `json:"events"`
	Applied   uint64            `json:"applied"`
	Dropped   uint64            `json:"dropped"`
	DroppedBy map[string]uint64 `json:"dropped_by,omitempty"`
	// MalformedMessages counts messages whose payload was unreadable.
	MalformedMessages uint64 `json:"malformed_messages"`
	// StoredBlocks and RemovedBlocks count blocks applied.
	StoredBlocks  uint64 `json:"stored_blocks"`
	RemovedBlocks uint64 `json:"removed_blocks"`
	// Gaps counts sequence numbers skipped, Restarts sequences that went
	// back (an engine restarted), Overflows times the engine's hash map
	// reached its bound; Clears counts the times the engine's blocks were
	// cleared from the index for these reasons or an unreadable message.
	Gaps      uint64 `json:"gaps"`
	Restarts  uint64 `json:"restarts"`
	Overflows uint64 `json:"overflows"`
	Clears    uint64 `json:"clears"`
	// BudgetClears counts the clears because all engines' maps together
	// reached their bound (--kv-events-max-blocks) while this engine held
	// the most.
	BudgetClears uint64 `json:"budget_clears,omitempty"`
	// Skipped counts messages not applied because they showed a gap or a
	// restart (nothing vouches for such a batch); Rejected messages
	// refused because their topic named the engine with another model,
	// or the engine was already heard under too many topics.
	Skipped  uint64 `json:"skipped"`
	Rejected uint64 `json:"rejected"`
	// ReplayAttempts counts the gaps the engine's replay endpoint
	// (kv_events_replay) was asked to fill; ReplaySucceeded those it
	// filled, ReplayFailed those it could not (then the engine was
	// cleared); ReplayedBatches the batches recovered.
	ReplayAttempts  uint64 `json:"replay_attempts"`
	ReplaySucceeded uint64 `json:"replay_succeeded"`
	ReplayFailed    uint64 `json:"replay_failed"`
	ReplayedBatches uint64 `json:"replayed_batches"`
	// Resets counts the times the gateway reset the engine: its replica
	// was ejected by the health checks, removed or reconfigured.
	Resets uint64 `json:"resets"`
	// MappedBlocks is the number of the engine's blocks the index holds
	// for it now.
	MappedBlocks int `json:"mapped_blocks"`
	// LastError describes the last fault, "" if none.
	LastError string `json:"last_error,omitempty"`
}

// KVEndpointStats is one ZMQ endpoint of KV events.
type KVEndpointStats struct {
	Endpoint string `json:"endpoint"`
	// Bound is true for an endpoint the gateway listens on, false for an
	// engine publisher it connects to.
	Bound bool `json:"bound"`
	// Connected is true while a connection is up (a bound endpoint is
	// always listening).
	Connected bool `json:"connected"`
	// Connects counts successful connections, Failures failed attempts and
	// connections that ended.
	Connects uint64 `json:"connects"`
	Failures uint64 `json:"failures"`
	// LastError is the last failure, "" if none.
	LastError string `json:"last_error,omitempty"`
	// Open is the connections open now (publishers of a bound endpoint),
	// Accepted the connections accepted so far.
	Open     uint64 `json:"open"`
	Accepted uint64 `json:"accepted"`
	// Closed counts connections refused or closed by the gateway's guard,
	// by reason: full (max connections open), host_full (max connections
	// open from its address), source (an address not
	// allowed to publish there), topic (a topic its address may not
	// publish), handshake_timeout, bad_handshake (not a ZMTP 3 PUB's with
	// the NULL mechanism), message_timeout (stalled mid-message), oversize
	// (a message over the size or frame limit). Nil when none.
	Closed map[string]uint64 `json:"closed,omitempty"`
}

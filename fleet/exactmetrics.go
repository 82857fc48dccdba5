package fleet

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/kvevents"
)

// kvCollector exposes the exact index's counters, read from their owners
// (the Translator, the Subscriber, the tokenizer cache, the routing
// tables) when /metrics is gathered, so that event handling counts
// nothing twice.
type kvCollector struct{ s *Fleet }

var _ prometheus.Collector = kvCollector{}

func kvDesc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc("exa_gateway_"+name, help, labels, nil)
}

var (
	engineLabels = []string{"endpoint", "topic"}

	descKVMessages  = kvDesc("kv_messages_total", "KV-event messages received, per engine (endpoint and topic).", engineLabels...)
	descKVMalformed = kvDesc("kv_malformed_messages_total", "KV-event messages whose payload was unreadable, per engine.", engineLabels...)
	descKVEvents    = kvDesc("kv_events_total", "KV events received, per engine.", engineLabels...)
	descKVApplied   = kvDesc("kv_events_applied_total", "KV events applied to the index, per engine.", engineLabels...)
	descKVDropped   = kvDesc("kv_events_dropped_total",
		"KV events dropped, per engine and reason: malformed, unknown (event type), limit, medium (not indexed: not the GPU, not a full-attention group, or an adapter named by lora_id alone), block_size, orphan (parent unknown), apply (refused by the index).",
		append(engineLabels, "reason")...)
	descKVStored   = kvDesc("kv_blocks_stored_total", "Blocks stored in the index from KV events, per engine.", engineLabels...)
	descKVRemoved  = kvDesc("kv_blocks_removed_total", "Blocks removed from the index by KV events, per engine.", engineLabels...)
	descKVGaps     = kvDesc("kv_sequence_gaps_total", "Sequence gaps (messages lost), per engine; each clears the engine's blocks unless its replay endpoint fills it (kv_replays_total).", engineLabels...)
	descKVRestarts = kvDesc("kv_restarts_total", "Sequences that went back (the engine restarted), per engine; each clears the engine's blocks.", engineLabels...)
	descKVOverflow = kvDesc("kv_overflows_total", "Times an engine's block-hash map reached its bound, per engine.", engineLabels...)
	descKVBudget   = kvDesc("kv_budget_clears_total", "Times an engine's blocks were cleared because all engines' block-hash maps together reached their bound (--kv-events-max-blocks) while it held the most, per engine.", engineLabels...)
	descKVAll      = kvDesc("kv_all_mapped_blocks", "Blocks all engines' block-hash maps hold together.")
	descKVAllMax   = kvDesc("kv_all_mapped_blocks_limit", "The bound of the blocks all engines' maps hold together (--kv-events-max-blocks).")
	descKVClears   = kvDesc("kv_clears_total", "Times an engine's blocks were cleared from the index for a gap, restart, overflow or unreadable message, per engine.", engineLabels...)
	descKVSkipped  = kvDesc("kv_messages_skipped_total", "KV-event messages not applied because they showed a sequence gap or restart (their batch cannot be verified), per engine.", engineLabels...)
	descKVRejected = kvDesc("kv_messages_rejected_total", "KV-event messages refused because their topic named the engine with another model, or the engine was heard under too many topics, per engine.", engineLabels...)
	descKVResets   = kvDesc("kv_resets_total", "Times the gateway reset an engine: its replica ejected, removed or reconfigured, per engine.", engineLabels...)
	descKVReplays  = kvDesc("kv_replays_total",
		"Sequence gaps the engine's replay endpoint was asked to fill, per engine and result: succeeded (its batches applied, nothing cleared), failed (the engine was cleared as without replay).",
		append(engineLabels, "result")...)
	descKVReplayed = kvDesc("kv_replayed_batches_total", "KV-event batches recovered from an engine's replay endpoint, per engine.", engineLabels...)
	descKVMapped   = kvDesc("kv_mapped_blocks", "Blocks of the engine the index holds from its events, per engine.", engineLabels...)
	descKVFrames   = kvDesc("kv_malformed_frames_total", "KV-event messages without topic, 8-byte sequence number and payload.")
	descKVUnres    = kvDesc("kv_unresolved_total", "KV-event messages from a source no configured replica answers to.")
	descKVConn     = kvDesc("kv_endpoint_connected", "1 while the gateway listens on (bound) or is connected to a KV-event endpoint.", "endpoint", "bound")
	descKVConnects = kvDesc("kv_endpoint_connects_total", "Connections made to a KV-event endpoint the gateway dials.", "endpoint", "bound")
	descKVFails    = kvDesc("kv_endpoint_failures_total", "Failed connection attempts and connections ended, per KV-event endpoint.", "endpoint", "bound")
	descKVOpen     = kvDesc("kv_endpoint_open_connections", "Publishers' connections open on a KV-event endpoint the gateway listens on.", "endpoint", "bound")
	descKVClosed   = kvDesc("kv_endpoint_closed_total",
		"Connections to a KV-event endpoint refused or closed by the gateway's guard, by reason: full (max connections open), host_full (max connections open from its address), source (address not allowed), topic (a topic its address may not publish), handshake_timeout, bad_handshake (not a ZMTP 3 PUB's, NULL mechanism), message_timeout (stalled mid-message), oversize.",
		"endpoint", "bound", "reason")
	descCached     = kvDesc("index_cached_blocks", "Blocks the routing index holds for a replica (the index size), by model and replica.", "model", "replica")
	descTokReqs    = kvDesc("tokenize_requests_total", "Requests of a model on the exact index that were tokenized.", "model")
	descTokCalls   = kvDesc("tokenize_engine_calls_total", "Calls to an engine's /tokenize (the others were answered from the gateway's cache), by model.", "model")
	descTokErrs    = kvDesc("tokenize_errors_total", "Tokenizations that failed or timed out, by model.", "model")
	descTokHits    = kvDesc("tokenize_cache_hits_total", "Tokenizations answered from the gateway's cache of tokenized requests.")
	descTokEntries = kvDesc("tokenize_cache_entries", "Requests held in the gateway's cache of tokenized requests.")
	descTokBytes   = kvDesc("tokenize_bytes", "Bytes the calls to engines' /tokenize in flight hold together (request bodies, answers, token ids).")
	descTokLimit   = kvDesc("tokenize_bytes_limit", "The bound of the bytes the calls to engines' /tokenize in flight hold together (--tokenize-max-bytes).")
	descTokOver    = kvDesc("tokenize_over_budget_total", "Calls to an engine's /tokenize refused because all calls in flight together would pass --tokenize-max-bytes (the request is keyed without tokens).")
	descFallbacks  = kvDesc("exact_fallbacks_total",
		"Requests of a model on the exact index routed without a token key (as if nothing were cached), by model and reason: tokenize_error, short_prompt, unsupported.",
		"model", "reason")

	allKVDescs = []*prometheus.Desc{descKVMessages, descKVMalformed, descKVEvents, descKVApplied, descKVDropped, descKVStored,
		descKVRemoved, descKVGaps, descKVRestarts, descKVOverflow, descKVBudget, descKVAll, descKVAllMax, descKVClears, descKVSkipped, descKVRejected, descKVResets, descKVReplays, descKVReplayed, descKVMapped, descKVFrames, descKVUnres,
		descKVConn, descKVConnects, descKVFails, descKVOpen, descKVClosed, descCached, descTokReqs, descTokCalls, descTokErrs, descTokHits, descTokEntries, descTokBytes, descTokLimit, descTokOver, descFallbacks}
)

// droppedBy lists an engine's dropped events by reason.
func droppedBy(e *kvevents.EngineStats) [7]struct {
	reason string
	n      uint64
} {
	return [7]struct {
		reason string
		n      uint64
	}{
		{"malformed", e.DroppedMalformed}, {"unknown", e.DroppedUnknown}, {"limit", e.DroppedLimit}, {"medium", e.DroppedMedium},
		{"block_size", e.DroppedBlockSize}, {"orphan", e.DroppedOrphan}, {"apply", e.DroppedApply},
	}
}

type reasonCount struct {
	reason string
	n      uint64
}

// guardClosed lists an endpoint's connections refused or closed, by reason.
func guardClosed(g kvevents.GuardStats) [8]reasonCount {
	return [8]reasonCount{{"full", g.Full}, {"host_full", g.HostFull}, {"source", g.RefusedSource}, {"topic", g.RefusedTopic},
		{"handshake_timeout", g.HandshakeTimeouts}, {"message_timeout", g.MessageTimeouts}, {"oversize", g.Oversize}, {"bad_handshake", g.BadHandshakes}}
}

// Describe implements prometheus.Collector.
func (c kvCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allKVDescs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c kvCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	engines, glob := s.kv.tr.Stats()
	// Two engine states may carry one source (endpoint and topic): one
	// reset (an ejection) and kept while its engine is configured, and
	// the one a reload now resolves the source to. Their figures are
	// summed into one series each: a series collected twice fails the
	// whole gather.
	type series struct {
		d      *prometheus.Desc
		t      prometheus.ValueType
		labels [3]string
		n      int
	}
	var order []series
	sums := map[series]float64{}
	sum := func(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
		k := series{d: d, t: t, n: len(labels)}
		copy(k.labels[:], labels)
		if _, ok := sums[k]; !ok {
			order = append(order, k)
		}
		sums[k] += v
	}
	sumCounter := func(d *prometheus.Desc, v uint64, labels ...string) {
		sum(d, prometheus.CounterValue, float64(v), labels...)
	}
	for i := range engines {
		e := &engines[i]
		l := []string{e.Source.Endpoint, e.Source.Topic}
		sumCounter(descKVMessages, e.Messages, l...)
		sumCounter(descKVMalformed, e.MalformedMessages, l...)
		sumCounter(descKVEvents, e.Events, l...)
		sumCounter(descKVApplied, e.Applied, l...)
		for _, d := range droppedBy(e) {
			sumCounter(descKVDropped, d.n, e.Source.Endpoint, e.Source.Topic, d.reason)
		}
		sumCounter(descKVStored, e.StoredBlocks, l...)
		sumCounter(descKVRemoved, e.RemovedBlocks, l...)
		sumCounter(descKVGaps, e.Gaps, l...)
		sumCounter(descKVRestarts, e.Restarts, l...)
		sumCounter(descKVOverflow, e.Overflows, l...)
		sumCounter(descKVBudget, e.BudgetClears, l...)
		sumCounter(descKVClears, e.Clears, l...)
		sumCounter(descKVSkipped, e.Skipped, l...)
		sumCounter(descKVRejected, e.Rejected, l...)
		sumCounter(descKVResets, e.Resets, l...)
		sumCounter(descKVReplays, e.ReplaySucceeded, e.Source.Endpoint, e.Source.Topic, "succeeded")
		sumCounter(descKVReplays, e.ReplayFailed, e.Source.Endpoint, e.Source.Topic, "failed")
		sumCounter(descKVReplayed, e.ReplayedBatches, l...)
		sum(descKVMapped, prometheus.GaugeValue, float64(e.Mapped), l...)
	}
	for _, k := range order {
		ch <- prometheus.MustNewConstMetric(k.d, k.t, sums[k], k.labels[:k.n]...)
	}
	gauge(descKVAll, float64(glob.Mapped))
	gauge(descKVAllMax, float64(glob.MaxMapped))
	counter(descKVFrames, glob.MalformedFrames)
	counter(descKVUnres, glob.Unresolved)
	for _, ep := range s.kv.endpoints() {
		b := boolLabel(ep.Bound)
		v := 0.0
		if ep.Connected {
			v = 1
		}
		gauge(descKVConn, v, ep.Endpoint, b)
		counter(descKVConnects, ep.Connects, ep.Endpoint, b)
		counter(descKVFails, ep.Failures, ep.Endpoint, b)
		gauge(descKVOpen, float64(ep.Guard.Open), ep.Endpoint, b)
		for _, c := range guardClosed(ep.Guard) {
			counter(descKVClosed, c.n, ep.Endpoint, b, c.reason)
		}
	}
	st := s.state.Load()
	for name, m := range st.Models {
		for _, gw := range []*gateway.Gateway{m.Gateway, m.prefillGateway()} {
			if gw != nil {
				for _, r := range gw.Replicas() {
					gauge(descCached, float64(r.CachedBlocks), name, r.Name)
				}
			}
		}
		if m.ExactCounters == nil {
			continue
		}
		cnt := m.ExactCounters
		counter(descTokReqs, cnt.Tokenize.Load(), name)
		counter(descTokCalls, cnt.engineCalls.Load(), name)
		counter(descTokErrs, cnt.Errors.Load(), name)
		for i := range cnt.Fallbacks {
			counter(descFallbacks, cnt.Fallbacks[i].Load(), name, FallbackNames[i])
		}
	}
	if s.kv.tc != nil {
		cs := s.kv.tc.Stats()
		counter(descTokHits, cs.Hits)
		gauge(descTokEntries, float64(cs.Entries))
	}
	if s.kv.http != nil {
		b := s.kv.http.Budget()
		gauge(descTokBytes, float64(b.Used))
		gauge(descTokLimit, float64(b.Limit))
		counter(descTokOver, b.OverBudget)
	}
}

func boolLabel(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

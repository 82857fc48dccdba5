package fleet

import (
	"slices"

	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/kvevents"
)

// KVEventsGlobal is the part of the KV-event figures no model can be
// charged with (Stats.KVEvents).
type KVEventsGlobal struct {
	// MalformedFrames counts messages without the three frames (topic,
	// 8-byte sequence number, payload).
	MalformedFrames uint64 `json:"malformed_frames"`
	// Unresolved counts messages from sources no configured replica
	// answers to (an unknown pod, an endpoint no longer configured).
	Unresolved uint64 `json:"unresolved"`
	// LastError describes the last of these faults.
	LastError string `json:"last_error,omitempty"`
	// MappedBlocks is the number of engine blocks all engines' maps
	// hold, MaxMappedBlocks its bound (Options.KVMaxMappedBlocks).
	MappedBlocks    int64 `json:"mapped_blocks"`
	MaxMappedBlocks int64 `json:"max_mapped_blocks"`
	// TokenizeBytes is what the calls to engines' /tokenize in flight
	// hold, TokenizeMaxBytes its bound (Options.TokenizeMaxBytes), and
	// TokenizeOverBudget counts the calls refused past it; all 0 with an
	// embedder's Tokenizer.
	TokenizeBytes      int64  `json:"tokenize_bytes"`
	TokenizeMaxBytes   int64  `json:"tokenize_max_bytes"`
	TokenizeOverBudget uint64 `json:"tokenize_over_budget"`
	// Endpoints are every endpoint listened on or dialled.
	Endpoints []config.KVEndpointStats `json:"endpoints"`
}

func endpointStats(ep kvevents.EndpointStatus) config.KVEndpointStats {
	out := config.KVEndpointStats{Endpoint: ep.Endpoint, Bound: ep.Bound, Connected: ep.Connected,
		Connects: ep.Connects, Failures: ep.Failures, LastError: ep.LastError, Open: ep.Guard.Open, Accepted: ep.Guard.Accepted}
	for _, c := range guardClosed(ep.Guard) {
		if c.n > 0 {
			if out.Closed == nil {
				out.Closed = map[string]uint64{}
			}
			out.Closed[c.reason] = c.n
		}
	}
	return out
}

// kvGlobalStats returns the Stats.KVEvents section, nil when no model is
// on the exact index and nothing was ever heard.
func (s *Fleet) kvGlobalStats(engines []kvevents.EngineStats, glob kvevents.GlobalStats, eps []kvevents.EndpointStatus) *KVEventsGlobal {
	if len(eps) == 0 && len(engines) == 0 && glob.MalformedFrames == 0 && glob.Unresolved == 0 {
		return nil
	}
	out := &KVEventsGlobal{MalformedFrames: glob.MalformedFrames, Unresolved: glob.Unresolved, LastError: glob.LastError,
		MappedBlocks: glob.Mapped, MaxMappedBlocks: glob.MaxMapped, Endpoints: []config.KVEndpointStats{}}
	if s.kv.http != nil {
		b := s.kv.http.Budget()
		out.TokenizeBytes, out.TokenizeMaxBytes, out.TokenizeOverBudget = b.Used, b.Limit, b.OverBudget
	}
	for _, ep := range eps {
		out.Endpoints = append(out.Endpoints, endpointStats(ep))
	}
	return out
}

// exactModelStats fills the exact index's part of a model's record.
func (s *Fleet) exactModelStats(rec *config.RoutingStats, m *Model, t *kvTable, engines []kvevents.EngineStats, eps []kvevents.EndpointStatus) {
	cnt := m.ExactCounters
	ks := &config.KVEventsStats{
		BlockSize: m.ExactBlockSize,
		Tokenize:  config.TokenizeStats{Requests: cnt.Tokenize.Load(), EngineCalls: cnt.engineCalls.Load(), Errors: cnt.Errors.Load()},
		Fallbacks: map[string]uint64{},
		Engines:   []config.KVEngineStats{},
		Endpoints: []config.KVEndpointStats{},
	}
	for i, name := range FallbackNames {
		ks.Fallbacks[name] = cnt.Fallbacks[i].Load()
	}
	for i := range engines {
		e := &engines[i]
		// An engine reset (an ejection) is resolved again on its next
		// message; until then it is shown under the replicas it would be.
		id := e.Replica
		if id == "" {
			id, _ = t.idOf(e.Source)
		}
		if id == "" || !t.modelOf(id, m.Name) {
			continue
		}
		es := config.KVEngineStats{
			Endpoint: e.Source.Endpoint, Topic: e.Source.Topic, Pod: e.Source.Pod, Replicas: t.replicasOf(id),
			Messages: e.Messages, Events: e.Events, Applied: e.Applied, Dropped: e.Dropped, MalformedMessages: e.MalformedMessages,
			StoredBlocks: e.StoredBlocks, RemovedBlocks: e.RemovedBlocks,
			Gaps: e.Gaps, Restarts: e.Restarts, Overflows: e.Overflows, Clears: e.Clears, BudgetClears: e.BudgetClears, Resets: e.Resets,
			Skipped: e.Skipped, Rejected: e.Rejected,
			ReplayAttempts: e.ReplayAttempts, ReplaySucceeded: e.ReplaySucceeded, ReplayFailed: e.ReplayFailed, ReplayedBatches: e.ReplayedBatches,
			MappedBlocks: e.Mapped, LastError: e.LastError,
		}
		for _, d := range droppedBy(e) {
			if d.n > 0 {
				if es.DroppedBy == nil {
					es.DroppedBy = map[string]uint64{}
				}
				es.DroppedBy[d.reason] = d.n
			}
		}
		ks.Engines = append(ks.Engines, es)
	}
	srcs := t.sourcesOf(m.Cfg)
	for _, ep := range eps {
		if slices.Contains(srcs, ep.Endpoint) {
			ks.Endpoints = append(ks.Endpoints, endpointStats(ep))
		}
	}
	rec.KVEvents = ks
}

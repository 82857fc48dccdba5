package fleet

import (
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/examlops/gateway/config"
)

// Stats is the body of GET /stats (schema in docs/stats.md).
// It embeds config.StatsDocument, so a client that decodes the body into a
// config.StatsDocument reads the per-model statistics and ignores the rest.
type Stats struct {
	config.StatsDocument
	// Engines describes every configured engine address, sorted by address.
	Engines []EngineStats `json:"engines"`
	// KVEvents holds the KV-event figures no model is charged with, and
	// every endpoint listened on or dialled; absent when no model is on
	// the exact index.
	KVEvents *KVEventsGlobal `json:"kv_events,omitempty"`
}

// EngineStats is one engine address as the gateway sees it.
type EngineStats struct {
	// Address is the engine's base URL.
	Address string `json:"address"`
	// Healthy is false while the engine is ejected.
	Healthy bool `json:"healthy"`
	// Load is the last load scraped from its /metrics; absent before the
	// first successful scrape.
	Load *EngineLoad `json:"load,omitempty"`
	// LoadAt is when Load was scraped; absent (zero) with Load.
	LoadAt time.Time `json:"load_at,omitzero"`
	// ScrapeError is the last scrape's error, "" when it succeeded.
	ScrapeError string `json:"scrape_error,omitempty"`
	// Engine is the engine type (vllm, sglang, trtllm) whose metric
	// names its last metrics page had, or "custom" for the names of
	// Options.EngineMetrics; absent before the first successful scrape or
	// when the page had none.
	Engine string `json:"engine,omitempty"`
	// LoadWarning says that its last metrics page had none of the load
	// series expected (Load then reads zero); absent otherwise.
	LoadWarning string `json:"load_warning,omitempty"`
	// Models lists the models that route to this engine.
	Models []string `json:"models"`
	// Adapters is its LoRA adapter state: those its GET /v1/models lists
	// and its last vllm:lora_requests_info; absent before either.
	Adapters *EngineAdapters `json:"adapters,omitempty"`
}

// EngineLoad is a scraped engine load.
type EngineLoad struct {
	// Waiting is vllm:num_requests_waiting (or the engine type's
	// equivalent: sglang:num_queue_reqs, ...; see ParseEngineMetricsFor).
	Waiting int `json:"waiting"`
	// Running is vllm:num_requests_running (sglang:num_running_reqs, ...).
	Running int `json:"running"`
	// KVUtilization is vllm:kv_cache_usage_perc (sglang:token_usage,
	// ...), 0..1.
	KVUtilization float64 `json:"kv_utilization"`
}

// Stats returns the gateway's statistics, as GET /stats serves them.
func (s *Fleet) Stats() Stats {
	st := s.state.Load()
	out := Stats{StatsDocument: config.StatsDocument{Models: make(map[string]config.RoutingStats, len(st.Models))}, Engines: []EngineStats{}}
	users := map[*Endpoint][]string{}
	engines, glob := s.kv.tr.Stats()
	eps := s.kv.endpoints()
	out.KVEvents = s.kvGlobalStats(engines, glob, eps)
	for name, m := range st.Models {
		if m.Gateway == nil {
			out.Models[name] = config.RoutingStats{Model: name, Source: config.SourceGateway, Mode: m.Mode.String(), Index: m.Cfg.IndexName(),
				Decisions: map[string]uint64{}, Replicas: []config.ReplicaStats{}}
			continue
		}
		reps := m.Gateway.Replicas()
		rec := config.StatsFromGateway(name, config.SourceGateway, m.Mode, m.Gateway.Stats(), reps)
		rec.Index = m.Cfg.IndexName()
		for _, r := range reps {
			if i := slices.IndexFunc(rec.Replicas, func(x config.ReplicaStats) bool { return x.Name == r.Name }); i >= 0 {
				rec.Replicas[i].CachedBlocks = r.CachedBlocks
			}
		}
		if m.PD != nil {
			rec.Disaggregation = m.PD.stats(name, m.Cfg)
		}
		if m.ExactCounters != nil {
			s.exactModelStats(&rec, m, st.KV, engines, eps)
		}
		out.Models[name] = rec
		for _, ep := range m.ByName {
			if !slices.Contains(users[ep], name) {
				users[ep] = append(users[ep], name)
			}
		}
	}
	for _, ep := range st.Endpoints {
		l, has, _, lastErr := ep.SnapshotLoad()
		es := EngineStats{Address: ep.Base, Healthy: ep.Health.Healthy(), ScrapeError: lastErr, Models: users[ep], Adapters: adapterStats(ep)}
		es.Engine, es.LoadWarning = s.engineOf(ep)
		if has {
			es.Load = &EngineLoad{Waiting: l.QueueDepth, Running: l.Running, KVUtilization: l.KVUtilization}
			es.LoadAt = l.At
		}
		if es.Models == nil {
			es.Models = []string{}
		}
		slices.Sort(es.Models)
		out.Engines = append(out.Engines, es)
	}
	slices.SortFunc(out.Engines, func(a, b EngineStats) int { return strings.Compare(a.Address, b.Address) })
	return out
}

// ModelList is the OpenAI GET /v1/models body.
type ModelList struct {
	Object string       `json:"object"`
	Data   []ModelEntry `json:"data"`
}

type ModelEntry struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// Root is what vLLM calls the model's root: the weights its engines
	// report for it, or its name; for an adapter, its name. "" is
	// written as the ID.
	Root string `json:"root"`
	// Parent is a LoRA adapter's model, as vLLM lists it; "" (a model) is
	// written as null.
	Parent string `json:"parent"`
	// MaxModelLen is the smallest max_model_len the model's engines
	// report; nil (omitted) when none does.
	MaxModelLen *int `json:"max_model_len,omitempty"`
}

// MarshalJSON writes the entry as vLLM's ModelCard: root defaults to the
// id, and a model's parent is null.
func (e ModelEntry) MarshalJSON() ([]byte, error) {
	type plain ModelEntry
	out := struct {
		plain
		Parent *string `json:"parent"`
	}{plain: plain(e)}
	if out.Root == "" {
		out.Root = e.ID
	}
	if e.Parent != "" {
		out.Parent = &e.Parent
	}
	return json.Marshal(out)
}

// ModelList is the body of GET /v1/models: the configured models, then
// the LoRA adapters served, each with its model as parent.
func (s *Fleet) ModelList() ModelList {
	st := s.state.Load()
	list := ModelList{Object: "list", Data: []ModelEntry{}}
	for _, name := range st.File.Names() {
		list.Data = append(list.Data, s.modelCard(st.Models[name], name))
	}
	list.Data = append(list.Data, adapterEntries(st)...)
	return list
}

package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/examlops/gateway"
)

// Sources of a [RoutingStats] document.
const (
	// SourceGateway marks statistics of a running gateway.
	SourceGateway = "gateway"
	// SourceSimulated marks statistics of a simulation.
	SourceSimulated = "simulated"
)

// ErrNoStats reports that no statistics are stored for a model.
var ErrNoStats = errors.New("gateway: no routing statistics")

// RoutingStats is one model's routing statistics as JSON: what the HTTP
// gateway serves at GET /stats (inside a [StatsDocument]) and what
// `exa serve routing simulate` saves for `exa serve routing stats`. The
// zero value is an empty record.
type RoutingStats struct {
	// Model is the model name.
	Model string `json:"model"`
	// Source is SourceGateway or SourceSimulated.
	Source string `json:"source"`
	// Mode is the routing mode the figures were taken under (a gateway
	// mode name, or for simulations the policy name); "" if unknown.
	Mode string `json:"mode,omitempty"`
	// Workload describes a simulated workload in one line; "" for a gateway.
	Workload string `json:"workload,omitempty"`
	// Requests counts routed requests; Hits those whose chosen replica
	// held the whole prefix.
	Requests uint64 `json:"requests"`
	Hits     uint64 `json:"hits"`
	// HitRate is Hits/Requests (0 with no requests).
	HitRate float64 `json:"hit_rate"`
	// Blocks sums the prefix blocks routed and MatchedBlocks those the
	// chosen replicas held according to the router's index; BlockHitRate
	// is their ratio (0 with no blocks).
	Blocks        uint64  `json:"blocks"`
	MatchedBlocks uint64  `json:"matched_blocks"`
	BlockHitRate  float64 `json:"block_hit_rate"`
	// TokenHitRate, for simulations, is the fraction of prompt tokens the
	// simulated engines served from their caches; 0 for a gateway.
	TokenHitRate float64 `json:"token_hit_rate,omitempty"`
	// Decisions counts decisions by kind: round_robin, affinity, load_aware.
	Decisions map[string]uint64 `json:"decisions"`
	// SLOExcluded counts replicas left out of decisions for breaching the
	// SLO; SLOFallbacks decisions routed within the healthy set because
	// every healthy replica breached it.
	SLOExcluded  uint64 `json:"slo_excluded"`
	SLOFallbacks uint64 `json:"slo_fallbacks"`
	// NoMatch and LoadGuard count cache-aware fallbacks to load-aware
	// routing (nothing matched; the best match was too loaded).
	NoMatch   uint64 `json:"no_match"`
	LoadGuard uint64 `json:"load_guard"`
	// NoHealthy counts requests that failed for want of a healthy replica.
	NoHealthy uint64 `json:"no_healthy"`
	// Objectives, once a request with a latency objective was routed,
	// counts those requests and how they did; nil (omitted) before.
	Objectives *ObjectiveStats `json:"objectives,omitempty"`
	// Replicas gives each replica's routed requests and share, by name.
	Replicas []ReplicaStats `json:"replicas"`
	// Disaggregation, for a gateway's disaggregated model, gives the P/D
	// decider's and split requests' figures; the record's other fields
	// are then the decode pool's. Nil otherwise.
	Disaggregation *DisaggregationStats `json:"disaggregation,omitempty"`
	// Simulation, for simulated records, holds the simulator's fuller
	// report (JSON, as the simulator writes it); nil otherwise.
	Simulation json.RawMessage `json:"simulation,omitempty"`
	// Index, for a gateway, is the model's index: approximate or exact.
	Index string `json:"index,omitempty"`
	// KVEvents, for a gateway model on the exact index, describes its
	// tokenization and its engines' KV events; nil otherwise.
	KVEvents *KVEventsStats `json:"kv_events,omitempty"`
}

// ObjectiveStats counts a model's requests with a latency objective
// (gateway.Target.TTFT, TPOT: the x-slo-ttft-ms and x-slo-tpot-ms
// headers, or the model's default) as the routing library saw them.
type ObjectiveStats struct {
	// Requests counts the decisions made for them; BestEffort those for
	// which no replica was predicted to meet the objective (a front
	// configured to reject them answered 429).
	Requests   uint64 `json:"requests"`
	BestEffort uint64 `json:"best_effort"`
	// TTFTMet and TTFTMissed count the answers whose first token was seen
	// by how they did against a TTFT objective (measured from routing);
	// TPOTMet and TPOTMissed those with more than one output token against
	// a TPOT objective.
	TTFTMet    uint64 `json:"ttft_met"`
	TTFTMissed uint64 `json:"ttft_missed"`
	TPOTMet    uint64 `json:"tpot_met"`
	TPOTMissed uint64 `json:"tpot_missed"`
}

// ReplicaStats is one replica's share of a model's requests.
type ReplicaStats struct {
	// Name is the replica's name.
	Name string `json:"name"`
	// Routed counts requests routed to it; Hits those fully cached there.
	Routed uint64 `json:"routed"`
	Hits   uint64 `json:"hits"`
	// Share is Routed over all routed requests (0 with none).
	Share float64 `json:"share"`
	// Healthy is false for an ejected replica; simulations report true.
	Healthy bool `json:"healthy"`
	// PrefillTokens, for simulations, counts the prompt tokens the replica
	// computed (not served from cache); 0 for a gateway.
	PrefillTokens int64 `json:"prefill_tokens,omitempty"`
	// CachedBlocks, for a gateway, is the number of blocks its index holds
	// for the replica (the index size); 0 for simulations.
	CachedBlocks int `json:"cached_blocks,omitempty"`
	// InFlight, for a gateway, counts the requests routed to the replica
	// that have not ended (gateway.ReplicaStatus.InFlight); 0 (omitted)
	// for simulations and idle replicas.
	InFlight int `json:"in_flight,omitempty"`
	// BlockTimeMS and TokenTimeMS, for a gateway, are the replica's
	// learned time per block of prefill and per output token, in
	// milliseconds (gateway.ReplicaStatus.BlockTime, TokenTime); 0
	// (omitted) while unknown and for simulations.
	BlockTimeMS float64 `json:"block_time_ms,omitempty"`
	TokenTimeMS float64 `json:"token_time_ms,omitempty"`
}

// StatsDocument is the body of the HTTP gateway's GET /stats: statistics
// of every model it serves, keyed by model name.
type StatsDocument struct {
	// Models maps a model name to its statistics.
	Models map[string]RoutingStats `json:"models"`
}

// StatsFromGateway builds a model's record from a live gateway's counters
// and replica statuses; source is usually SourceGateway.
func StatsFromGateway(model, source string, mode gateway.Mode, s gateway.Stats, rs []gateway.ReplicaStatus) RoutingStats {
	out := RoutingStats{
		Model: model, Source: source, Mode: mode.String(),
		Requests: s.Routed, Hits: s.Hits, HitRate: fraction(s.Hits, s.Routed),
		Blocks: s.Blocks, MatchedBlocks: s.MatchedBlocks, BlockHitRate: fraction(s.MatchedBlocks, s.Blocks),
		Decisions:    map[string]uint64{},
		SLOExcluded:  s.SLOExcluded,
		SLOFallbacks: s.SLOFallbacks,
		NoMatch:      s.NoMatch, LoadGuard: s.LoadGuard, NoHealthy: s.NoHealthy,
		Replicas: []ReplicaStats{},
	}
	for k, v := range s.ByKind {
		out.Decisions[k] = v
	}
	if s.ObjectiveRequests > 0 {
		out.Objectives = &ObjectiveStats{Requests: s.ObjectiveRequests, BestEffort: s.ObjectiveBestEffort,
			TTFTMet: s.TTFTMet, TTFTMissed: s.TTFTMissed, TPOTMet: s.TPOTMet, TPOTMissed: s.TPOTMissed}
	}
	var total uint64
	for _, r := range rs {
		total += r.Routed
	}
	for _, r := range rs {
		out.Replicas = append(out.Replicas, ReplicaStats{Name: r.Name, Routed: r.Routed, Hits: r.Hits, Share: fraction(r.Routed, total), Healthy: r.Healthy,
			InFlight: r.InFlight, BlockTimeMS: ms(r.BlockTime), TokenTimeMS: ms(r.TokenTime)})
	}
	slices.SortFunc(out.Replicas, func(a, b ReplicaStats) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
}

// maxStatsStem bounds the part of a statistics file name before ".json":
// with ".json" and the temporary name a write uses beside it
// ("." + name + ".tmp-" + up to 10 digits) it stays within the 255 bytes a
// file name may have on Linux, macOS and Windows file systems.
const maxStatsStem = 200

// StatsPath returns the file in which the statistics of model are kept,
// beside the configuration file at configPath: stats/<escaped model>.json.
// The model name is path-escaped, so names with slashes are safe. When the
// escaped name is longer than 200 bytes (a model name may have
// [MaxNameBytes] bytes, and escaping can triple them) the file is named by
// its first bytes, "%~" (which escaping never produces) and 16 hex digits of
// the name's SHA-256, so every valid model name has a file that can be
// written.
func StatsPath(configPath, model string) string {
	stem := url.PathEscape(model)
	if len(stem) > maxStatsStem {
		sum := sha256.Sum256([]byte(model))
		cut := maxStatsStem - 2 - 16
		// Do not split a %XX escape.
		if i := strings.LastIndexByte(stem[:cut], '%'); i >= 0 && i+3 > cut {
			cut = i
		}
		stem = stem[:cut] + "%~" + hex.EncodeToString(sum[:8])
	}
	return filepath.Join(StatsDir(configPath), stem+".json")
}

// SaveStats stores rec as the latest statistics of rec.Model beside the
// configuration file at configPath, atomically.
func SaveStats(configPath string, rec RoutingStats) error {
	if err := ValidateModelName(rec.Model); err != nil {
		return err
	}
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return fmt.Errorf("gateway: encode stats: %w", err)
	}
	if err := os.MkdirAll(StatsDir(configPath), 0o755); err != nil {
		return fmt.Errorf("gateway: create stats dir: %w", err)
	}
	return WriteFileAtomic(StatsPath(configPath, rec.Model), append(data, '\n'))
}

// LoadStats returns the stored statistics of model, an error wrapping
// [ErrNoStats] if there are none, or one wrapping [ErrCorrupt] naming the
// file if they cannot be decoded.
func LoadStats(configPath, model string) (RoutingStats, error) {
	path := StatsPath(configPath, model)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return RoutingStats{}, fmt.Errorf("%w for model %q", ErrNoStats, model)
	}
	if err != nil {
		return RoutingStats{}, fmt.Errorf("gateway: read stats: %w", err)
	}
	var rec RoutingStats
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&rec); err != nil {
		return RoutingStats{}, fmt.Errorf("%w %s: %v", ErrCorrupt, path, err)
	}
	return rec, nil
}

// fraction returns a/b, or 0 when b is 0.
func fraction(a, b uint64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// ErrNotServed reports that a gateway's statistics have no record of the
// model asked for.
var ErrNotServed = errors.New("the gateway does not serve model")

// DecodeGatewayStats decodes the body of a gateway's GET /stats, bytes
// read from the network, and returns the record of model. The body is a
// [StatsDocument], or a single [RoutingStats] (an object with a "model"
// key and no "models" key). Unknown fields are ignored, so that a newer
// gateway can add some. A body that is not such JSON is an error; a
// document without the model is an error wrapping [ErrNotServed]. The
// record returned has Model set to model and Source to [SourceGateway]
// when the body left it empty. Its strings are as the gateway sent them:
// escape them before printing them to a terminal.
func DecodeGatewayStats(body []byte, model string) (RoutingStats, error) {
	var doc struct {
		Models map[string]RoutingStats `json:"models"`
		Model  *string                 `json:"model"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return RoutingStats{}, fmt.Errorf("bad JSON: %v", err)
	}
	if doc.Models == nil && doc.Model != nil {
		var rec RoutingStats
		if err := json.Unmarshal(body, &rec); err != nil {
			return RoutingStats{}, fmt.Errorf("bad JSON: %v", err)
		}
		doc.Models = map[string]RoutingStats{rec.Model: rec}
	}
	rec, ok := doc.Models[model]
	if !ok {
		return RoutingStats{}, fmt.Errorf("%w %q", ErrNotServed, model)
	}
	if rec.Source == "" {
		rec.Source = SourceGateway
	}
	rec.Model = model
	return rec, nil
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

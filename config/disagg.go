package config

import (
	"fmt"
)

// P/D modes accepted in [Model.PDMode]: how the HTTP gateway splits the
// requests of a disaggregated model.
const (
	// PDModeGateway: the gateway sends the prefill request to the prefill
	// replica and then the decode request, carrying the prefill's
	// kv_transfer_params, to the decode replica (vLLM's NixlConnector
	// protocol as llm-d's pd-sidecar drives it).
	PDModeGateway = "gateway"
	// PDModeSidecar: the gateway picks both replicas and sends the request
	// to the decode replica with the prefill replica's host:port in the
	// x-prefiller-host-port header, for decode replicas that run behind
	// llm-d's pd-sidecar, which runs the two requests itself.
	PDModeSidecar = "sidecar"
)

// PDModes lists the accepted P/D modes, default first.
var PDModes = []string{PDModeGateway, PDModeSidecar}

// DefaultPDMinUncachedTokens is the decider's default threshold: a request
// of a disaggregated model is split only when at least this many of its
// prompt tokens are not cached on the decode replica chosen for it; a
// shorter uncached part is prefilled on the decode replica itself. 512
// tokens keeps interactive chat turns (typically tens to a few hundred new
// tokens over a cached conversation) co-located, where a KV transfer costs
// more than the prefill it moves, and splits long uncached prompts (new
// documents, first turns over a long system prompt), whose prefill would
// stall the decode replica's other streams. llm-d's shipped configurations
// use 16 (nonCachedTokens), which its own BLIS simulations found splits
// nearly every chat turn for little gain; Dynamo's conditional
// disaggregation uses 1000 (max_local_prefill_length). See
// docs/disaggregation.md.
const DefaultPDMinUncachedTokens = 512

// MaxPDMinUncachedTokens bounds [Model.PDMinUncachedTokens]: ten million
// tokens, beyond any model's context.
const MaxPDMinUncachedTokens = 10_000_000

// PDModeName returns the model's P/D mode with the default filled in.
func (m Model) PDModeName() string {
	if m.PDMode == "" {
		return PDModeGateway
	}
	return m.PDMode
}

// MinUncachedTokens returns the decider's threshold with the default
// filled in.
func (m Model) MinUncachedTokens() int {
	if m.PDMinUncachedTokens == nil {
		return DefaultPDMinUncachedTokens
	}
	return *m.PDMinUncachedTokens
}

// ParsePDMode checks a P/D mode name; "" is the default, gateway. The
// error is a [*FieldError] for field "pd_mode".
func ParsePDMode(s string) (string, error) {
	switch s {
	case "":
		return PDModeGateway, nil
	case PDModeGateway, PDModeSidecar:
		return s, nil
	}
	return "", &FieldError{Field: "pd_mode", Value: s, Reason: "want gateway or sidecar"}
}

// validatePD checks the P/D fields; names in errors are relative to the
// model.
func (m Model) validatePD() error {
	if _, err := ParsePDMode(m.PDMode); err != nil {
		return err
	}
	if p := m.PDMinUncachedTokens; p != nil && (*p < 0 || *p > MaxPDMinUncachedTokens) {
		return &FieldError{Field: "pd_min_uncached_tokens", Value: fmt.Sprint(*p),
			Reason: fmt.Sprintf("want 0..%d (0 splits every request)", MaxPDMinUncachedTokens)}
	}
	return nil
}

// DisaggregationStats is the P/D part of a disaggregated model's
// [RoutingStats]: how the decider chose and how the split requests fared,
// since the gateway last built the model's routing table. The zero value
// is an empty record.
type DisaggregationStats struct {
	// Mode is the P/D mode, gateway or sidecar.
	Mode string `json:"mode"`
	// MinUncachedTokens is the decider's threshold.
	MinUncachedTokens int `json:"min_uncached_tokens"`
	// Decided counts requests the decider saw; Split those it split
	// (whatever then happened to the prefill); SplitShare is Split over
	// Decided (0 with none).
	Decided    uint64  `json:"decided"`
	Split      uint64  `json:"split"`
	SplitShare float64 `json:"split_share"`
	// Fallbacks counts departures from the plan, by reason:
	// prefill_unavailable (no healthy prefill replica: co-located),
	// prefill_failed (the prefill failed other than with a 4xx:
	// co-located), prefill_no_kv_params (the prefill answer carried no
	// kv_transfer_params: co-located), decode_retry (the decode replica
	// failed before its first byte: retried on another one), prefill_retry
	// (gateway mode: a failed prefill retried on another prefill replica).
	Fallbacks map[string]uint64 `json:"fallbacks"`
	// Prefill is the routing record of the prefill pool (requests routed
	// there, hits, replicas); the enclosing record is the decode pool's.
	Prefill *RoutingStats `json:"prefill,omitempty"`
}

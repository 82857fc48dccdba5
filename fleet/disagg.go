package fleet

import (
	"net/url"
	"slices"
	"sync/atomic"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
)

// PDReason is why a disaggregated request left the decider's plan.
type PDReason int

const (
	PDPrefillUnavailable PDReason = iota // no healthy prefill replica: co-located
	PDPrefillBusy                        // every prefill replica queued more than the decode one: co-located
	PDPrefillFailed                      // prefill failed other than with a 4xx: co-located
	PDPrefillNoKV                        // prefill answer without kv_transfer_params: co-located
	PDDecodeRetry                        // decode replica failed before its first byte: retried
	PDPrefillRetry                       // prefill failed (not a 4xx): retried on another prefill replica
	NumPDReasons
)

var pdReasonNames = [NumPDReasons]string{"prefill_unavailable", "prefill_busy", "prefill_failed", "prefill_no_kv_params", "decode_retry", "prefill_retry"}

func (r PDReason) String() string { return pdReasonNames[r] }

// DisaggCounters are a disaggregated model's decider figures for /stats. They
// live as long as the model's gateways.
type DisaggCounters struct {
	Decided, Split atomic.Uint64
	Fallbacks      [NumPDReasons]atomic.Uint64
}

// Disagg is a disaggregated model's P/D routing: the library's plan
// (gateway.PD: its Decode is the model's gw, its MinUncached the
// decider's threshold) and the settings that execute it. Immutable once
// built, but for the counters.
type Disagg struct {
	Plan *gateway.PD // Prefill is nil when the prefill pool is empty
	// Sidecar selects Sidecar mode (config.PDModeSidecar).
	Sidecar bool
	// MinUncached is the decider's threshold in tokens; tokensPerBlock
	// converts unmatched approximate key blocks into tokens, exactBS
	// (0 on the approximate index) unmatched blocks of engine tokens.
	MinUncached, tokensPerBlock, exactBS int
	// hostPort maps a prefill replica's address (its endpoint's base, as
	// the prefill pool's decisions carry it) to the host:port the sidecar
	// is given (PrefillHostPort); PrefillNames holds the prefill
	// replicas' names.
	hostPort     map[string]string
	PrefillNames map[string]bool
	Counters     *DisaggCounters
}

// PrefillHostPort returns the host:port of the prefill replica of d, the
// one a sidecar is given in x-prefiller-host-port: its address's. The
// prefill pool's gateway is kept across reloads, so a plan made with the
// state from before one (a request held by flow control, say) may name a
// replica that the reload added or moved: the address d carries is then
// read. Safe for concurrent use.
func (pd *Disagg) PrefillHostPort(d *gateway.Decision) string {
	if hp, ok := pd.hostPort[d.Address]; ok {
		return hp
	}
	u, err := url.Parse(d.Address)
	if err != nil { // not reached: a replica's address is a valid URL
		return ""
	}
	return u.Host
}

// bytesPerToken is the decider's estimate of prompt bytes per token, as
// llm-d's prefix-based decider estimates it (AverageCharactersPerToken).
const bytesPerToken = 4

// BlockTokens is how many prompt tokens one block of a request's key
// stands for, for the plan's threshold (gateway.PD.Route). On the exact
// index a request keyed by its tokens (fallback -1) has blocks of exactBS
// engine tokens, which the decode engines' own events say they hold or not
// (the tokens of a last partial block are not counted: no engine caches
// them); a request keyed without tokens falls back to the approximate key,
// which the exact index never matches.
func (pd *Disagg) BlockTokens(fallback int) int {
	if pd.exactBS > 0 && fallback < 0 {
		return pd.exactBS
	}
	return pd.tokensPerBlock
}

// stats returns the model's P/D record; dec is the decode pool's record.
func (pd *Disagg) stats(name string, cfg config.Model) *config.DisaggregationStats {
	out := &config.DisaggregationStats{
		Mode:              cfg.PDModeName(),
		MinUncachedTokens: pd.MinUncached,
		Decided:           pd.Counters.Decided.Load(),
		Split:             pd.Counters.Split.Load(),
		Fallbacks:         make(map[string]uint64, NumPDReasons),
	}
	if out.Decided > 0 {
		out.SplitShare = float64(out.Split) / float64(out.Decided)
	}
	for r := range NumPDReasons {
		out.Fallbacks[r.String()] = pd.Counters.Fallbacks[r].Load()
	}
	if p := pd.Plan.Prefill; p != nil {
		reps := p.Replicas()
		rec := config.StatsFromGateway(name, config.SourceGateway, gateway.ModeCacheAware, p.Stats(), reps)
		rec.Index = cfg.IndexName()
		for _, r := range reps {
			if i := slices.IndexFunc(rec.Replicas, func(x config.ReplicaStats) bool { return x.Name == r.Name }); i >= 0 {
				rec.Replicas[i].CachedBlocks = r.CachedBlocks
			}
		}
		out.Prefill = &rec
	}
	return out
}

package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Report is the outcome of Run: one Result per policy, in Config.Policies
// order, and the two bounds. Times are in seconds.
type Report struct {
	// Workload is the workload's one-line description.
	Workload string `json:"workload"`
	// Preset is the replica model used.
	Preset Preset `json:"preset"`
	// Replicas is the replica count.
	Replicas int `json:"replicas"`
	// BlockTokens is the tokens per KV block; CacheBlocks the blocks per
	// replica.
	BlockTokens int `json:"block_tokens"`
	CacheBlocks int `json:"cache_blocks"`
	// Index is "approximate" or "exact".
	Index string `json:"index"`
	// RefreshInterval is the load-signal refresh interval.
	RefreshInterval float64 `json:"refresh_interval_s"`
	// SLO is the time-to-first-token objective.
	SLO float64 `json:"slo_ttft_s"`
	// Seed is the seed used.
	Seed uint64 `json:"seed"`
	// Requests is the number of requests in the workload.
	Requests int `json:"requests"`
	// Results has one entry per policy.
	Results []Result `json:"results"`
	// PooledLRU is the hit rate of one LRU cache of the cluster's total
	// capacity; Unbounded that of a cache without limit (the ceiling).
	PooledLRU Bound `json:"pooled_lru"`
	Unbounded Bound `json:"unbounded"`
}

// Result holds one policy's figures.
type Result struct {
	// Policy is the policy's name.
	Policy string `json:"policy"`
	// Requests arrived; Completed finished; Dropped were shed by a full
	// queue (Config.MaxQueue); Failed could not be routed or are larger
	// than a replica's cache. Requests = Completed + Dropped + Failed.
	Requests  int `json:"requests"`
	Completed int `json:"completed"`
	Dropped   int `json:"dropped"`
	Failed    int `json:"failed"`
	// TokenHitRate is the fraction of prompt tokens served from the
	// replicas' caches; RequestHitRate the fraction of requests that found
	// any cached block.
	TokenHitRate   float64 `json:"token_hit_rate"`
	RequestHitRate float64 `json:"request_hit_rate"`
	// RouterTokenHitRate is the token hit rate the gateway's index
	// predicted when routing; its gap to TokenHitRate is the index's error.
	RouterTokenHitRate float64 `json:"router_token_hit_rate"`
	// TTFT is the time to first token; E2E the end-to-end latency.
	TTFT Latency `json:"ttft"`
	E2E  Latency `json:"e2e"`
	// Throughput is output tokens per second and RequestRate completed
	// requests per second, over Duration, from the first arrival to the
	// last completion.
	Throughput  float64 `json:"throughput_tok_s"`
	RequestRate float64 `json:"request_rate"`
	Duration    float64 `json:"duration_s"`
	// Imbalance is the largest replica's prefill tokens (computed, not
	// cached) over the mean; 1 is perfect balance.
	Imbalance float64 `json:"imbalance"`
	// SLOAttainment is the fraction of requests whose first token came
	// within the SLO.
	SLOAttainment float64 `json:"slo_attainment"`
	// PrefillTokens is the prefill tokens computed by each replica.
	PrefillTokens []int64 `json:"prefill_tokens"`
	// Decisions counts the gateway's decisions by kind.
	Decisions map[string]uint64 `json:"decisions"`

	ttft *hist
}

// Latency summarises a latency distribution, in seconds. Quantiles are
// accurate to 1%.
type Latency struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
}

// Result returns the result of the policy called name.
func (r *Report) Result(name string) (Result, bool) {
	for _, x := range r.Results {
		if x.Policy == name {
			return x, true
		}
	}
	return Result{}, false
}

// WriteTable writes the report as an aligned text table: a header naming
// the workload and setup, one row per policy, then the bounds. "index says"
// is the token hit rate the gateway's index predicted (RouterTokenHitRate).
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "workload: %s\n", r.Workload)
	fmt.Fprintf(&b, "cluster:  %d × %s (%s), %d blocks × %d tokens of KV cache each; %s index; signals every %gs; TTFT SLO %gs\n",
		r.Replicas, r.Preset.Name, r.Preset.Description, r.CacheBlocks, r.BlockTokens, r.Index, r.RefreshInterval, r.SLO)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\ttok hit\treq hit\tindex says\tTTFT mean\tp50\tp90\tp99\tE2E mean\tp99\ttok/s\timbal\tSLO\tdone\tdrop\tfail\t")
	for _, x := range r.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f\t%.2f\t%s\t%d\t%d\t%d\t\n",
			x.Policy, pct(x.TokenHitRate), pct(x.RequestHitRate), pct(x.RouterTokenHitRate), sec(x.TTFT.Mean), sec(x.TTFT.P50), sec(x.TTFT.P90), sec(x.TTFT.P99),
			sec(x.E2E.Mean), sec(x.E2E.P99), x.Throughput, x.Imbalance, pct(x.SLOAttainment), x.Completed, x.Dropped, x.Failed)
	}
	for _, bd := range []Bound{r.PooledLRU, r.Unbounded} {
		fmt.Fprintf(tw, "%s (bound)\t%s\t%s\t\t\t\t\t\t\t\t\t\t\t\t\t\t\n", bd.Name, pct(bd.TokenHitRate), pct(bd.RequestHitRate))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func pct(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }

func sec(s float64) string {
	switch {
	case s == 0:
		return "0"
	case s < 1:
		return fmt.Sprintf("%.0fms", s*1e3)
	case s < 100:
		return fmt.Sprintf("%.2fs", s)
	default:
		return fmt.Sprintf("%.0fs", s)
	}
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

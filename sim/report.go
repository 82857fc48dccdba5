package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/flow"
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
	// BlockTokens is the number of tokens per KV block, the workload's.
	BlockTokens int `json:"block_tokens"`
	// CacheBlocks is the KV-cache capacity of one replica in blocks:
	// Preset.KVTokens / BlockTokens.
	CacheBlocks int `json:"cache_blocks"`
	// Index is "approximate" or "exact".
	Index string `json:"index"`
	// Gateways is Config.Gateways when more than one gateway shared the
	// traffic; 0, and left out of the JSON, for one.
	Gateways int `json:"gateways,omitempty"`
	// SharePending is Config.SharePending when more than one gateway
	// shared the traffic; false, and left out of the JSON, otherwise.
	SharePending bool `json:"share_pending,omitempty"`
	// PeerRefreshInterval is Config.PeerRefreshInterval in seconds when
	// the gateways share their pending prefill on a clock of their own; 0,
	// and left out of the JSON, when they share it at every load refresh.
	PeerRefreshInterval float64 `json:"peer_refresh_interval_s,omitempty"`
	// NonStreamed is Config.NonStreamed, the share of clients that do not
	// stream; 0, and left out of the JSON, when all stream.
	NonStreamed float64 `json:"non_streamed,omitempty"`
	// UpstreamStream is Config.UpstreamStream, reported with NonStreamed.
	UpstreamStream bool `json:"upstream_stream,omitempty"`
	// CacheAtSchedule is Config.CacheAtSchedule: the engines cached a
	// prefill's blocks when their step was scheduled; false, and left out
	// of the JSON, when they cached them at the step's end (the default).
	CacheAtSchedule bool `json:"cache_at_schedule,omitempty"`
	// RateLimit is Config.RateLimit's rate per tenant at each gateway;
	// zero without.
	RateLimit flow.Rate `json:"rate_limit,omitzero"`
	// ReplicaSpeeds is Config.ReplicaSpeeds when a replica runs at a
	// speed other than 1 (or SpeedChanges is set); nil, and left out of the
	// JSON, otherwise.
	ReplicaSpeeds []float64 `json:"replica_speeds,omitempty"`
	// SpeedChanges is Config.SpeedChanges in order of At; nil, and left
	// out of the JSON, without.
	SpeedChanges []SpeedChange `json:"speed_changes,omitempty"`
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
	// capacity (Replicas × CacheBlocks), fed every request in arrival
	// order.
	PooledLRU Bound `json:"pooled_lru"`
	// Unbounded is the hit rate of one cache without a size limit, the
	// ceiling no policy can beat.
	Unbounded Bound `json:"unbounded"`
	// MaxLoras is Config.MaxLoras when the workload names LoRA adapters;
	// 0 otherwise.
	MaxLoras int `json:"max_loras,omitempty"`
	// AdapterLoad is Config.AdapterLoad in seconds when the workload
	// names LoRA adapters; 0 otherwise.
	AdapterLoad float64 `json:"adapter_load_s,omitempty"`
	// Ideal is the row "ideal (pooled cache, no queue)": the distribution
	// of the time to first token each request would see alone on an idle
	// replica holding the pooled-LRU cache (its hit as in PooledLRU, its
	// prefill as Preset.LoneTTFT). Requests too large for a replica are
	// left out.
	Ideal Latency `json:"ideal_ttft"`
}

// Result holds one policy's figures. Rates are fractions in 0..1 and times
// are in seconds; a figure with nothing to measure (no admitted request, no
// completion) is 0.
type Result struct {
	// Policy is the policy's name, Policy.Name.
	Policy string `json:"policy"`
	// Requests is the number of requests that arrived, whatever became of
	// them: Requests = Completed + Dropped + Failed + Expired.
	Requests int `json:"requests"`
	// Completed is the number of requests that produced their last token.
	Completed int `json:"completed"`
	// Dropped is the number of requests shed: by the front (Shed), by
	// Config.RateLimit (RateLimited), or because the replica they were
	// routed to had Config.MaxQueue requests waiting.
	Dropped int `json:"dropped"`
	// Shed is the number of the Dropped requests the front shed before
	// they reached a replica: Config.Admission's, a flow-control queue's
	// and Config.Unattainable's reject rule's (ShedReasons).
	Shed int `json:"shed"`
	// ShedReasons counts the Shed requests of a flow-control front by
	// reason: "full: total requests" (or band, bytes: the queue's bound),
	// "displaced" (pushed out by a newcomer), "sheddable"; and, behind
	// any front, those Config.Unattainable's reject rule shed,
	// "slo_unattainable". Config.Admission's sheds are not broken down.
	// Nil when none of these.
	ShedReasons map[string]int `json:"shed_reasons,omitempty"`
	// RateLimited is the number of the Dropped requests Config.RateLimit
	// refused; 0 without.
	RateLimited int `json:"rate_limited,omitempty"`
	// Expired is the number of requests a flow-control queue held until
	// their deadline and then answered undispatched; 0 without.
	Expired int `json:"expired,omitempty"`
	// Late is the number of requests a flow-control queue answered
	// (dispatched or expired) after their deadline: 0 unless the queue's
	// deadlines are broken. GIE's has no deadline.
	Late int `json:"late,omitempty"`
	// QueueTime is the time the dispatched requests spent in a
	// flow-control queue, arrival to dispatch; nil without flow control.
	QueueTime *Latency `json:"queue_time,omitempty"`
	// Tenants has one entry per tenant, by name, when the workload's
	// requests name them (Request.Tenant); nil otherwise.
	Tenants []Group `json:"tenants,omitempty"`
	// Classes has one entry per class, by name, when the workload's
	// requests name them (Request.Class); nil otherwise.
	Classes []Group `json:"classes,omitempty"`
	// Goodput is the requests whose first token came within their SLO
	// (Request.SLO, else Config.SLO),
	// per second of Duration: the work done in time.
	Goodput float64 `json:"goodput"`
	// PeakQueue is the most requests ever waiting at one replica.
	PeakQueue int `json:"peak_queue"`
	// Failed is the number of requests with an empty prompt, too large for
	// one replica's KV cache (prompt plus answer), or that the gateway
	// could not route.
	Failed int `json:"failed"`
	// TokenHitRate is the fraction of the admitted requests' prompt tokens
	// that were found in the serving replica's cache at admission, counting
	// at most all tokens but the last of each prompt (the last is always
	// computed).
	TokenHitRate float64 `json:"token_hit_rate"`
	// RequestHitRate is the fraction of completed requests that found at
	// least one leading prompt block cached at admission.
	RequestHitRate float64 `json:"request_hit_rate"`
	// RouterTokenHitRate is the token hit rate the gateway's index
	// predicted when routing (its matched blocks, counted like
	// TokenHitRate, over the same admitted requests; shed requests are not
	// counted); its gap to TokenHitRate is the index's error. The table
	// calls it "index says".
	RouterTokenHitRate float64 `json:"router_token_hit_rate"`
	// TTFT is the distribution of time to first token, in seconds from
	// arrival, over the requests that got a first token.
	TTFT Latency `json:"ttft"`
	// E2E is the distribution of end-to-end latency, in seconds from
	// arrival to the last token, over the completed requests.
	E2E Latency `json:"e2e"`
	// Throughput is the completed requests' output tokens per second over
	// Duration (a request asking for 0 output tokens counts as 1).
	Throughput float64 `json:"throughput_tok_s"`
	// RequestRate is the completed requests per second over Duration.
	RequestRate float64 `json:"request_rate"`
	// Duration is the simulated time in seconds from the first arrival to
	// the last completion.
	Duration float64 `json:"duration_s"`
	// Imbalance is the largest replica's prefill tokens (computed, not
	// cached) over the mean of PrefillTokens; 1 is perfect balance.
	Imbalance float64 `json:"imbalance"`
	// IdealRatio is TTFT.Mean over Report.Ideal.Mean: how far the policy
	// is from every request alone on a replica holding the pooled cache.
	IdealRatio float64 `json:"ttft_mean_over_ideal"`
	// Share is the spread of work over the replicas.
	Share Share `json:"share"`
	// Index is the index the policy's gateway ran on: "approximate" or
	// "exact"; "own" for a policy matching against an index of its own.
	Index string `json:"index"`
	// SLOAttainment is the fraction of all Requests whose first token came
	// within their SLO (Request.SLO, else Config.SLO) of arrival; dropped,
	// expired and failed requests count as misses.
	SLOAttainment float64 `json:"slo_attainment"`
	// PrefillTokens is the number of prompt tokens each replica computed
	// (not served from cache), one entry per replica in order r0, r1, ….
	PrefillTokens []int64 `json:"prefill_tokens"`
	// RequestsPerReplica is the number of requests each replica admitted
	// to its queue, in the order of PrefillTokens.
	RequestsPerReplica []int64 `json:"requests_per_replica"`
	// BySpeed is the work done by the replicas of each speed profile, in
	// order of first replica, when the replicas' speeds differ
	// (Config.ReplicaSpeeds other than 1, or SpeedChanges); nil, and left
	// out of the JSON, otherwise.
	BySpeed []SpeedShare `json:"by_speed,omitempty"`
	// Decisions counts the gateway's routing decisions, keyed by decision
	// kind name as in gateway.Stats.ByKind. The gateway labels them: for
	// a peer router, affinity means the replica chosen held the longest
	// prefix any replica held, whatever the router's reason.
	Decisions map[string]uint64 `json:"decisions"`
	// Router is the gateway's own Stats at the end of the run; left out
	// of the JSON, which reports its decisions above.
	Router gateway.Stats `json:"-"`
	// LoRA holds the adapter figures when the workload names LoRA
	// adapters; nil otherwise.
	LoRA *LoRAResult `json:"lora,omitempty"`
	// RouterReplicas is the gateway's Replicas() at the end of the run,
	// in replica order (r0, r1, ...), the order of PrefillTokens; left out
	// of the JSON.
	RouterReplicas []gateway.ReplicaStatus `json:"-"`

	ttft  *hist
	front front
}

// Share is the spread of a policy's work over the replicas: the least and
// the most any replica got, as a multiple of the mean (1 is an equal
// share; 0 is a replica left unused). All are 0 when there was no work.
type Share struct {
	// RequestsMin is the fewest requests a replica admitted, over the mean.
	RequestsMin float64 `json:"requests_min"`
	// RequestsMax is the most requests a replica admitted, over the mean.
	RequestsMax float64 `json:"requests_max"`
	// PrefillMin is the fewest prefill tokens a replica computed, over the
	// mean.
	PrefillMin float64 `json:"prefill_min"`
	// PrefillMax is the most prefill tokens a replica computed, over the
	// mean (the same as Imbalance).
	PrefillMax float64 `json:"prefill_max"`
}

// spread returns the least and the largest of xs over their mean.
func spread(xs []int64) (lo, hi float64) {
	var sum, mn, mx int64
	for i, x := range xs {
		sum += x
		if i == 0 || x < mn {
			mn = x
		}
		mx = max(mx, x)
	}
	if sum == 0 {
		return 0, 0
	}
	mean := float64(sum) / float64(len(xs))
	return float64(mn) / mean, float64(mx) / mean
}

// Latency summarises a latency distribution. Every field is in seconds and
// is 0 for an empty distribution. Mean and Max are exact; the quantiles
// are accurate to 1% and never exceed Max.
type Latency struct {
	// Mean is the arithmetic mean, in seconds.
	Mean float64 `json:"mean"`
	// P50 is the median, in seconds.
	P50 float64 `json:"p50"`
	// P90 is the 90th percentile, in seconds.
	P90 float64 `json:"p90"`
	// P99 is the 99th percentile, in seconds.
	P99 float64 `json:"p99"`
	// Max is the largest value, in seconds.
	Max float64 `json:"max"`
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
// the workload and setup, one row per policy, then the ideal row and the
// bounds. "index says" is the token hit rate the policy's index predicted
// (RouterTokenHitRate); "×ideal" is IdealRatio; "req share" and "prefill
// share" are the least and most any replica got over the mean (Share).
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "workload: %s\n", r.Workload)
	gws := ""
	if r.Gateways > 1 {
		gws = fmt.Sprintf("; %d gateways, each routing a random 1/%d of the requests", r.Gateways, r.Gateways)
		switch {
		case r.SharePending && r.PeerRefreshInterval > 0:
			gws += fmt.Sprintf(", sharing their pending prefill every %gs", r.PeerRefreshInterval)
		case r.SharePending:
			gws += ", sharing their pending prefill"
		}
	}
	switch {
	case r.NonStreamed > 0 && r.UpstreamStream:
		gws += fmt.Sprintf("; %.4g%% of clients streaming (the gateway streams the others' answers from the engine and hears every first token)", 100*(1-r.NonStreamed))
	case r.NonStreamed > 0:
		gws += fmt.Sprintf("; %.4g%% of clients streaming (the gateway hears the others' first token at completion)", 100*(1-r.NonStreamed))
	}
	gws += r.speedHeader()
	if r.CacheAtSchedule {
		gws += "; engines cache blocks when their step is scheduled"
	}
	fmt.Fprintf(&b, "cluster:  %d × %s (%s), %d blocks × %d tokens of KV cache each; %s index%s; signals every %gs; TTFT SLO %gs\n",
		r.Replicas, r.Preset.Name, r.Preset.Description, r.CacheBlocks, r.BlockTokens, r.Index, gws, r.RefreshInterval, r.SLO)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\ttok hit\treq hit\tindex says\tTTFT mean\t×ideal\tp50\tp90\tp99\tE2E mean\tp99\ttok/s\timbal\treq share\tprefill share\tSLO\tgood/s\tdone\tdrop\tfail\t")
	for _, x := range r.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.2f\t%s\t%s\t%s\t%s\t%s\t%.0f\t%.2f\t%.2f–%.2f\t%.2f–%.2f\t%s\t%.1f\t%d\t%d\t%d\t\n",
			x.Policy, pct(x.TokenHitRate), pct(x.RequestHitRate), pct(x.RouterTokenHitRate), sec(x.TTFT.Mean), x.IdealRatio, sec(x.TTFT.P50), sec(x.TTFT.P90), sec(x.TTFT.P99),
			sec(x.E2E.Mean), sec(x.E2E.P99), x.Throughput, x.Imbalance, x.Share.RequestsMin, x.Share.RequestsMax, x.Share.PrefillMin, x.Share.PrefillMax,
			pct(x.SLOAttainment), x.Goodput, x.Completed, x.Dropped, x.Failed)
	}
	fmt.Fprintf(tw, "ideal (pooled cache, no queue)\t%s\t%s\t\t%s\t1.00\t%s\t%s\t%s\t\t\t\t\t\t\t\t\t\t\t\t\n",
		pct(r.PooledLRU.TokenHitRate), pct(r.PooledLRU.RequestHitRate), sec(r.Ideal.Mean), sec(r.Ideal.P50), sec(r.Ideal.P90), sec(r.Ideal.P99))
	for _, bd := range []Bound{r.PooledLRU, r.Unbounded} {
		fmt.Fprintf(tw, "%s (bound)\t%s\t%s\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\n", bd.Name, pct(bd.TokenHitRate), pct(bd.RequestHitRate))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.RateLimit.PerSecond > 0 {
		fmt.Fprintf(&b, "rate limit: %g requests/s, burst %d, per tenant at each gateway; refused (in drop):", r.RateLimit.PerSecond, r.RateLimit.Burst)
		for _, x := range r.Results {
			fmt.Fprintf(&b, " %s %d", x.Policy, x.RateLimited)
		}
		b.WriteString("\n")
	}
	r.writeSpeedTable(&b)
	r.writeLoRATable(&b)
	r.writeGroupTables(&b)
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

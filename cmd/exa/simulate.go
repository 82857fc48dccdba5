package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/flow"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/sim"
	"github.com/spf13/cobra"
)

// simFlags holds the flags of "routing simulate".
type simFlags struct {
	replicas             int
	requests             int
	rate                 float64
	workload             string
	sharedPrefixRequests int
	trace                string
	traceSpeed           float64
	seed                 uint64
	policies             []string
	preset               string
	index                string
	gateways             int
	sharePending         bool
	cacheAtSchedule      bool
	streamed             float64
	predictedRelease     bool
	upstreamStream       bool
	sloHeaders           bool
	sloUnattainable      string
	admitQueue           int
	admitKV              float64
	admitOutstanding     int
	admitPending         int
	refresh              time.Duration
	peerRefresh          time.Duration
	asJSON               bool
	plot                 string
	progress             string
	loraAdapters         int
	maxLoras             int
	adapterLoadMS        float64
	tenants              int
	noisy                float64
	only                 string
	flowControl          string
	flowTTL              time.Duration
	flowMaxRequests      int
	flowMaxBytes         int64
	flowFairness         string
	flowOrder            string
	flowUsageLimits      []string
	replicaSpeeds        []float64
	sloClasses           string
	speedChanges         []string
	rateFlags
}

// Bounds of the simulate flags. The simulator's memory grows with the
// blocks the replicas actually cache (each replica's KV table grows with
// use, not with its capacity) and the routers' state, once per policy, and
// its run time with the request count; when the replicas cannot keep up,
// every request waits in memory at once. Measured with all policies (GNU
// time's maximum resident set size, 2 cores, after the KV tables were made
// to grow with use and repeated LoRA reports stopped being copied):
//   - 512 replicas: about 0.5 GB on the default workload with any preset,
//     1.1 GB on --workload lora (it was over 4 GB before those changes);
//   - 100,000 requests: memory stays flat while the replicas keep up, but
//     run time grows (10 to 50 s on 2 cores); when every request queues at
//     once (--rate 100000) they peak at about 1.8 GB, and 512 replicas of
//     70b-h100-tp8 with 100,000 requests at 1.5 GB.
//
// So nothing within the bounds takes more than about 2 GB.
const (
	maxSimReplicas = 512
	maxSimRequests = 100_000
)

// The two policies whose hit rates the spec's lines compare: the built-in
// modes, which the simulator names as the gateway does.
var (
	cacheAwarePolicy = gateway.ModeCacheAware.String()
	roundRobinPolicy = gateway.ModeRoundRobin.String()
)

func newSimulateCmd() *cobra.Command {
	var sf simFlags
	cmd := &cobra.Command{
		Use:   "simulate [MODEL] [flags]",
		Short: "Compare routing policies in simulation (runs the default workload with no other input)",
		Long: `Simulate a cluster of model-server replicas serving a workload, routed by the
real gateway under each policy, and compare them.

With no flags it runs the embedded default workload: 20,000 requests over 256
shared 4,096-token system prompts that do not all fit in every replica's cache,
the situation in which routing matters, on 8 simulated replicas. The output
states the workload in one line, then the cache-aware and round-robin hit
rates (the share of prompt tokens the simulated engines served from their
prefix caches), then the simulator's full table: hit rates, time to first
token, balance, SLO attainment, and the pooled-LRU and unbounded-cache bounds.

Given a MODEL, the model's stored configuration applies (its replica count
unless --replicas is given, its latency SLO as the router's SLO, its load
weights) and the result under the model's mode is saved for
"exa serve routing stats MODEL". Same flags, same output: the run is
deterministic for a seed.`,
		Example: `  # The main job: the default workload, all policies:
  exa serve routing simulate JPCP
  # A shared-prefix stream on 4 replicas, cache-aware vs round-robin:
  exa serve routing simulate JPCP --replicas 4 --shared-prefix-requests 100
  # Replay a Mooncake trace, two policies, with a plot:
  exa serve routing simulate JPCP --trace mooncake_trace.jsonl --policies cache_aware,round_robin --plot ttft.svg
  # LoRA adapters: 16 adapters (Zipf popularity), 2 adapter slots per replica, 30 ms per load:
  exa serve routing simulate --workload lora --lora-adapters 16 --max-loras 2 --adapter-load-ms 30
  # Flow control at 3x capacity: a noisy tenant at 5x the quiet one's rate, held instead of shed, beside GIE's flow controller:
  exa serve routing simulate --workload noisy-neighbour --rate 324 --requests 9720 --flow-control on --admission-queue-depth 1 --admission-outstanding 128 --policies cache_aware,gie_flow
  # The quiet tenant's run alone:
  exa serve routing simulate --workload noisy-neighbour --rate 324 --requests 9720 --only quiet1 --policies cache_aware
  # Machine-readable:
  exa serve routing simulate JPCP --workload chat --requests 2000 --json`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return nil
			}
			return modelArg(cmd, args)
		},
		ValidArgsFunction: completeModels,
		RunE: func(cmd *cobra.Command, args []string) error {
			model := ""
			if len(args) == 1 {
				model = args[0]
			}
			return runSimulate(cmd, model, &sf)
		},
	}
	f := cmd.Flags()
	f.IntVar(&sf.replicas, "replicas", 0, fmt.Sprintf("number of simulated replicas, 1..%d; 512 take about 0.5 GB of memory on the default workload, 1.1 GB on --workload lora (default: the model's stored replica count, else %d)", maxSimReplicas, sim.DefaultReplicas))
	f.IntVar(&sf.requests, "requests", 0, fmt.Sprintf("number of requests, 1..%d; 100,000 take 10-50 s with all policies, and up to 1.8 GB of memory when the replicas cannot keep up (default: the workload's own; for a trace, replay only the first N)", maxSimRequests))
	f.Float64Var(&sf.rate, "rate", 0, "Poisson arrival rate in requests per second (default: the workload's own; for a trace, replaces its timestamps)")
	f.StringVar(&sf.workload, "workload", "default", "generated workload: "+strings.Join(sim.WorkloadNames(), ", ")+"; multi-tenant: "+strings.Join(sim.FlowWorkloadNames(), ", ")+" (see docs/flow-control.md)")
	f.IntVar(&sf.sharedPrefixRequests, "shared-prefix-requests", 0, fmt.Sprintf("simulate a shared-prefix stream of N requests, 1..%d (the shared-prefix workload with its request count set)", maxSimRequests))
	f.StringVar(&sf.trace, "trace", "", "replay a Mooncake-format JSONL trace file instead of a generated workload")
	f.Float64Var(&sf.traceSpeed, "trace-speed", 1, "replay the trace this many times faster than recorded")
	f.Uint64Var(&sf.seed, "seed", 1, "random seed of the workload and the randomised policies")
	f.StringSliceVar(&sf.policies, "policies", nil, "policies to compare, comma-separated (default all: "+strings.Join(policyNames(), ",")+"; also accepted: "+strings.Join(policyNamesAccepted()[len(policyNames()):], ",")+"); cache_aware and round_robin are always included")
	f.StringVar(&sf.preset, "preset", sim.DefaultPresetName, "replica cost model: "+strings.Join(sim.PresetNames(), ", "))
	f.StringVar(&sf.index, "index", "approximate", "router cache index: approximate (learned from routing) or exact (fed by the engines' cache events)")
	f.IntVar(&sf.gateways, "gateways", 1, fmt.Sprintf("number of gateway replicas sharing the traffic at random, 1..%d, each with its own index and in-flight counts (with --index exact, each fed every engine's cache events)", sim.MaxGateways))
	f.DurationVar(&sf.refresh, "refresh-interval", sim.DefaultRefreshInterval, "how often the engines' load (and, with --share-pending, the gateways' pending prefill) reaches the gateways, as the HTTP gateway's --scrape-interval; 1ms..1m")
	f.BoolVar(&sf.sharePending, "share-pending", false, "with --gateways 2 or more, the gateways share their pending prefill at every load refresh, as gateways configured with each other as peers do (see docs/multi-gateway.md)")
	f.DurationVar(&sf.peerRefresh, "peer-refresh-interval", 0, "with --share-pending, share the pending prefill on a clock of its own, as the HTTP gateway's --peer-scrape-interval; 0 = at every load refresh; else 1ms..1m")
	f.Float64Var(&sf.streamed, "streamed", 1, "share of requests whose client streams, 0..1; for the others the gateway learns the first token only at completion, as the HTTP gateway does from a non-streamed answer's first byte (peers keep their own signals)")
	f.BoolVar(&sf.upstreamStream, "upstream-stream", true, "with --streamed below 1: the gateway's fronts ask the engine to stream a non-streamed request and assemble the answer (both fronts' default), so the gateway hears every first token; false models fronts forwarding such requests unchanged, which hear the first token at completion")
	f.BoolVar(&sf.sloHeaders, "slo-headers", true, "requests carrying their class's objectives (--workload slo-classes, interactive-batch, --slo-classes) send them as x-slo-ttft-ms and x-slo-tpot-ms, which cache_aware and llmd_predicted route by; false only counts them in the report")
	f.StringVar(&sf.sloUnattainable, "slo-unattainable", "best-effort", "what the gateway's fronts do with a request whose objective (--slo-headers) no replica is predicted to meet, as exa serve gateway/picker --slo-unattainable: best-effort or reject (shed, as a 429)")
	f.BoolVar(&sf.predictedRelease, "predicted-release", true, "with --streamed below 1 and --upstream-stream=false: the gateway releases a non-streamed request's pending prefill when its prefill is predicted over (Decision.PredictedTTFT) rather than at completion")
	f.BoolVar(&sf.cacheAtSchedule, "cache-at-schedule", false, "the simulated engines cache a prefill's blocks when the step computing them is scheduled, as vLLM v1 does, so that a request admitted later, even in the same step (a burst of one cold prompt), finds them; they stay pinned until their request completes, and the gateways hear of them at the step's end. Default false: cached when that step ends, as every figure in the docs but docs/results.md's \"Engine fidelity\" was measured")
	f.IntVar(&sf.admitQueue, "admission-queue-depth", 0, "admission control for the gateway's own policies (peers run without): shed a request while every replica has this many requests waiting or more (GIE's saturation detector uses 5); 0: off")
	f.Float64Var(&sf.admitKV, "admission-kv", 0, "admission control: shed while every replica's KV cache is this full or more, 0..1 (GIE: 0.8); 0: off")
	f.IntVar(&sf.admitOutstanding, "admission-outstanding", 0, "admission control: shed while every replica has this many requests outstanding or more; 0: off")
	f.IntVar(&sf.admitPending, "admission-pending-prefill", 0, "admission control: shed while every replica has this many blocks of prefill pending (routed, first token not yet seen) or more; 0: off")
	f.BoolVar(&sf.asJSON, "json", false, "print the results as JSON instead of text")
	f.StringVar(&sf.plot, "plot", "", "write an SVG plot (TTFT CDF and hit rate per policy) to this file; its directory must exist")
	f.StringVar(&sf.progress, "progress", "auto", "progress bar on stderr: auto (only when stderr is a terminal), always or never")
	f.IntVar(&sf.loraAdapters, "lora-adapters", 8, fmt.Sprintf("--workload lora: number of LoRA adapters the requests name, by Zipf popularity, 1..%d", sim.MaxAdapters))
	f.IntVar(&sf.maxLoras, "max-loras", sim.DefaultMaxLoras, fmt.Sprintf("--workload lora: adapter slots per replica (vLLM --max-loras), 1..%d", gateway.MaxAdapterSlots))
	f.Float64Var(&sf.adapterLoadMS, "adapter-load-ms", float64(sim.DefaultAdapterLoad/time.Millisecond),
		"--workload lora: milliseconds a replica's step takes longer per adapter it loads into a slot, 0..3600000 (0: no cost)")
	f.IntVar(&sf.tenants, "tenants", 2, fmt.Sprintf("--workload noisy-neighbour: number of tenants (fairness ids), 1..%d", sim.MaxGroups))
	f.Float64Var(&sf.noisy, "noisy", 5, "--workload noisy-neighbour: how many times more requests the first tenant (\"noisy\") sends than each other (\"quiet1\", ...); 1: all alike (\"t0\", ...)")
	f.StringVar(&sf.only, "only", "", "--workload noisy-neighbour or interactive-batch: keep only this tenant's or class's requests, at their arrivals in the full workload (its run alone)")
	f.StringVar(&sf.flowControl, "flow-control", "off", "on: the gateway's own policies hold a request past the admission rule's saturation in a flow-control queue (by priority and tenant) instead of shedding it, and route it when a replica has room; needs an --admission-* threshold (see docs/flow-control.md)")
	f.DurationVar(&sf.flowTTL, "flow-ttl", flow.DefaultTTL, "--flow-control on: how long a request may be held before it is answered as expired; 1ms..1h")
	f.IntVar(&sf.flowMaxRequests, "flow-max-requests", flow.DefaultMaxRequests, "--flow-control on: most requests held per gateway (and per priority band), 1..1000000; past it the newest of the longest flow is displaced or the newcomer shed")
	f.Int64Var(&sf.flowMaxBytes, "flow-max-bytes", flow.DefaultMaxBytes, fmt.Sprintf("--flow-control on: most bytes held per gateway (and per band), %d per prompt token, 1..2^40", sim.BytesPerToken))
	f.StringVar(&sf.flowFairness, "flow-fairness", "round-robin", "--flow-control on: how tenants of a band share it: round-robin or global-strict (oldest head first, GIE's default)")
	f.Float64SliceVar(&sf.replicaSpeeds, "replica-speeds", nil, fmt.Sprintf("mixed pool: compute speeds as multiples of the preset's, comma-separated, cycled over the replicas (1,0.5: every other replica takes twice as long for every step), each %g..%g, at most one per replica (default: all 1)", sim.MinSpeed, sim.MaxSpeed))
	f.StringVar(&sf.sloClasses, "slo-classes", "", "per-request objectives: give the workload's requests classes with TTFT and TPOT objectives, NAME:ttft=D,tpot=D,share=W,priority=P;NAME:..., as \"interactive:ttft=500ms,tpot=50ms;batch:ttft=10s,tpot=250ms,share=2\" (share default 1, priority 0; at most 64 classes); the report adds per-class TTFT, TPOT and both attainment and goodput. --workload slo-classes has three by default (see docs/results.md)")
	f.StringSliceVar(&sf.speedChanges, "speed-change", nil, "a replica changes speed during the run: REPLICA@AT=SPEED, as 0@30s=0.5 (r0 at half the preset's speed from 30 s after the first arrival; its step in progress keeps its end); repeatable or comma-separated")
	f.StringVar(&sf.flowOrder, "flow-order", "fcfs", "--flow-control on: order within a tenant: fcfs or edf (earliest deadline first)")
	f.StringArrayVar(&sf.flowUsageLimits, "flow-usage-limit", nil, "--flow-control on: PRIORITY=FRACTION, a band's usage limit (GIE's UsageLimitPolicy), 0 < FRACTION <= 1: its requests have room only under the --admission-* thresholds scaled by it; repeatable; unlisted priorities have 1")
	sf.registerRate(f, "each tenant's request rate at each gateway, in front of every policy, as exa serve gateway --rate-limit keyed by the tenant's header: requests/s, past it refused (counted in drop); 0 = no limit",
		"--rate-limit's burst: requests a tenant idle long enough may send at once (0 = the rate rounded up)", "")
	_ = cmd.RegisterFlagCompletionFunc("workload", cobra.FixedCompletions(append(sim.WorkloadNames(), sim.FlowWorkloadNames()...), cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("flow-control", cobra.FixedCompletions([]string{"off", "on"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("flow-fairness", cobra.FixedCompletions([]string{"round-robin", "global-strict"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("flow-order", cobra.FixedCompletions([]string{"fcfs", "edf"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("policies", cobra.FixedCompletions(policyNamesAccepted(), cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("preset", cobra.FixedCompletions(sim.PresetNames(), cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("index", cobra.FixedCompletions([]string{"approximate", "exact"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("progress", cobra.FixedCompletions([]string{"auto", "always", "never"}, cobra.ShellCompDirectiveNoFileComp))
	for _, name := range []string{"lora-adapters", "max-loras", "adapter-load-ms"} {
		_ = cmd.RegisterFlagCompletionFunc(name, cobra.NoFileCompletions)
	}
	_ = cmd.MarkFlagFilename("trace", "jsonl", "json")
	_ = cmd.MarkFlagFilename("plot", "svg")
	return cmd
}

// policyNamesAccepted returns the names --policies accepts (those
// sim.PolicyByName knows): the default set, gie_lora, gie_flow and
// llm-d's predicted-latency policies.
func policyNamesAccepted() []string {
	var names []string
	for _, p := range append(append(sim.LoRAPolicies(), sim.GIEFlowPolicy()), sim.LLMDPredictedPolicies()...) {
		names = append(names, p.Name)
	}
	return names
}

func policyNames() []string {
	var names []string
	for _, p := range sim.DefaultPolicies() {
		names = append(names, p.Name)
	}
	return names
}

// simOutput is the --json form of simulate.
type simOutput struct {
	Model string `json:"model,omitempty"`
	// Workload is the one-line description printed first.
	Workload string `json:"workload"`
	// CacheAwareHitRate and RoundRobinHitRate are the token hit rates of
	// the two policies the spec compares.
	CacheAwareHitRate float64     `json:"cache_aware_hit_rate"`
	RoundRobinHitRate float64     `json:"round_robin_hit_rate"`
	Report            *sim.Report `json:"report"`
}

// buildSimConfig turns flags and the model's stored configuration into a
// sim.Config. It returns the policy (if any) whose run is recorded for the
// model's statistics.
func buildSimConfig(cmd *cobra.Command, sf *simFlags, model string, m config.Model) (sim.Config, error) {
	changed := cmd.Flags().Changed
	var cfg sim.Config
	cfg.Seed = sf.seed
	if err := exclusive(cmd, [][2]string{
		{"trace", "workload"}, {"trace", "shared-prefix-requests"},
		{"workload", "shared-prefix-requests"}, {"requests", "shared-prefix-requests"},
	}); err != nil {
		return cfg, err
	}

	cfg.Replicas = sim.DefaultReplicas
	if changed("replicas") {
		if sf.replicas < 1 || sf.replicas > maxSimReplicas {
			return cfg, usagef("invalid --replicas %d: want 1..%d (the limit keeps the simulation's memory within about 2 GB)", sf.replicas, maxSimReplicas)
		}
		cfg.Replicas = sf.replicas
	} else if n := len(m.Replicas); n > maxSimReplicas {
		return cfg, usagef("model %q has %d replicas, more than the %d simulate takes; pass --replicas N (1..%d)", model, n, maxSimReplicas, maxSimReplicas)
	} else if n > 0 {
		cfg.Replicas = n
	}
	for _, fl := range []struct {
		name string
		v    int
	}{{"requests", sf.requests}, {"shared-prefix-requests", sf.sharedPrefixRequests}} {
		if changed(fl.name) && (fl.v < 1 || fl.v > maxSimRequests) {
			return cfg, usagef("invalid --%s %d: want 1..%d (the limit bounds the simulation's run time and memory)", fl.name, fl.v, maxSimRequests)
		}
	}
	if !(sf.rate >= 0 && sf.rate <= math.MaxFloat64) { // NaN and +Inf too
		return cfg, usagef("invalid --rate %v: want a finite rate >= 0 requests per second", sf.rate)
	}
	lora := sf.trace == "" && !changed("shared-prefix-requests") && sf.workload == "lora"
	if err := loraSimFlags(cmd, sf, lora, &cfg); err != nil {
		return cfg, err
	}

	var err error
	switch {
	case sf.trace != "":
		if !(sf.traceSpeed > 0 && sf.traceSpeed <= math.MaxFloat64) { // NaN and +Inf too
			return cfg, usagef("invalid --trace-speed %v: want a finite positive factor", sf.traceSpeed)
		}
		cfg.Workload, err = sim.TraceFile(sf.trace, sim.TraceOptions{Speed: sf.traceSpeed, Rate: sf.rate, Limit: sf.requests})
		if err != nil {
			return cfg, usagef("invalid --trace %q: %s", sf.trace, strings.TrimPrefix(err.Error(), sim.ErrInvalidConfig.Error()+": "))
		}
	case changed("shared-prefix-requests"):
		cfg.Workload, err = sim.NewWorkload("shared-prefix", sf.sharedPrefixRequests, sf.rate)
	case lora:
		cfg.Workload, err = sim.LoRAWorkload(sim.LoRAConfig{Requests: sf.requests, Rate: sf.rate, Adapters: sf.loraAdapters})
	case sf.workload == "noisy-neighbour":
		if sf.tenants < 1 || sf.tenants > sim.MaxGroups {
			return cfg, usagef("invalid --tenants %d: want 1..%d", sf.tenants, sim.MaxGroups)
		}
		if !(sf.noisy > 0 && sf.noisy <= 1000) {
			return cfg, usagef("invalid --noisy %v: want a factor in (0, 1000]", sf.noisy)
		}
		cfg.Workload, err = sim.NoisyNeighbour(sf.requests, sf.rate, sf.tenants, sf.noisy, sf.only)
	case sf.workload == "interactive-batch":
		cfg.Workload, err = sim.InteractiveBatch(sf.requests, sf.rate, sf.only)
	case sf.workload == "slo-classes":
		var classes []sim.Class // nil: the defaults
		if sf.sloClasses != "" {
			if classes, err = parseSLOClasses(sf.sloClasses); err != nil {
				return cfg, err
			}
		}
		cfg.Workload, err = sim.SLOClasses(sf.requests, sf.rate, classes)
	default:
		if !slices.Contains(sim.WorkloadNames(), sf.workload) {
			return cfg, usagef("invalid --workload %q: want one of %s", sf.workload, strings.Join(append(sim.WorkloadNames(), sim.FlowWorkloadNames()...), ", "))
		}
		cfg.Workload, err = sim.NewWorkload(sf.workload, sf.requests, sf.rate)
	}
	if err == nil && sf.sloClasses != "" && (sf.trace != "" || changed("shared-prefix-requests") || sf.workload != "slo-classes") {
		if sf.trace == "" && !changed("shared-prefix-requests") && (sf.workload == "noisy-neighbour" || sf.workload == "interactive-batch") {
			return cfg, usagef("--slo-classes does not apply to --workload %s, which has its own tenants and classes", sf.workload)
		}
		classes, perr := parseSLOClasses(sf.sloClasses)
		if perr != nil {
			return cfg, perr
		}
		cfg.Workload, err = sim.Tenants(sim.TenantsConfig{Base: cfg.Workload, Classes: classes})
	}
	if err != nil {
		return cfg, &usageError{err}
	}
	if err := tenantFlags(cmd, sf); err != nil {
		return cfg, err
	}

	cfg.Preset, err = sim.PresetByName(sf.preset)
	if err != nil {
		return cfg, usagef("invalid --preset %q: want one of %s", sf.preset, strings.Join(sim.PresetNames(), ", "))
	}
	switch sf.index {
	case "approximate":
		cfg.Index = sim.IndexApproximate
	case "exact":
		cfg.Index = sim.IndexExact
	default:
		return cfg, usagef("invalid --index %q: want approximate or exact", sf.index)
	}

	if sf.gateways < 1 || sf.gateways > sim.MaxGateways {
		return cfg, usagef("invalid --gateways %d: want 1..%d", sf.gateways, sim.MaxGateways)
	}
	cfg.Gateways = sf.gateways
	if sf.sharePending && sf.gateways < 2 {
		return cfg, usagef("invalid --share-pending with --gateways %d: sharing needs at least 2 gateways", sf.gateways)
	}
	cfg.SharePending = sf.sharePending
	switch {
	case sf.peerRefresh != 0 && !sf.sharePending:
		return cfg, usagef("invalid --peer-refresh-interval %v without --share-pending", sf.peerRefresh)
	case sf.peerRefresh != 0 && (sf.peerRefresh < time.Millisecond || sf.peerRefresh > time.Minute):
		return cfg, usagef("invalid --peer-refresh-interval %v: want 0 or 1ms..1m", sf.peerRefresh)
	}
	cfg.PeerRefreshInterval = sf.peerRefresh
	if sf.refresh < time.Millisecond || sf.refresh > time.Minute {
		return cfg, usagef("invalid --refresh-interval %v: want 1ms..1m", sf.refresh)
	}
	cfg.RefreshInterval = sf.refresh
	if !(sf.streamed >= 0 && sf.streamed <= 1) {
		return cfg, usagef("invalid --streamed %v: want a share 0..1 of streaming clients", sf.streamed)
	}
	cfg.NonStreamed = 1 - sf.streamed
	cfg.PredictedRelease = sf.predictedRelease
	cfg.CacheAtSchedule = sf.cacheAtSchedule
	cfg.UpstreamStream = sf.upstreamStream
	cfg.ObjectiveHeaders = sf.sloHeaders
	u, err := front.ParseUnattainable(sf.sloUnattainable)
	if err != nil {
		return cfg, usagef("invalid --slo-unattainable %q: want best-effort or reject", sf.sloUnattainable)
	}
	cfg.Unattainable = u
	switch {
	case sf.admitQueue < 0:
		return cfg, usagef("invalid --admission-queue-depth %d: want 0 (off) or more", sf.admitQueue)
	case !(sf.admitKV >= 0 && sf.admitKV <= 1):
		return cfg, usagef("invalid --admission-kv %v: want 0..1 (0: off)", sf.admitKV)
	case sf.admitOutstanding < 0:
		return cfg, usagef("invalid --admission-outstanding %d: want 0 (off) or more", sf.admitOutstanding)
	case sf.admitPending < 0:
		return cfg, usagef("invalid --admission-pending-prefill %d: want 0 (off) or more", sf.admitPending)
	}
	cfg.Admission = gateway.Admission{QueueDepth: sf.admitQueue, KVUtilization: sf.admitKV, Outstanding: sf.admitOutstanding, PendingPrefill: sf.admitPending}
	rate, err := sf.rateLimitOptions(cmd)
	if err != nil {
		return cfg, err
	}
	cfg.RateLimit = rate
	if err := flowSimFlags(cmd, sf, &cfg); err != nil {
		return cfg, err
	}
	if err := speedSimFlags(sf, &cfg); err != nil {
		return cfg, err
	}

	names := []string{roundRobinPolicy, cacheAwarePolicy}
	if changed("policies") {
		names = names[:0]
		for _, p := range sf.policies {
			p = strings.TrimSpace(p)
			pol, err := sim.PolicyByName(p)
			if err != nil {
				return cfg, usagef("invalid --policies %q: want names from %s", p, strings.Join(policyNamesAccepted(), ", "))
			}
			if !slices.Contains(names, pol.Name) {
				names = append(names, pol.Name)
			}
		}
		for _, must := range []string{cacheAwarePolicy, roundRobinPolicy} {
			if !slices.Contains(names, must) {
				names = append([]string{must}, names...)
			}
		}
	} else if lora {
		for _, p := range sim.LoRAPolicies() {
			names = append(names[:0:0], names...)
			if !slices.Contains(names, p.Name) {
				names = append(names, p.Name)
			}
		}
	} else {
		names = policyNames()
	}

	// The model's own mode is the one recorded for its statistics, so it
	// is always simulated; its load weights apply to the load-aware policy.
	if model != "" && !slices.Contains(names, m.Mode.String()) {
		names = append(names, m.Mode.String())
	}
	for _, n := range names {
		pol, _ := sim.PolicyByName(n)
		if n == gateway.ModeLoadAware.String() && m.LoadWeights != nil {
			w := m.LoadWeights.Gateway()
			pol.New = func(uint64) gateway.Policy { return &gateway.LoadAware{Weights: w} }
		}
		cfg.Policies = append(cfg.Policies, pol)
	}
	if m.SLOLatencyMS > 0 {
		cfg.RouterSLO = m.SLOLatency()
	}
	return cfg, nil
}

// loraSimFlags checks the LoRA flags, which only --workload lora takes,
// and sets the adapter model of cfg.
func loraSimFlags(cmd *cobra.Command, sf *simFlags, lora bool, cfg *sim.Config) error {
	changed := cmd.Flags().Changed
	for _, name := range []string{"lora-adapters", "max-loras", "adapter-load-ms"} {
		if changed(name) && !lora {
			return usagef("--%s applies to --workload lora only", name)
		}
	}
	if !lora {
		return nil
	}
	if sf.loraAdapters < 1 || sf.loraAdapters > sim.MaxAdapters {
		return usagef("invalid --lora-adapters %d: want 1..%d", sf.loraAdapters, sim.MaxAdapters)
	}
	if sf.maxLoras < 1 || sf.maxLoras > gateway.MaxAdapterSlots {
		return usagef("invalid --max-loras %d: want 1..%d", sf.maxLoras, gateway.MaxAdapterSlots)
	}
	if !(sf.adapterLoadMS >= 0 && sf.adapterLoadMS <= 3_600_000) {
		return usagef("invalid --adapter-load-ms %v: want 0..3600000 milliseconds", sf.adapterLoadMS)
	}
	cfg.MaxLoras = sf.maxLoras
	cfg.AdapterLoad = time.Duration(sf.adapterLoadMS * float64(time.Millisecond))
	if cfg.AdapterLoad == 0 {
		cfg.AdapterLoad = -1 // no cost (0 is the simulator's default)
	}
	return nil
}

// tenantFlags checks that the multi-tenant flags go with their workloads.
func tenantFlags(cmd *cobra.Command, sf *simFlags) error {
	changed := cmd.Flags().Changed
	nn := sf.trace == "" && !changed("shared-prefix-requests") && sf.workload == "noisy-neighbour"
	ib := sf.trace == "" && !changed("shared-prefix-requests") && sf.workload == "interactive-batch"
	for _, name := range []string{"tenants", "noisy"} {
		if changed(name) && !nn {
			return usagef("--%s applies to --workload noisy-neighbour only", name)
		}
	}
	if changed("only") && !nn && !ib {
		return usagef("--only applies to --workload noisy-neighbour or interactive-batch only")
	}
	return nil
}

// parseSLOClasses reads --slo-classes.
func parseSLOClasses(spec string) ([]sim.Class, error) {
	classes, err := sim.ParseClasses(spec)
	if err != nil {
		return nil, usagef("invalid --slo-classes %q: %s", spec, strings.TrimPrefix(err.Error(), sim.ErrInvalidConfig.Error()+": "))
	}
	return classes, nil
}

// speedSimFlags checks --replica-speeds and --speed-change against the
// replica count and sets cfg's speeds.
func speedSimFlags(sf *simFlags, cfg *sim.Config) error {
	if len(sf.replicaSpeeds) > cfg.Replicas {
		return usagef("invalid --replica-speeds: %d speeds for %d replicas, want at most one per replica", len(sf.replicaSpeeds), cfg.Replicas)
	}
	for _, v := range sf.replicaSpeeds {
		if !(v >= sim.MinSpeed && v <= sim.MaxSpeed) {
			return usagef("invalid --replica-speeds %v: want multipliers %g..%g", v, sim.MinSpeed, sim.MaxSpeed)
		}
	}
	cfg.ReplicaSpeeds = sf.replicaSpeeds
	if len(sf.speedChanges) > sim.MaxSpeedChanges {
		return usagef("invalid --speed-change: %d changes, at most %d", len(sf.speedChanges), sim.MaxSpeedChanges)
	}
	for _, s := range sf.speedChanges {
		c, err := sim.ParseSpeedChange(s)
		if err == nil && c.Replica >= cfg.Replicas {
			err = fmt.Errorf("replica %d, want 0..%d", c.Replica, cfg.Replicas-1)
		}
		if err != nil {
			return usagef("invalid --speed-change %q: %s", s, strings.TrimPrefix(err.Error(), sim.ErrInvalidConfig.Error()+": "))
		}
		cfg.SpeedChanges = append(cfg.SpeedChanges, c)
	}
	return nil
}

// flowSimFlags checks the flow-control flags and sets cfg.FlowControl.
func flowSimFlags(cmd *cobra.Command, sf *simFlags, cfg *sim.Config) error {
	changed := cmd.Flags().Changed
	switch sf.flowControl {
	case "off":
		for _, name := range []string{"flow-ttl", "flow-max-requests", "flow-max-bytes", "flow-fairness", "flow-order", "flow-usage-limit"} {
			if changed(name) {
				return usagef("--%s applies to --flow-control on only", name)
			}
		}
		return nil
	case "on":
	default:
		return usagef("invalid --flow-control %q: want on or off", sf.flowControl)
	}
	if cfg.Admission == (gateway.Admission{}) {
		return usagef("--flow-control on needs an admission threshold to say when a replica has room: --admission-outstanding N (held requests go as requests finish), --admission-pending-prefill, --admission-queue-depth or --admission-kv")
	}
	q := &cfg.FlowControl.Queue
	switch {
	case sf.flowTTL < time.Millisecond || sf.flowTTL > time.Hour:
		return usagef("invalid --flow-ttl %v: want 1ms..1h", sf.flowTTL)
	case sf.flowMaxRequests < 1 || sf.flowMaxRequests > 1_000_000:
		return usagef("invalid --flow-max-requests %d: want 1..1000000", sf.flowMaxRequests)
	case sf.flowMaxBytes < 1 || sf.flowMaxBytes > 1<<40:
		return usagef("invalid --flow-max-bytes %d: want 1..%d", sf.flowMaxBytes, int64(1)<<40)
	}
	switch sf.flowFairness {
	case "round-robin":
		q.Fairness = flow.RoundRobin
	case "global-strict":
		q.Fairness = flow.GlobalStrict
	default:
		return usagef("invalid --flow-fairness %q: want round-robin or global-strict", sf.flowFairness)
	}
	switch sf.flowOrder {
	case "fcfs":
		q.Order = flow.FCFS
	case "edf":
		q.Order = flow.EDF
	default:
		return usagef("invalid --flow-order %q: want fcfs or edf", sf.flowOrder)
	}
	limits, err := usageLimits(sf.flowUsageLimits)
	if err != nil {
		return err
	}
	cfg.FlowControl.UsageLimits = limits
	cfg.FlowControl.Enabled = true
	q.TTL = sf.flowTTL
	q.Total = flow.Limits{MaxBytes: sf.flowMaxBytes, MaxRequests: sf.flowMaxRequests}
	return nil
}

func runSimulate(cmd *cobra.Command, model string, sf *simFlags) error {
	var (
		path string
		m    config.Model
	)
	if model != "" {
		var f *config.File
		var err error
		path, f, err = loadConfig()
		if err != nil {
			return err
		}
		m = f.Models[model]
	}
	switch sf.progress {
	case "auto", "always", "never":
	default:
		return usagef("invalid --progress %q: want auto, always or never", sf.progress)
	}
	cfg, err := buildSimConfig(cmd, sf, model, m)
	if err != nil {
		return err
	}
	if cmd.Flags().Changed("plot") {
		if err := checkPlotPath(sf.plot); err != nil {
			return err
		}
	}
	stderr := cmd.ErrOrStderr()
	if sf.progress == "always" || (sf.progress == "auto" && isTerminal(stderr)) {
		bar := &progressBar{w: stderr}
		cfg.Progress = bar.update
		defer bar.finish()
	}
	rep, err := sim.Run(cfg)
	if err != nil {
		if errors.Is(err, sim.ErrInvalidConfig) || errors.Is(err, sim.ErrMalformedTrace) {
			return &usageError{err}
		}
		return err
	}
	ca, _ := rep.Result(cacheAwarePolicy)
	rr, _ := rep.Result(roundRobinPolicy)

	line := workloadLine(rep, model, m)
	if sf.plot != "" {
		var buf bytes.Buffer
		if err := rep.WriteSVG(&buf); err != nil {
			return fmt.Errorf("plot: %w", err)
		}
		if err := config.WriteFileAtomic(sf.plot, buf.Bytes()); err != nil {
			return fmt.Errorf("plot: %w", err)
		}
	}
	if model != "" {
		if err := saveSimStats(path, model, m.Mode, line, rep); err != nil {
			return err
		}
	}

	out := cmd.OutOrStdout()
	if sf.asJSON {
		return writeJSON(out, simOutput{Model: model, Workload: line, CacheAwareHitRate: ca.TokenHitRate, RoundRobinHitRate: rr.TokenHitRate, Report: rep})
	}
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		return err
	}
	fmt.Fprintf(out, "workload: %s\n", line)
	fmt.Fprintf(out, "cache-aware hit rate: %.1f%%\n", 100*ca.TokenHitRate)
	fmt.Fprintf(out, "round-robin hit rate: %.1f%%\n", 100*rr.TokenHitRate)
	fmt.Fprintln(out)
	// The table opens with its own workload line, already printed above.
	body := table.String()
	if first, rest, ok := strings.Cut(body, "\n"); ok && strings.HasPrefix(first, "workload:") {
		body = rest
	}
	_, err = io.WriteString(out, body)
	if err == nil && sf.plot != "" {
		fmt.Fprintf(out, "plot written to %s\n", sf.plot)
	}
	return err
}

// checkPlotPath rejects a --plot path that cannot take the plot before the
// simulation runs: empty, a directory, or in a directory that does not
// exist (exa creates no directories for the plot: a typo in a path would
// otherwise leave a tree of them behind).
func checkPlotPath(p string) error {
	if p == "" {
		return usagef("invalid --plot %q: want a file name such as ttft.svg", p)
	}
	if st, err := os.Stat(p); (err == nil && st.IsDir()) || strings.HasSuffix(p, string(filepath.Separator)) {
		return usagef("invalid --plot %q: is a directory; want a file name such as %s", p, filepath.Join(p, "ttft.svg"))
	}
	dir := filepath.Dir(p)
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return usagef("invalid --plot %q: directory %q does not exist (create it first)", p, dir)
	case err != nil:
		return usagef("invalid --plot %q: %v", p, err)
	case !st.IsDir():
		return usagef("invalid --plot %q: %q is not a directory", p, dir)
	}
	return nil
}

// workloadLine states the workload and setup in one line.
func workloadLine(rep *sim.Report, model string, m config.Model) string {
	s := fmt.Sprintf("%s; %d replicas of %s; seed %d", rep.Workload, rep.Replicas, rep.Preset.Name, rep.Seed)
	if rep.Gateways > 1 {
		s += fmt.Sprintf("; %d gateways", rep.Gateways)
		if rep.SharePending {
			s += " sharing pending prefill"
			if rep.PeerRefreshInterval > 0 {
				s += fmt.Sprintf(" every %gs", rep.PeerRefreshInterval)
			}
		}
	}
	if model != "" && m.SLOLatencyMS > 0 {
		s += fmt.Sprintf("; router SLO %s from %s's configuration", m.SLOLatency(), model)
	}
	return s
}

// saveSimStats stores the gateway statistics of the model's own policy in
// the simulation as the model's latest statistics.
func saveSimStats(path, model string, mode gateway.Mode, line string, rep *sim.Report) error {
	res, ok := rep.Result(mode.String())
	if !ok {
		return nil
	}
	raw, err := json.Marshal(rep)
	if err != nil {
		return fmt.Errorf("encode simulation: %w", err)
	}
	st := config.StatsFromGateway(model, config.SourceSimulated, mode, res.Router, res.RouterReplicas)
	st.Workload, st.TokenHitRate, st.Simulation = line, res.TokenHitRate, raw
	prefill := map[string]int64{}
	for i, r := range res.RouterReplicas {
		if i < len(res.PrefillTokens) {
			prefill[r.Name] = res.PrefillTokens[i]
		}
	}
	for i := range st.Replicas {
		st.Replicas[i].PrefillTokens = prefill[st.Replicas[i].Name]
	}
	return config.SaveStats(path, st)
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progressBar draws a one-line progress bar, redrawn in place.
type progressBar struct {
	w        io.Writer
	start    time.Time
	drawn    bool
	lastPct  int
	lastDraw time.Time
}

func (b *progressBar) update(p sim.Progress) {
	now := time.Now()
	if b.start.IsZero() {
		b.start = now
	}
	const width = 30
	frac := 0.0
	if p.Total > 0 {
		frac = min(1, float64(p.Done)/float64(p.Total))
	}
	// Redraw when the percentage changes, or every second when the total
	// is unknown.
	pc := int(100 * frac)
	if b.drawn && pc == b.lastPct && now.Sub(b.lastDraw) < time.Second {
		return
	}
	b.lastPct, b.lastDraw = pc, now
	n := int(frac * width)
	fmt.Fprintf(b.w, "\rsimulating [%s%s] %3.0f%% %s ", strings.Repeat("=", n), strings.Repeat(" ", width-n), 100*frac, time.Since(b.start).Round(100*time.Millisecond))
	b.drawn = true
}

func (b *progressBar) finish() {
	if b.drawn {
		fmt.Fprintf(b.w, "\r%s\r", strings.Repeat(" ", 60))
	}
}

func init() {
	routingCmd.AddCommand(newSimulateCmd())
}

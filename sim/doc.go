// Package sim is a seeded, deterministic discrete-event simulator of an LLM
// serving cluster, used to compare routing policies by time to first token
// (TTFT), prefix-cache hit rate and load balance without a GPU.
//
// Each simulated replica runs continuous batching over a KV cache of a fixed
// number of blocks, scheduled like vLLM's v1 scheduler: each step's token
// budget goes to the decoding sequences, then to the running prefills in
// admission order (chunked prefill), and what is left admits waiting
// requests first come, first served, up to a maximum number of running
// sequences. A prefill's full blocks are cached as each chunk completes, so
// a request admitted later finds them (with Config.CacheAtSchedule, when
// the chunk is scheduled, as vLLM v1 does, so that a request admitted in
// the same step finds them too); blocks that no running request uses are
// evicted least recently used first. A prefill step costs
// a + b·tokens + c·((p+n)² − p²) for a chunk of n uncached tokens after p
// tokens of context, and a decode step costs more as the batch and its context
// grow (see Preset for every coefficient and its source).
//
// The routing decisions are made online by the real gateway (package
// github.com/examlops/gateway): one gateway.Gateway per policy, with the
// simulated clock injected, load signals refreshed from the replicas every
// Config.RefreshInterval, FirstToken and Done reported as they happen, and,
// in exact-index mode (Config.Index, or Policy.Exact for the routers that
// read the engines' KV events), cache events applied as the simulated
// replicas store and evict blocks. Reference policies that follow requests
// or KV events themselves (reference.Tracker, reference.KVListener) are told
// of each request before it is routed, of its first token and completion,
// and of every KV event. What a replica really holds is the simulation's truth; the
// router only sees its own index. The report sets the hit rate the index
// predicted beside the true one.
//
// Config.Gateways simulates several gateways sharing the traffic
// (active-active): each request goes to one of them drawn at random, each
// has its own gateway.Gateway (index, in-flight and pending counts, demand
// sketch) and its own instance of a reference policy, all are pushed the
// same scraped load, and in exact-index mode all are fed every engine's KV
// events (docs/multi-gateway.md has the figures).
//
// Past capacity, Config.Admission sheds what the gateway's own policies
// would route while no replica has room; Config.FlowControl holds it
// instead in a flow.Queue per gateway and routes it when a replica has room
// (late binding), answering it as expired at its deadline (flowctl.go).
// Policy gie_flow (GIEFlowPolicy) runs GIE's profile behind a model of GIE
// v1.5.0's flow controller (gieflow.go). Tenants gives a workload's
// requests tenants (fairness ids) and classes (priority and TTFT
// objective): NoisyNeighbour, InteractiveBatch; the report then has
// per-tenant and per-class tables (docs/flow-control.md).
//
// Config.ReplicaSpeeds makes a mixed pool: each replica runs at a multiple
// of its preset's compute speed, every step's cost divided by it; and
// Config.SpeedChanges changes a replica's speed during the run, from the
// next step it plans (speeds.go). The report then states the speeds and
// each speed's share of the work. Requests may carry a time-per-output-
// token objective (Request.TPOTSLO) beside their TTFT one; the engine
// measures every request's TPOT, and the per-class and per-tenant tables
// add each objective's attainment, both's, and the goodput meeting both
// (objectives.go; SLOClasses, ParseClasses).
//
// Workloads: DefaultWorkload, SharedPrefix (SGLang's generated shared-prefix
// benchmark), Chat (multi-turn sessions), RAG (Zipf document popularity),
// SystemPrompt (one prompt shared by all: the collapse trap), LowSharing,
// LoRAWorkload (requests naming LoRA adapters by Zipf popularity; the
// engines hold Config.MaxLoras adapter slots each and pay
// Config.AdapterLoad per load, after vLLM's scheduler: see lora.go), and
// TraceFile (Mooncake JSONL replay with a speed factor or Poisson
// arrivals). Presets: "8b-h100" (default, derived from hardware
// specifications), "8b-h100-blis" (fitted to measurements by BLIS) and
// "70b-h100-tp8".
//
// Requests are streamed from a Workload, and latency distributions are kept
// in fixed-size log histograms, so memory is bounded by the cache capacities
// and the requests in flight, not by the number of requests. The one
// exception is the unbounded-cache bound, which remembers every distinct
// block (8 to 16 bytes each).
//
// Beside every policy the report gives the spread of its work over the
// replicas (least and most requests and prefill tokens over the mean), its
// mean TTFT over the ideal, and, computed on the same requests, an ideal
// row (each request alone on an idle replica holding the pooled cache) and
// two bounds: one pooled LRU cache of the cluster's total capacity, and one
// unbounded cache (the ceiling on hit rate).
//
// Usage:
//
//	rep, err := sim.Run(sim.Config{
//		Workload: sim.DefaultWorkload(),     // or sim.TraceFile(path, sim.TraceOptions{Speed: 1})
//		Preset:   sim.MustPreset("8b-h100"), // zero value = default preset
//		Replicas: 8,
//		Seed:     1,
//		Progress: func(p sim.Progress) { /* draw a bar */ },
//	})
//	if err != nil {
//		return err
//	}
//	rep.WriteTable(os.Stdout) // aligned text table, one row per policy plus the bounds
//	rep.WriteJSON(w)          // the same figures as JSON
//	rep.WriteSVG(w)           // TTFT CDF per policy and hit rate per policy
//
// Policies default to DefaultPolicies(): the gateway's own modes
// (round_robin, load_aware, cache_aware) and the reference policies of
// package reference (sglang, sglang_cli, sglang_treesize, smg, smg_events,
// dynamo, gie, llmd_precise, chwbl, p2c, prefix_affinity), each
// Policy.Source naming what it follows.
// LoRAPolicies adds gie_lora (GIE's profile with its lora-affinity-scorer)
// for workloads that name adapters; LLMDPredictedPolicies gives
// llmd_predicted and llmd_predicted_e2e (llm-d's predicted-latency
// scheduling, streaming mode on and off), not run by default.
// PolicyByName resolves the names a command line passes.
//
// Run is deterministic: the same Config (including Seed) gives the same
// Report. Policies are simulated concurrently, each on its own copy of the
// request stream. A run that stops making progress (requests that no
// replica would ever run or finish: a simulator bug, such as a block left
// pinned) ends with an error wrapping ErrStalled that names the policy,
// the replica and what is stuck, instead of hanging (stall.go).
package sim

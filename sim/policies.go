package sim

import (
	"fmt"
	"strings"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/reference"
)

// Policy is a routing policy to simulate: a built-in gateway Mode, or a
// custom gateway.Policy made by New.
//
// A policy made by New that implements reference.Tracker is told of each
// request before it is routed (Arrive) and, through its gateway
// (gateway.Observer), of its first token and completion; one
// that implements reference.KVListener receives its replicas' KV events
// (blocks stored and removed); one that implements reference.Predictor
// supplies the "index says" hit rate from its own index.
type Policy struct {
	// Name labels the policy in the report; required and unique.
	Name string
	// Mode is the built-in policy used when New is nil; the zero value is
	// gateway.ModeRoundRobin. Run rejects a Mode that is not a built-in
	// mode with ErrInvalidConfig.
	Mode gateway.Mode
	// New, if set, makes a fresh policy for one run, seeded with
	// Config.Seed; it overrides Mode.
	New func(seed uint64) gateway.Policy
	// Exact, when true, runs this policy's gateway on the exact index (fed
	// the simulated engines' KV events) whatever Config.Index says: the
	// routers whose design reads the engines' events (Dynamo, llm-d's
	// precise scorer) run as they are deployed.
	Exact bool
	// Source says in one line what the policy follows (project, version);
	// empty for the gateway's own policies.
	Source string
	// Adapters says in a few words what the policy makes of LoRA adapters
	// (the report shows it beside the adapter figures): whether its keys
	// tell two adapters' caches apart, and whether it sees the replicas'
	// adapter slots.
	Adapters string
	// GIEFlowControl runs the policy behind a model of GIE v1.5.0's flow
	// controller with its defaults (gieflow.go): every request queued,
	// dispatched while the pool's mean saturation is below 1, one per
	// arrival and per 1 ms tick, routed at dispatch. Config.Admission and
	// Config.FlowControl do not apply to it. Default false.
	GIEFlowControl bool
	// BlindToUnstreamed says the policy's front hears a non-streamed
	// answer's first token only at its end, as an endpoint picker behind
	// Envoy's ext_proc does when the request goes to the engine as the
	// client sent it: with Config.NonStreamed, a Tracker is not told of
	// those first tokens. Default false: a Tracker hears every first token
	// (Dynamo's frontend streams from the engine whatever the client
	// asked).
	BlindToUnstreamed bool
}

// DefaultPolicies returns the policies Run compares by default: the
// gateway's round_robin, load_aware and cache_aware modes, then the routers
// of the field as package reference reproduces them: sglang (current),
// sglang_cli (its command-line defaults), sglang_treesize (its miss path
// before December 2025), smg and smg_events (its successor, SMG, over HTTP
// and with KV events), dynamo, gie, llmd_precise, chwbl, p2c and
// prefix_affinity.
func DefaultPolicies() []Policy {
	return []Policy{
		{Name: "round_robin", Mode: gateway.ModeRoundRobin, Adapters: "none"},
		{Name: "load_aware", Mode: gateway.ModeLoadAware, Adapters: "none (load only)"},
		{Name: "cache_aware", Mode: gateway.ModeCacheAware, Adapters: "salted keys; slots priced (Candidate.LoRA)"},
		{Name: "sglang", Source: "SGLang router, sgl-model-gateway main + PR #33138 (Jul 2026), library defaults",
			Adapters: "none: prompt text only, one tree per worker model",
			New:      func(seed uint64) gateway.Policy { return reference.NewSGLang(seed) }},
		{Name: "sglang_cli", Source: "the same with the router's command-line defaults (0.3, 64, 1.5, 120 s, 2^26 chars)",
			Adapters: "none, as sglang",
			New:      func(seed uint64) gateway.Policy { return reference.NewSGLangCLI(seed) }},
		{Name: "sglang_treesize", Source: "SGLang router before PR #14650 (Dec 2025): misses go to the smallest tree",
			Adapters: "none, as sglang",
			New: func(seed uint64) gateway.Policy {
				p := reference.NewSGLang(seed)
				p.Miss = reference.MissSmallestTree
				return p
			}},
		{Name: "smg", Source: "Shepherd Model Gateway (SGLang router's successor) cache_aware, HTTP mode, 73da68ca (Aug 2026), CLI defaults",
			Adapters: "none: prompt text only, one tree per worker model",
			New:      func(seed uint64) gateway.Policy { return reference.NewSMG(seed, false) }},
		{Name: "smg_events", Exact: true, Source: "the same, gRPC workers with KV events (event-driven overlap)",
			Adapters: "salted keys (engine events); no slots",
			New:      func(seed uint64) gateway.Policy { return reference.NewSMG(seed, true) }},
		{Name: "dynamo", Exact: true, Source: "NVIDIA Dynamo KV router 1.0–1.1 (scheduler.rs db19bd2a), KV events",
			Adapters: "salted keys (engine events); no slots",
			New:      func(seed uint64) gateway.Policy { return reference.NewDynamo(seed) }},
		{Name: "gie", Source: "Gateway API Inference Extension EPP default profile (1748e829, Jun 2026)",
			Adapters: "salted keys (TargetModel in the hash); no slots (scorer not in the profile)",
			New:      func(seed uint64) gateway.Policy { return reference.NewGIE(seed) }},
		{Name: "llmd_precise", Exact: true, Source: "llm-d precise-prefix-cache-scorer (520af478, May 2026) in GIE's profile, KV events",
			Adapters: "salted keys (engine events); no slots",
			New:      func(seed uint64) gateway.Policy { return reference.NewLLMDPrecise(seed) }},
		{Name: "chwbl", Source: "KubeAI PrefixHash (CHWBL), 2f32ef49 (Jul 2025)",
			Adapters: "adapter hashed into the ring key; no slots",
			New:      func(uint64) gateway.Policy { return &reference.CHWBL{} }},
		{Name: "p2c", Source: "power of two choices, least requests (Envoy, Linkerd)",
			Adapters: "none",
			New:      func(seed uint64) gateway.Policy { return reference.NewP2C(seed) }},
		{Name: "prefix_affinity", Source: "longest cached prefix, no load (Preble's baseline)",
			Adapters: "salted keys (the gateway's index); no slots",
			New:      func(uint64) gateway.Policy { return &reference.PrefixAffinity{} }},
	}
}

// LoRAPolicies returns DefaultPolicies and gie_lora, GIE's profile with
// its lora-affinity-scorer added (not in its default profile): the
// policies Run compares on workloads that name LoRA adapters.
func LoRAPolicies() []Policy {
	return append(DefaultPolicies(), gieLoRAPolicy())
}

func gieLoRAPolicy() Policy {
	return Policy{Name: "gie_lora", Source: "GIE's profile + lora-affinity-scorer, weight 1 (1748e829)",
		Adapters: "salted keys; slots scored from the last scrape",
		New:      func(seed uint64) gateway.Policy { return reference.NewGIELoRA(seed) }}
}

// GIEFlowPolicy returns gie_flow: GIE's EPP default profile (the gie
// policy) behind its v1.5.0 flow controller with its defaults, for
// comparison with Config.FlowControl; it is not among DefaultPolicies.
func GIEFlowPolicy() Policy {
	return Policy{Name: "gie_flow", GIEFlowControl: true,
		Source:   "GIE v1.5.0 flow controller (pkg/epp/flowcontrol: global strict, FCFS, 1 GB band, no TTL, utilization saturation) before the EPP default profile",
		Adapters: "as gie",
		New:      func(seed uint64) gateway.Policy { return reference.NewGIE(seed) }}
}

// LLMDPredictedPolicies returns llmd_predicted and llmd_predicted_e2e:
// llm-d's predicted-latency scheduling (reference.LLMDPredicted) with its
// producer's streamingMode on (TTFT learned at the first token, for
// clients that stream) and off (llm-d's default: the whole request's
// latency learned at its end). They are not among DefaultPolicies.
func LLMDPredictedPolicies() []Policy {
	const src = "llm-d predicted-latency scheduling, llm-d-inference-scheduler 520af478 (May 2026): predictedlatency producer, " +
		"prefix-cache-affinity 0.99/0.80, slo-headroom-tier, latency-scorer, weighted-random-picker; " +
		"GIE latencypredictor 1748e829 training/prediction servers, Bayesian ridge in place of XGBoost"
	const adapters = "salted keys (its approximate prefix index); no slots"
	return []Policy{
		{Name: "llmd_predicted", Source: src + ", streamingMode on", Adapters: adapters, BlindToUnstreamed: true,
			New: func(seed uint64) gateway.Policy { return reference.NewLLMDPredicted(seed, true) }},
		{Name: "llmd_predicted_e2e", Source: src + ", streamingMode off (its default)", Adapters: adapters, BlindToUnstreamed: true,
			New: func(seed uint64) gateway.Policy { return reference.NewLLMDPredicted(seed, false) }},
	}
}

// PolicyByName returns the default policy, gie_lora, gie_flow,
// llmd_predicted or llmd_predicted_e2e called name (hyphens accepted for
// underscores), or an error wrapping ErrInvalidConfig.
func PolicyByName(name string) (Policy, error) {
	n := strings.ReplaceAll(name, "-", "_")
	var names []string
	for _, p := range append(append(LoRAPolicies(), GIEFlowPolicy()), LLMDPredictedPolicies()...) {
		if p.Name == n {
			return p, nil
		}
		names = append(names, p.Name)
	}
	return Policy{}, fmt.Errorf("%w: policy %q unknown (have %s)", ErrInvalidConfig, name, strings.Join(names, ", "))
}

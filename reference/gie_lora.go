package reference

import (
	"slices"

	"github.com/examlops/gateway"
)

// GIE's lora-affinity-scorer, followed from
// kubernetes-sigs/gateway-api-inference-extension at 1748e829
// (pkg/epp/framework/plugins/scheduling/scorer/loraaffinity/
// lora_affinity.go). It is not in the EPP's default profile
// (pkg/epp/config/loader/defaults.go: queue, KV-cache and prefix scorers);
// a configuration names it, and one that gives no weight gets
// DefaultScorerWeight, 1 (as test/integration/epp/testdata/
// default-config.yaml does). For the request's target model (the adapter
// it names) each endpoint scores
//
//   - 1 when the model is among its ActiveModels (running adapters),
//   - 0.8 when len(ActiveModels) + len(WaitingModels) < MaxActiveModels,
//   - 0.6 when it is among its WaitingModels,
//   - 0 otherwise,
//
// where the three come from the last scrape of vllm:lora_requests_info
// (the series with the largest value; extractor/metrics/loraspec.go), and
// nothing else: the EPP keeps no count of its own routing per adapter.
// Here they are Candidate.LoRA.Report, the gateway's copy of the engine's
// last report, and a request for the base model targets a name no report
// lists, as the base model's name never is.
const gieLoRAWeight = 1

// gieLoRAScore is the lora-affinity-scorer's score of a candidate whose
// adapter state is l, for a request naming adapter ("" the base model).
func gieLoRAScore(adapter string, l *gateway.LoRAState) float64 {
	var running, waiting []string
	maxActive := 0
	if r := l.Report; r != nil {
		running, waiting, maxActive = r.Running, r.Waiting, r.MaxLoras
	}
	active := adapter != "" && slices.Contains(running, adapter)
	queued := adapter != "" && slices.Contains(waiting, adapter)
	switch {
	case active:
		return 1
	case len(running)+len(waiting) < maxActive:
		return 0.8
	case queued:
		return 0.6
	}
	return 0
}

// NewGIELoRA returns GIE's default profile with the lora-affinity-scorer
// added at its default weight, drawing ties from seed.
func NewGIELoRA(seed uint64) *GIE { return &GIE{Seed: seed, LoRAWeight: gieLoRAWeight} }

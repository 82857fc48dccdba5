package sim

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// Preset is the cost and capacity model of one replica. Every coefficient is
// in seconds. The zero Preset is not usable; Config treats it as
// DefaultPreset().
//
// A step of continuous batching that prefills chunks of n uncached tokens
// after p tokens of context and decodes B running sequences whose contexts
// sum to C tokens takes
//
//	StepOverhead + Σ(PrefillPerToken·n + PrefillQuadratic·((p+n)² − p²)) + DecodePerSeq·B + DecodePerContextToken·C
//
// so a lone prompt of n uncached tokens behind p cached ones costs
// a + b·n + c·((p+n)² − p²), which is a + b·n + c·n² when nothing is cached.
type Preset struct {
	// Name identifies the preset ("8b-h100"). Default "".
	Name string `json:"name"`
	// Description says in one line what hardware and model it stands for.
	Description string `json:"description"`
	// KVTokens is the KV-cache capacity of one replica in tokens; the cache
	// holds KVTokens / block size blocks.
	KVTokens int `json:"kv_tokens"`
	// MaxRunning is the most sequences a replica runs at once (vLLM
	// max_num_seqs).
	MaxRunning int `json:"max_running"`
	// MaxBatchTokens is the token budget of one step, decode tokens included
	// (vLLM max_num_batched_tokens with chunked prefill).
	MaxBatchTokens int `json:"max_batch_tokens"`
	// StepOverhead is the fixed cost of one step (a), dominated by reading
	// the weights once.
	StepOverhead float64 `json:"step_overhead_s"`
	// PrefillPerToken is the linear prefill cost per uncached token (b).
	PrefillPerToken float64 `json:"prefill_per_token_s"`
	// PrefillQuadratic is the attention cost coefficient (c), per token².
	PrefillQuadratic float64 `json:"prefill_quadratic_s"`
	// DecodePerSeq is the cost of one decoded token of one sequence.
	DecodePerSeq float64 `json:"decode_per_seq_s"`
	// DecodePerContextToken is the cost of reading one token of KV cache
	// during a decode step.
	DecodePerContextToken float64 `json:"decode_per_context_token_s"`
}

// Preset figures are derived from public specifications:
//   - NVIDIA H100 SXM 80 GB: 989 TFLOP/s dense BF16, 3.35 TB/s HBM3 (NVIDIA
//     H100 datasheet). We assume 50% model FLOP utilisation for prefill on one
//     GPU, 40% under 8-way tensor parallelism, and 80% of peak bandwidth.
//   - Llama 3.1 8B: 8.03 B parameters, 32 layers, 32 query heads and 8 KV
//     heads of dimension 128, so 2·32·8·128·2 B = 128 KiB of KV per token.
//     Llama 3.1 70B: 70.6 B parameters, 80 layers, 64 query and 8 KV heads of
//     dimension 128, so 320 KiB of KV per token (Meta model cards).
//   - Linear prefill: 2 FLOP per parameter per token. Attention: 2·n²·d·L FLOP
//     for a causal prompt of n tokens (d = query heads × head dim, L layers).
//   - KV capacity: vLLM's gpu_memory_utilization 0.9, minus the weights and
//     about 6 GB per GPU of activations and CUDA graphs.
//   - MaxRunning 256 and MaxBatchTokens 8192: vLLM's max_num_seqs default and
//     its chunked-prefill token budget for large GPUs.
var presets = map[string]Preset{
	"8b-h100": {
		Name:        "8b-h100",
		Description: "Llama 3.1 8B, BF16, one H100 SXM 80GB (vLLM-like)",
		// (0.9·80 GiB − 16.1 GB weights − 6 GB) / 128 KiB ≈ 419k; rounded down to 800·512.
		KVTokens:       409600,
		MaxRunning:     256,
		MaxBatchTokens: 8192,
		// 16.1 GB of weights read at 0.8·3.35 TB/s.
		StepOverhead: 6.0e-3,
		// 16.06 GFLOP/token at 0.5·989 TFLOP/s.
		PrefillPerToken: 3.25e-5,
		// 2·4096·32 = 262144 FLOP/token² at 0.5·989 TFLOP/s.
		PrefillQuadratic: 5.3e-10,
		// one token through the model, as in prefill.
		DecodePerSeq: 3.25e-5,
		// 128 KiB per context token at 0.8·3.35 TB/s.
		DecodePerContextToken: 4.9e-8,
	},
	// Fitted to measurements rather than derived: BLIS (IBM's Blackbox
	// Inference Simulator, inference-sim/inference-sim, defaults.yaml at
	// 1a6eb353), model meta-llama/llama-3.1-8b-instruct on one H100, vLLM
	// v0.8.4, whose step time is β0 + β1·(prefill tokens) + β2·(decode
	// tokens) with β = 5752.7 µs, 17.25 µs and 6.00 µs, trained on
	// measured GuideLLM runs. BLIS has no attention or context term, so
	// PrefillQuadratic and DecodePerContextToken are 0. Its α terms
	// (request overhead before scheduling, 0.23 ms + 1.75 µs per input
	// token) are the same whatever the router and are left out. KV
	// capacity is BLIS's total_kv_blocks, 29,205 blocks of 16 tokens;
	// MaxRunning and MaxBatchTokens are kept from 8b-h100.
	"8b-h100-blis": {
		Name:                  "8b-h100-blis",
		Description:           "Llama 3.1 8B on one H100, vLLM 0.8.4, step times fitted by BLIS",
		KVTokens:              29205 * 16,
		MaxRunning:            256,
		MaxBatchTokens:        8192,
		StepOverhead:          5.752705e-3,
		PrefillPerToken:       17.25086e-6,
		PrefillQuadratic:      0,
		DecodePerSeq:          5.999144e-6,
		DecodePerContextToken: 0,
	},
	"70b-h100-tp8": {
		Name:        "70b-h100-tp8",
		Description: "Llama 3.1 70B, BF16, one node of 8 H100 SXM 80GB, tensor parallel 8",
		// (0.9·8·80 GiB − 141 GB weights − 8·6 GB) / 320 KiB ≈ 1.31M; 2560·512.
		KVTokens:       1310720,
		MaxRunning:     256,
		MaxBatchTokens: 8192,
		// 17.6 GB of weights per GPU at 0.8·3.35 TB/s, plus ~2 ms of all-reduce.
		StepOverhead: 8.5e-3,
		// 141 GFLOP/token at 0.4·8·989 TFLOP/s.
		PrefillPerToken: 4.46e-5,
		// 2·8192·80 = 1310720 FLOP/token² at 0.4·8·989 TFLOP/s.
		PrefillQuadratic: 4.14e-10,
		DecodePerSeq:     4.46e-5,
		// 40 KiB per context token per GPU at 0.8·3.35 TB/s.
		DecodePerContextToken: 1.53e-8,
	},
}

// DefaultPresetName is the preset used when Config.Preset is the zero value.
const DefaultPresetName = "8b-h100"

// DefaultPreset returns the default preset, "8b-h100".
func DefaultPreset() Preset { return presets[DefaultPresetName] }

// PresetNames returns the names of the built-in presets, sorted.
func PresetNames() []string {
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// PresetByName returns the built-in preset called name, or an error wrapping
// ErrInvalidConfig.
func PresetByName(name string) (Preset, error) {
	p, ok := presets[name]
	if !ok {
		return Preset{}, fmt.Errorf("%w: preset %q unknown (have %v)", ErrInvalidConfig, name, PresetNames())
	}
	return p, nil
}

// MustPreset is like PresetByName but panics, with the error wrapping
// ErrInvalidConfig, if name is not a built-in preset. Like
// regexp.MustCompile it is meant for names fixed in the source (package
// variables, tests, examples); use PresetByName for names that come from
// input.
func MustPreset(name string) Preset {
	p, err := PresetByName(name)
	if err != nil {
		panic(err)
	}
	return p
}

func (p Preset) validate() error {
	switch {
	case p.KVTokens <= 0:
		return fmt.Errorf("%w: preset %q: KVTokens %d must be positive", ErrInvalidConfig, p.Name, p.KVTokens)
	case p.MaxRunning <= 0:
		return fmt.Errorf("%w: preset %q: MaxRunning %d must be positive", ErrInvalidConfig, p.Name, p.MaxRunning)
	case p.MaxBatchTokens <= p.MaxRunning:
		return fmt.Errorf("%w: preset %q: MaxBatchTokens %d must exceed MaxRunning %d", ErrInvalidConfig, p.Name, p.MaxBatchTokens, p.MaxRunning)
	}
	for _, c := range []struct {
		field string
		v     float64
	}{
		{"StepOverhead", p.StepOverhead},
		{"PrefillPerToken", p.PrefillPerToken},
		{"PrefillQuadratic", p.PrefillQuadratic},
		{"DecodePerSeq", p.DecodePerSeq},
		{"DecodePerContextToken", p.DecodePerContextToken},
	} {
		if c.v < 0 || math.IsNaN(c.v) || math.IsInf(c.v, 0) {
			return fmt.Errorf("%w: preset %q: %s %v must be a finite value >= 0", ErrInvalidConfig, p.Name, c.field, c.v)
		}
	}
	switch {
	case p.StepOverhead+p.DecodePerSeq <= 0:
		return fmt.Errorf("%w: preset %q: StepOverhead+DecodePerSeq must be positive", ErrInvalidConfig, p.Name)
	}
	return nil
}

// PrefillTime is the time one replica takes to prefill n uncached tokens after
// p cached ones in a step of its own: a + b·n + c·((p+n)² − p²).
func (p Preset) PrefillTime(cached, n int) time.Duration {
	return secs(p.StepOverhead + p.prefillCost(cached, n))
}

// LoneTTFT is the time to first token of a prompt of n uncached tokens
// after cached ones, alone on an idle replica: its prefill in chunks of at
// most MaxBatchTokens tokens, one step each, as the simulated engine runs
// it.
func (p Preset) LoneTTFT(cached, n int) time.Duration { return p.loneTTFTAt(cached, n, 1) }

func (p Preset) prefillCost(cached, n int) float64 {
	pc, e := float64(cached), float64(cached+n)
	return p.PrefillPerToken*float64(n) + p.PrefillQuadratic*(e*e-pc*pc)
}

func secs(s float64) time.Duration { return time.Duration(s * 1e9) }

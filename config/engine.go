package config

// Engine types accepted in [Model.Engine]: which metric names the HTTP
// gateway reads from the model's engines' /metrics pages for their load.
const (
	// EngineAuto ("", the default) detects each engine's type from its
	// metrics page: vLLM's names when present, else SGLang's, else
	// TensorRT-LLM's (Triton's); with none of them the gateway logs a
	// warning and shows it in /stats, and the engine reads as idle.
	EngineAuto = ""
	// EngineVLLM reads vLLM's names (vllm:num_requests_waiting,
	// vllm:num_requests_running, vllm:kv_cache_usage_perc), which
	// llm-d-inference-sim also serves.
	EngineVLLM = "vllm"
	// EngineSGLang reads SGLang's (sglang:num_queue_reqs,
	// sglang:num_running_reqs, sglang:token_usage).
	EngineSGLang = "sglang"
	// EngineTRTLLM reads Triton TensorRT-LLM's
	// (nv_trt_llm_request_metrics{request_type="waiting"|"scheduled"},
	// nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}).
	EngineTRTLLM = "trtllm"
)

// Engines lists the engine types a model may name, in the order
// autodetection tries them.
var Engines = []string{EngineVLLM, EngineSGLang, EngineTRTLLM}

// ParseEngine checks an engine type name; "" and "auto" mean [EngineAuto]
// (returned as ""). The error is a [*FieldError] for field "engine".
func ParseEngine(s string) (string, error) {
	switch s {
	case "", "auto":
		return EngineAuto, nil
	case EngineVLLM, EngineSGLang, EngineTRTLLM:
		return s, nil
	}
	return "", &FieldError{Field: "engine", Value: s, Reason: "want vllm, sglang, trtllm or auto"}
}

// EngineName returns the model's engine type, "auto" for [EngineAuto].
func (m Model) EngineName() string {
	if m.Engine == EngineAuto {
		return "auto"
	}
	return m.Engine
}

func (m Model) validateEngine() error {
	if m.Engine == "auto" {
		// Stored as "" (see ParseEngine); "auto" in a file is accepted
		// too, but Validate reports it so a file round-trips unchanged.
		return &FieldError{Field: "engine", Value: m.Engine, Reason: `write "" (or leave it out) for autodetection`}
	}
	_, err := ParseEngine(m.Engine)
	return err
}

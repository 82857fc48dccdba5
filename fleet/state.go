package fleet

import (
	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
)

// State is an immutable snapshot of the configured models and engines.
type State struct {
	File      *config.File
	Models    map[string]*Model
	Endpoints map[string]*Endpoint // by normalised address
	KV        *kvTable             // the exact index's routing of engine events
	Adapters  *adapterTable        // LoRA adapter names to their models (lora.go)
}

// Model is one model's routing table.
type Model struct {
	Name         string
	Cfg          config.Model
	Mode         gateway.Mode
	Gateway      *gateway.Gateway // nil when the model has no replicas
	Order        []string         // replica names in configuration order
	ByName       map[string]*Endpoint
	NoReplicas   bool
	Disaggregate bool
	MissingPools []string // prefill/decode pools named but not defined
	// Front is the data plane's own state of the model (Options.Attach);
	// nil without Attach.
	Front any
	// PD, for a disaggregated model served by its two pools, holds the
	// prefill pool's gateway and the decider's settings; gw is then the
	// decode pool's gateway. Nil otherwise.
	PD *Disagg
	// ExactBlockSize is the block size in tokens of a model on the exact index,
	// 0 on the approximate index; exactCnt its counters.
	ExactBlockSize int
	ExactCounters  *ExactCounters
}

package kvevents

import "fmt"

// Kind is the kind of a KV-cache event.
type Kind uint8

// The event kinds of vLLM's vllm/distributed/kv_events.py. The zero value
// is no kind.
const (
	// BlockStored: the engine cached Hashes, children of Parent (or roots),
	// holding Tokens.
	BlockStored Kind = iota + 1
	// BlockRemoved: the engine evicted Hashes.
	BlockRemoved
	// AllBlocksCleared: the engine dropped its whole prefix cache.
	AllBlocksCleared
)

var kindNames = [...]string{"", "BlockStored", "BlockRemoved", "AllBlocksCleared"}

// String returns the event's wire tag: BlockStored, BlockRemoved or
// AllBlocksCleared.
func (k Kind) String() string {
	if int(k) < len(kindNames) && k != 0 {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Event is one decoded KV-cache event. Its slices are the Decoder's
// buffers: valid only until the callback it was passed to returns.
type Event struct {
	Kind Kind
	// Hashes are the engine's block hashes (BlockStored, BlockRemoved): an
	// integer hash as its 64 bits, a byte-string hash (vLLM's sha256
	// hashes) as the big-endian value of its last 8 bytes.
	Hashes []uint64
	// Parent is the engine hash of the block the stored ones follow, when
	// HasParent. vLLM sends nil for a chain that starts at the root;
	// llm-d-inference-sim's array encoding sends 0, which the decoder
	// reads as no parent too.
	Parent    uint64
	HasParent bool
	// Tokens are the token ids of the stored blocks, BlockSize per block.
	Tokens    []uint32
	BlockSize int
	// LoRA is the adapter name (lora_name), empty for the base model.
	LoRA []byte
	// LoRAID is the adapter's id (lora_id), 0 for the base model or when
	// absent. vLLM before lora_name named the adapter by it alone.
	LoRAID int64
	// Medium is where the blocks live ("GPU", "CPU"...), empty when the
	// engine does not say.
	Medium []byte
	// Plain is how many leading blocks carry no extra keys (multimodal
	// hashes, cache salts) but the LoRA adapter's name, when it is
	// lora_name: their content is their tokens (and adapter) alone. It is
	// len(Hashes) unless the event has extra_keys.
	Plain int
	// SpecKind is the KV-cache group's kind (kv_cache_spec_kind), empty
	// when absent: "full_attention", "sliding_window"...
	SpecKind []byte
	// Group is the KV-cache group (group_idx) the blocks are stored in or
	// removed from, when HasGroup: a hybrid model's groups hold the same
	// block hashes, each stored and removed on its own.
	Group    int64
	HasGroup bool
}

// Blocks returns how many blocks the event concerns.
func (e *Event) Blocks() int { return len(e.Hashes) }

package keys

import "github.com/cespare/xxhash/v2"

// Salt salts key in place with a LoRA adapter's name and returns it,
// so that the same prompt under two adapters (or under an adapter and the
// base model) gives two keys, as vLLM's KV block hashes include the
// adapter. Two keys salted with the same adapter still agree on exactly as
// many leading blocks as before. An empty adapter leaves key unchanged.
// It does not allocate.
func Salt(key Key, adapter string) Key {
	if adapter == "" {
		return key
	}
	salt := chain(tagAdapter, xxhash.Sum64String(adapter))
	for i, k := range key {
		key[i] = chain(salt, k)
	}
	return key
}

const tagAdapter = 0x4c4f524100000006 // "LORA"

package gateway

// Key identifies a request prefix as a chain of block hashes: Key[i] covers
// the content of blocks 0..i, so two keys agree on their first n elements
// exactly when their first n blocks have the same content. A nil or empty
// Key cannot be routed.
//
// Package keys builds every Key: from text segments (keys.PrefixKey,
// keys.Hasher), token ids (keys.AppendTokens, and keys.AppendExact for the
// exact index), pre-hashed block ids (keys.AppendHashes), a LoRA adapter's
// salt (keys.Salt) and OpenAI request bodies (keys.Parse). Key is an alias,
// so a keys.Key is a Key.
type Key = []uint64

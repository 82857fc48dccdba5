// Package keys builds every prefix key the router uses, so that two
// fronts, the simulator and an embedding program key one request alike.
// A key is a chain of block hashes (gateway.Key, an alias of []uint64):
// element i identifies blocks 0..i, so two keys agree on exactly as many
// leading elements as their leading blocks agree.
//
//   - Text: PrefixKey(system, session, rag) and Hasher.AppendSegment cut
//     each segment, in its role (Segment), into TextBlockBytes-byte blocks
//     (64 bytes by default, about 16 tokens); a block never straddles two
//     segments.
//   - Token ids: AppendTokens, in blocks of a given number of tokens, as
//     vLLM and SGLang hash KV blocks.
//   - The exact index: AppendExact chains token blocks from ExactRoot(name)
//     of the model or LoRA adapter, as package kvevents keys the engines'
//     own KV events (AppendChained), so requests and events meet.
//   - Hash ids: AppendHashes, for traces that give pre-hashed blocks.
//   - LoRA: Salt salts a text key with an adapter's name.
//   - OpenAI bodies: Parse reads a chat, completions or responses body (one
//     pass, the whole body's JSON syntax checked, the rules of Python's json
//     module), and Request.AppendKey keys it: system messages, tool
//     definitions and chat template arguments, session, RAG context,
//     then the conversation. The HTTP gateway and the endpoint picker
//     both call them.
//
// Block sizes carry their unit in their name: bytes for text, tokens for
// token ids. A size below 1 is an error wrapping ErrInvalid. Everything is
// safe for concurrent use; the Append forms do not allocate when dst has
// room.
package keys

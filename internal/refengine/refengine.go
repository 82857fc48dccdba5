// Package refengine is a small deterministic language model with a KV
// cache: one attention head over hash-derived embeddings. The example
// examples/disagg runs it to show that splitting prefill and decode
// across replicas, with the KV cache serialised in between, gives exactly
// the output of running both on one replica. Its arithmetic is float32, as
// an engine's is, so a lossy transfer would show. It is a test model, not
// an inference engine; the real check of identical output runs against
// engines in the e2e tests.
package refengine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/cespare/xxhash/v2"
)

// Engine is the model's shape: embedding width and vocabulary size. The
// zero value is not usable; use Default.
type Engine struct {
	Dim   int
	Vocab int
}

// Default is the model examples/disagg runs.
var Default = Engine{Dim: 16, Vocab: 512}

// KVCache holds one key and one value vector per position. The zero value
// is an empty cache of width 0; Engine.Prefill makes a usable one.
type KVCache struct {
	dim  int
	k, v []float32
}

// Positions is how many positions the cache holds.
func (c *KVCache) Positions() int {
	if c.dim == 0 {
		return 0
	}
	return len(c.k) / c.dim
}

func (e Engine) embed(tok uint32, salt uint64, out []float32) {
	var b [12]byte
	binary.LittleEndian.PutUint32(b[:4], tok)
	binary.LittleEndian.PutUint64(b[4:], salt)
	h := xxhash.Sum64(b[:])
	for i := range out {
		h = h*6364136223846793005 + 1442695040888963407
		out[i] = float32(int32(h>>32)) / float32(1<<31)
	}
}

// append adds a token's key and value at the next position.
func (e Engine) append(c *KVCache, tok uint32) {
	pos := len(c.k) / e.Dim
	k := make([]float32, e.Dim)
	v := make([]float32, e.Dim)
	e.embed(tok, 1, k)
	e.embed(tok, 2, v)
	for i := range k { // a position signal, as rotary embeddings give
		k[i] += float32(math.Sin(float64(pos) / math.Pow(100, float64(i)/float64(e.Dim))))
	}
	c.k = append(c.k, k...)
	c.v = append(c.v, v...)
}

// Prefill computes the KV cache of a prompt.
func (e Engine) Prefill(prompt []uint32) *KVCache {
	c := &KVCache{dim: e.Dim}
	for _, t := range prompt {
		e.append(c, t)
	}
	return c
}

// Decode generates n tokens after the last prompt token, extending c.
func (e Engine) Decode(c *KVCache, last uint32, n int) []uint32 {
	out := make([]uint32, 0, n)
	q := make([]float32, e.Dim)
	ctx := make([]float32, e.Dim)
	emb := make([]float32, e.Dim)
	for range n {
		e.embed(last, 3, q)
		positions := len(c.k) / e.Dim
		// Attention: softmax(q·k) weighted sum of v.
		scores := make([]float32, positions)
		maxS := float32(math.Inf(-1))
		for p := range positions {
			var s float32
			for i, qi := range q {
				s += qi * c.k[p*e.Dim+i]
			}
			scores[p] = s
			maxS = max(maxS, s)
		}
		var sum float32
		for p := range scores {
			scores[p] = float32(math.Exp(float64(scores[p] - maxS)))
			sum += scores[p]
		}
		clear(ctx)
		for p, w := range scores {
			for i := range ctx {
				ctx[i] += w / sum * c.v[p*e.Dim+i]
			}
		}
		best, bestS := uint32(0), float32(math.Inf(-1))
		for t := range uint32(e.Vocab) {
			e.embed(t, 4, emb)
			var s float32
			for i := range emb {
				s += emb[i] * ctx[i]
			}
			if s > bestS {
				best, bestS = t, s
			}
		}
		out = append(out, best)
		e.append(c, best)
		last = best
	}
	return out
}

// ErrKVFormat is wrapped by UnmarshalKV's errors.
var ErrKVFormat = errors.New("refengine: malformed KV transfer")

// Marshal serialises a KV cache for transfer: dim, positions, then the
// raw float32 bits of keys and values.
func (c *KVCache) Marshal() []byte {
	b := make([]byte, 0, 8+8*len(c.k))
	b = binary.LittleEndian.AppendUint32(b, uint32(c.dim))
	b = binary.LittleEndian.AppendUint32(b, uint32(c.Positions()))
	for _, xs := range [][]float32{c.k, c.v} {
		for _, x := range xs {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
		}
	}
	return b
}

// UnmarshalKV decodes what Marshal wrote; anything else is an error
// wrapping ErrKVFormat.
func UnmarshalKV(b []byte) (*KVCache, error) {
	if len(b) < 8 {
		return nil, fmt.Errorf("%w: %d bytes, want a header of 8", ErrKVFormat, len(b))
	}
	dim := uint64(binary.LittleEndian.Uint32(b))
	n := uint64(binary.LittleEndian.Uint32(b[4:]))
	// The body's size divided by a position's, not 8+8*dim*n compared
	// with len(b): that product overflows (dim = n = 1<<31 gives 0).
	body := uint64(len(b) - 8)
	if dim == 0 || body%(8*dim) != 0 || body/(8*dim) != n {
		return nil, fmt.Errorf("%w: %d bytes for dim %d and %d positions", ErrKVFormat, len(b), dim, n)
	}
	c := &KVCache{dim: int(dim), k: make([]float32, dim*n), v: make([]float32, dim*n)}
	b = b[8:]
	for _, xs := range [][]float32{c.k, c.v} {
		for i := range xs {
			xs[i] = math.Float32frombits(binary.LittleEndian.Uint32(b))
			b = b[4:]
		}
	}
	return c, nil
}

// PromptOf derives a deterministic token prompt from a prefix key (block
// hashes), two tokens a block, so the engine can stand in for a real
// prompt.
func PromptOf(key []uint64, vocab int) []uint32 {
	p := make([]uint32, 0, 2*len(key))
	for _, h := range key {
		p = append(p, uint32(h%uint64(vocab)), uint32((h>>32)%uint64(vocab)))
	}
	return p
}

// Colocated runs prefill and decode in one engine and returns the n
// generated tokens. prompt must not be empty.
func (e Engine) Colocated(prompt []uint32, n int) []uint32 {
	c := e.Prefill(prompt)
	return e.Decode(c, prompt[len(prompt)-1], n)
}

// Split runs prefill on one side, ships the serialised KV cache, and
// decodes on the other; it returns the generated tokens and the size of
// the transfer. prompt must not be empty.
func (e Engine) Split(prompt []uint32, n int) ([]uint32, int, error) {
	wire := e.Prefill(prompt).Marshal()
	c, err := UnmarshalKV(wire)
	if err != nil {
		return nil, 0, err
	}
	return e.Decode(c, prompt[len(prompt)-1], n), len(wire), nil
}

package gateway

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/cespare/xxhash/v2"
)

// refEngine is a small deterministic language model with a KV cache: one
// attention head over learned-looking (hash-derived) embeddings. It exists
// to check that splitting prefill and decode across replicas, with the KV
// cache serialised in between, gives exactly the output of running both on
// one replica. Its arithmetic is float32, as an engine's is, so a lossy
// transfer would show.
type refEngine struct {
	dim   int
	vocab int
}

var refModel = refEngine{dim: 16, vocab: 512}

// kvCache holds one key and one value vector per position.
type kvCache struct {
	dim  int
	k, v []float32
}

func (e refEngine) embed(tok uint32, salt uint64, out []float32) {
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
func (e refEngine) append(c *kvCache, tok uint32) {
	pos := len(c.k) / e.dim
	k := make([]float32, e.dim)
	v := make([]float32, e.dim)
	e.embed(tok, 1, k)
	e.embed(tok, 2, v)
	for i := range k { // a position signal, as rotary embeddings give
		k[i] += float32(math.Sin(float64(pos) / math.Pow(100, float64(i)/float64(e.dim))))
	}
	c.k = append(c.k, k...)
	c.v = append(c.v, v...)
}

// prefill computes the KV cache of a prompt.
func (e refEngine) prefill(prompt []uint32) *kvCache {
	c := &kvCache{dim: e.dim}
	for _, t := range prompt {
		e.append(c, t)
	}
	return c
}

// decode generates n tokens after the last prompt token, extending c.
func (e refEngine) decode(c *kvCache, last uint32, n int) []uint32 {
	out := make([]uint32, 0, n)
	q := make([]float32, e.dim)
	ctx := make([]float32, e.dim)
	emb := make([]float32, e.dim)
	for range n {
		e.embed(last, 3, q)
		positions := len(c.k) / e.dim
		// Attention: softmax(q·k) weighted sum of v.
		scores := make([]float32, positions)
		maxS := float32(math.Inf(-1))
		for p := range positions {
			var s float32
			for i, qi := range q {
				s += qi * c.k[p*e.dim+i]
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
				ctx[i] += w / sum * c.v[p*e.dim+i]
			}
		}
		best, bestS := uint32(0), float32(math.Inf(-1))
		for t := range uint32(e.vocab) {
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

var errKVFormat = errors.New("gateway: malformed KV transfer")

// marshal serialises a KV cache for transfer: dim, positions, then the
// raw float32 bits of keys and values.
func (c *kvCache) marshal() []byte {
	b := make([]byte, 0, 8+8*len(c.k))
	b = binary.LittleEndian.AppendUint32(b, uint32(c.dim))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(c.k)/c.dim))
	for _, xs := range [][]float32{c.k, c.v} {
		for _, x := range xs {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
		}
	}
	return b
}

func unmarshalKV(b []byte) (*kvCache, error) {
	if len(b) < 8 {
		return nil, fmt.Errorf("%w: %d bytes, want a header of 8", errKVFormat, len(b))
	}
	dim := int(binary.LittleEndian.Uint32(b))
	n := int(binary.LittleEndian.Uint32(b[4:]))
	if dim == 0 || len(b) != 8+8*dim*n {
		return nil, fmt.Errorf("%w: %d bytes for dim %d and %d positions", errKVFormat, len(b), dim, n)
	}
	c := &kvCache{dim: dim, k: make([]float32, dim*n), v: make([]float32, dim*n)}
	b = b[8:]
	for _, xs := range [][]float32{c.k, c.v} {
		for i := range xs {
			xs[i] = math.Float32frombits(binary.LittleEndian.Uint32(b))
			b = b[4:]
		}
	}
	return c, nil
}

// promptOf derives a deterministic token prompt from a key, two tokens a
// block, so the reference engine can stand in for a real prompt.
func promptOf(key Key, vocab int) []uint32 {
	p := make([]uint32, 0, 2*len(key))
	for _, h := range key {
		p = append(p, uint32(h%uint64(vocab)), uint32((h>>32)%uint64(vocab)))
	}
	return p
}

// colocated runs prefill and decode in one engine.
func (e refEngine) colocated(prompt []uint32, n int) []uint32 {
	c := e.prefill(prompt)
	return e.decode(c, prompt[len(prompt)-1], n)
}

// split runs prefill on one side, ships the serialised KV cache, and
// decodes on the other.
func (e refEngine) split(prompt []uint32, n int) ([]uint32, int, error) {
	wire := e.prefill(prompt).marshal()
	c, err := unmarshalKV(wire)
	if err != nil {
		return nil, 0, err
	}
	return e.decode(c, prompt[len(prompt)-1], n), len(wire), nil
}

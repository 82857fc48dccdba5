package gateway

import (
	"fmt"
	"slices"

	"github.com/examlops/gateway/internal/refengine"
)

// Disaggregated routes prefill and decode to two independently scaled
// pools: prefill cache-aware over the prefill pool, where a cached
// prefix saves compute, and decode load-aware over the decode pool, where
// the work is memory-bound and the KV cache arrives by transfer. Create one
// with NewDisaggregated. Safe for concurrent use.
type Disaggregated struct {
	// Prefill and Decode are the two pools' gateways.
	Prefill, Decode *Gateway
}

// NewDisaggregated returns a router over a prefill pool and a decode pool.
// opts apply to both gateways, after the default modes (cache-aware for
// prefill, load-aware for decode), so WithMode or WithPolicy in opts
// overrides both.
func NewDisaggregated(prefillPool, decodePool []Replica, opts ...Option) (*Disaggregated, error) {
	if len(prefillPool) == 0 {
		return nil, fmt.Errorf("%w: empty prefill pool", ErrInvalid)
	}
	if len(decodePool) == 0 {
		return nil, fmt.Errorf("%w: empty decode pool", ErrInvalid)
	}
	p, err := New(prefillPool, append([]Option{WithMode(ModeCacheAware)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("%w (prefill pool)", err)
	}
	d, err := New(decodePool, append([]Option{WithMode(ModeLoadAware)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("%w (decode pool)", err)
	}
	return &Disaggregated{Prefill: p, Decode: d}, nil
}

// DisaggDecision is a pair of decisions: where to prefill and where to
// decode. The caller reports each side's completion on its own Decision.
type DisaggDecision struct {
	// Prefill is the decision over the prefill pool, Decode over the
	// decode pool.
	Prefill, Decode Decision
}

// Route picks a prefill replica and a decode replica for key. A pool
// without replicas (all removed) is an error wrapping ErrNoHealthyReplica;
// a Disaggregated missing a pool's gateway, one wrapping ErrInvalid.
func (r *Disaggregated) Route(key Key) (DisaggDecision, error) {
	if r == nil || r.Prefill == nil || r.Decode == nil {
		return DisaggDecision{}, fmt.Errorf("%w: Disaggregated needs both a Prefill and a Decode gateway", ErrInvalid)
	}
	p, err := r.Prefill.Route(key)
	if err != nil {
		return DisaggDecision{}, fmt.Errorf("%w (prefill pool)", err)
	}
	d, err := r.Decode.Route(key)
	if err != nil {
		p.Done(DoneInfo{Err: err})
		return DisaggDecision{}, fmt.Errorf("%w (decode pool)", err)
	}
	return DisaggDecision{Prefill: p, Decode: d}, nil
}

// DisaggResult is what DisaggregatedRoute returns.
type DisaggResult struct {
	// PrefillReplica and DecodeReplica are the chosen replicas' names.
	PrefillReplica, DecodeReplica string
	// IdenticalOutput reports whether the reference engine, run on a prompt
	// derived from the key, generated the same tokens with prefill and
	// decode split (KV cache serialised and handed over) as co-located.
	IdenticalOutput bool
	// Output is the co-located generation (16 tokens); KVBytes the size
	// of the KV transfer.
	Output  []uint32
	KVBytes int
}

// disaggOutputTokens is how many tokens DisaggregatedRoute generates on
// each path to compare them.
const disaggOutputTokens = 16

// DisaggregatedRoute routes key once across a prefill pool and a decode
// pool and checks the split is a scheduling concern only: it runs a small
// deterministic reference engine (one attention head, float32, in
// internal/refengine) both co-located and split, with the prefill's KV
// cache serialised and handed to the decode side, and compares the
// outputs token for token. The HTTP gateway (package httpgw) runs the
// split against real engines; its e2e tests compare their answers.
func DisaggregatedRoute(key Key, prefillPool, decodePool []Replica) (DisaggResult, error) {
	if len(key) == 0 {
		return DisaggResult{}, fmt.Errorf("%w: DisaggregatedRoute needs a key of at least one block", ErrInvalid)
	}
	r, err := NewDisaggregated(prefillPool, decodePool)
	if err != nil {
		return DisaggResult{}, err
	}
	dd, err := r.Route(key)
	if err != nil {
		return DisaggResult{}, err
	}
	defer dd.Prefill.Done(DoneInfo{})
	defer dd.Decode.Done(DoneInfo{})
	m := refengine.Default
	prompt := refengine.PromptOf(key, m.Vocab)
	co := m.Colocated(prompt, disaggOutputTokens)
	sp, n, err := m.Split(prompt, disaggOutputTokens)
	if err != nil {
		return DisaggResult{}, err
	}
	return DisaggResult{
		PrefillReplica:  dd.Prefill.Replica,
		DecodeReplica:   dd.Decode.Replica,
		IdenticalOutput: slices.Equal(co, sp),
		Output:          co,
		KVBytes:         n,
	}, nil
}

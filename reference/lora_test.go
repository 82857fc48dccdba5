package reference

import (
	"slices"
	"testing"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/keys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGIELoRAScore: the lora-affinity-scorer's four scores.
func TestGIELoRAScore(t *testing.T) {
	rep := func(running, waiting []string, max int) *gateway.LoRAState {
		return &gateway.LoRAState{Report: &gateway.AdapterReport{Running: running, Waiting: waiting, MaxLoras: max}}
	}
	for _, tc := range []struct {
		name    string
		adapter string
		l       *gateway.LoRAState
		want    float64
	}{
		{"active", "a", rep([]string{"a", "b"}, nil, 2), 1},
		{"active, also waiting", "a", rep([]string{"a"}, []string{"a"}, 1), 1},
		{"capacity", "a", rep([]string{"b"}, nil, 2), 0.8},
		{"waiting, no capacity", "a", rep([]string{"b"}, []string{"a"}, 2), 0.6},
		// GIE counts running and waiting apart: b in both fills two.
		{"counted twice", "a", rep([]string{"b"}, []string{"b"}, 2), 0},
		{"full", "a", rep([]string{"b", "c"}, nil, 2), 0},
		{"no report", "a", &gateway.LoRAState{}, 0},
		{"base model, capacity", "", rep(nil, nil, 1), 0.8},
		{"base model, full", "", rep([]string{"b"}, nil, 1), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, gieLoRAScore(tc.adapter, tc.l))
		})
	}
}

// TestGIELoRAPrefersActive: all else equal, gie_lora sends a request to
// the endpoint running its adapter; GIE's default profile does not look.
func TestGIELoRAPrefersActive(t *testing.T) {
	cs := cands(3)
	cs[2].LoRA = gateway.LoRAState{Report: &gateway.AdapterReport{Running: []string{"a"}, MaxLoras: 1}}
	for i := range 2 {
		cs[i].LoRA = gateway.LoRAState{Report: &gateway.AdapterReport{Running: []string{"x"}, MaxLoras: 1}}
	}
	counts := map[int]int{}
	p, plain := NewGIELoRA(1), NewGIE(1)
	for i := range 30 {
		k := keyFrom(uint64(i+1), 4)
		r := reqFor(k, cs)
		r.Adapter = "a"
		assert.Equal(t, 2, p.Pick(r, cs))
		counts[plain.Pick(r, cs)]++
	}
	assert.Len(t, counts, 3, "the default profile spreads ties at random: %v", counts)
}

// TestSGLangIgnoresAdapter: SGLang's router matches the prompt's text,
// blind to the adapter: the same prompt under another adapter follows the
// first to its worker (Arrival.BaseKey), though its salted key is new.
func TestSGLangIgnoresAdapter(t *testing.T) {
	p := NewSGLang(1)
	cs := cands(4)
	base := key(40)
	pick := func(id uint64, adapter string) int {
		salted := keys.Salt(slices.Clone(base), adapter)
		p.Arrive(Arrival{ID: id, Time: t0, Tokens: 640, BlockTokens: 16, UserContent: base[0], BaseKey: base})
		r := reqFor(salted, cs)
		r.Adapter = adapter
		return p.Pick(r, cs)
	}
	first := pick(1, "a")
	cs[first].InFlight = 1
	require.Equal(t, first, pick(2, "b"), "the tree matched the unsalted prompt")
	require.Equal(t, 40, p.Predicted(), "and predicts a full hit the engine will not have")
}

// TestCHWBLHashesAdapter: KubeAI hashes the adapter's name before the
// prefix, so one prompt under many adapters lands on many replicas, and
// without an adapter on the same replica as before.
func TestCHWBLHashesAdapter(t *testing.T) {
	p := &CHWBL{}
	cs := cands(8)
	k := key(4)
	pick := func(adapter string) int {
		p.Arrive(Arrival{ID: 1, Time: t0, Tokens: 64, BlockTokens: 16, UserContent: 42})
		r := reqFor(k, cs)
		r.Adapter = adapter
		return p.Pick(r, cs)
	}
	base := pick("")
	require.Equal(t, base, pick(""))
	seen := map[int]bool{}
	for _, a := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		i := pick(a)
		require.Equal(t, i, pick(a), "stable per adapter")
		seen[i] = true
	}
	assert.Greater(t, len(seen), 2, "adapters spread over the ring: %v", seen)
}

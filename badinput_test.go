package gateway

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/examlops/gateway/keys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBadInput: every bad input is an error wrapping the right sentinel,
// whose message starts with "gateway:" and names the offending value, and
// never a panic.
func TestBadInput(t *testing.T) {
	newG := func() *Gateway { return mustNew(t, replicaNames(2)) }
	two := replicaNames(2)
	tests := []struct {
		name string
		call func() error
		want error
		says []string // substrings the message must contain
	}{
		{"New nil replicas", func() error { _, err := New(nil); return err }, ErrInvalid, nil},
		{"New empty replicas", func() error { _, err := New([]Replica{}); return err }, ErrInvalid, nil},
		{"New duplicate names", func() error { _, err := New([]Replica{{Name: "a"}, {Name: "b"}, {Name: "a"}}); return err }, ErrInvalid, []string{`"a"`}},
		{"New empty name", func() error { _, err := New([]Replica{{Name: "a"}, {}}); return err }, ErrInvalid, []string{"Name"}},
		{"New negative CacheBlocks", func() error { _, err := New([]Replica{{Name: "a", CacheBlocks: -1}}); return err }, ErrInvalid, []string{"CacheBlocks", "-1", `"a"`}},
		{"New CacheBlocks too large", func() error { _, err := New([]Replica{{Name: "a", CacheBlocks: MaxCacheBlocks + 1}}); return err }, ErrInvalid, []string{fmt.Sprint(MaxCacheBlocks + 1)}},
		{"AddReplica duplicate", func() error { return newG().AddReplica(Replica{Name: "r1"}) }, ErrInvalid, []string{`"r1"`}},
		{"AddReplica empty name", func() error { return newG().AddReplica(Replica{Address: "http://x"}) }, ErrInvalid, []string{"Name"}},

		{"RemoveReplica unknown", func() error { return newG().RemoveReplica("nope") }, ErrUnknownReplica, []string{`"nope"`}},
		{"SetHealthy unknown", func() error { return newG().SetHealthy("nope", true) }, ErrUnknownReplica, []string{`"nope"`}},
		{"UpdateLoad unknown", func() error { return newG().UpdateLoad("nope", Load{}) }, ErrUnknownReplica, []string{`"nope"`}},
		{"ApplyEvent unknown", func() error {
			return newG().ApplyEvent("nope", CacheEvent{Kind: BlocksStored, Blocks: keys.AppendHashes(nil, []uint64{1})})
		}, ErrUnknownReplica, []string{`"nope"`}},
		{"ApplyEvent bad kind", func() error { return newG().ApplyEvent("r0", CacheEvent{Kind: 7}) }, ErrInvalid, []string{"7", `"r0"`}},
		{"ApplyEvent negative kind", func() error { return newG().ApplyEvent("r0", CacheEvent{Kind: -1}) }, ErrInvalid, []string{"-1"}},

		{"negative QueueDepth", func() error { return newG().UpdateLoad("r0", Load{QueueDepth: -1}) }, ErrInvalid, []string{"QueueDepth", "-1", `"r0"`}},
		{"negative Running", func() error { return newG().UpdateLoad("r0", Load{Running: -2}) }, ErrInvalid, []string{"Running", "-2"}},
		{"NaN KVUtilization", func() error { return newG().UpdateLoad("r0", Load{KVUtilization: math.NaN()}) }, ErrInvalid, []string{"KVUtilization", "NaN"}},
		{"negative KVUtilization", func() error { return newG().UpdateLoad("r0", Load{KVUtilization: -0.1}) }, ErrInvalid, []string{"KVUtilization", "-0.1"}},
		{"KVUtilization over 1", func() error { return newG().UpdateLoad("r0", Load{KVUtilization: 1.5}) }, ErrInvalid, []string{"KVUtilization", "1.5"}},
		{"infinite KVUtilization", func() error { return newG().UpdateLoad("r0", Load{KVUtilization: math.Inf(1)}) }, ErrInvalid, []string{"KVUtilization", "Inf"}},
		{"negative Latency", func() error { return newG().UpdateLoad("r0", Load{Latency: -time.Second}) }, ErrInvalid, []string{"Latency", "-1s"}},

		{"Route nil key", func() error { _, err := newG().Route(nil); return err }, ErrInvalid, []string{"key"}},
		{"Route empty key", func() error { _, err := newG().Route(Key{}); return err }, ErrInvalid, []string{"key"}},
		{"Route empty keys.PrefixKey", func() error { _, err := newG().Route(keys.PrefixKey("", "", "")); return err }, ErrInvalid, nil},
		{"Route short token key", func() error {
			k, err := keys.AppendTokens(nil, []uint32{1, 2, 3}, 16)
			if err != nil {
				return err
			}
			_, err = newG().Route(k)
			return err
		}, ErrInvalid, nil},
		{"PD.Route nil key", func() error { _, err := (&PD{Decode: newG()}).Route(nil, 16, Target{}, Target{}); return err }, ErrInvalid, nil},

		{"negative SLO", func() error { _, err := New(two, WithSLOLatency(-time.Millisecond)); return err }, ErrInvalid, []string{"SLO", "-1ms"}},
		{"negative latency TTL", func() error { _, err := New(two, withLatencyTTL(-time.Second)); return err }, ErrInvalid, []string{"TTL", "-1s"}},
		{"nil policy", func() error { _, err := New(two, WithPolicy(nil)); return err }, ErrInvalid, []string{"policy"}},
		{"nil clock", func() error { _, err := New(two, WithClock(nil)); return err }, ErrInvalid, []string{"clock"}},
		{"bad mode", func() error { _, err := New(two, WithMode(Mode(7))); return err }, ErrInvalid, []string{"mode", "7"}},
		{"bad index mode", func() error { _, err := New(two, withIndex(indexMode(5))); return err }, ErrInvalid, []string{"index", "5"}},
		{"negative weight", func() error {
			_, err := New(two, WithPolicy(&LoadAware{Weights: LoadWeights{Queue: -1, KV: 1}}))
			return err
		}, ErrInvalid, []string{"Queue", "-1"}},
		{"NaN weight", func() error {
			_, err := New(two, WithPolicy(&LoadAware{Weights: LoadWeights{Queue: 1, KV: math.NaN()}}))
			return err
		}, ErrInvalid, []string{"KV", "NaN"}},
		{"infinite weight", func() error {
			_, err := New(two, WithPolicy(&LoadAware{Weights: LoadWeights{Queue: 1, Latency: math.Inf(1)}}))
			return err
		}, ErrInvalid, []string{"Latency", "Inf"}},
		{"unknown mode name", func() error { _, err := parseMode("fastest"); return err }, ErrInvalid, []string{`"fastest"`}},

		{"no healthy replica", func() error {
			g := mustNew(t, []Replica{{Name: "a", Unhealthy: true}})
			_, err := g.Route(keys.PrefixKey("x", "", ""))
			return err
		}, ErrNoHealthyReplica, nil},
		{"PD without decode pool", func() error {
			_, err := (&PD{Prefill: newG()}).Route(keys.PrefixKey("x", "", ""), 16, Target{}, Target{})
			return err
		}, ErrInvalid, []string{"Decode"}},
		{"PD zero tokens per block", func() error {
			_, err := (&PD{Decode: newG()}).Route(keys.PrefixKey("x", "", ""), 0, Target{}, Target{})
			return err
		}, ErrInvalid, []string{"tokensPerBlock 0"}},
		{"no healthy decode replica", func() error {
			pd := PD{Prefill: newG(), Decode: mustNew(t, []Replica{{Name: "d", Unhealthy: true}})}
			_, err := pd.Route(keys.PrefixKey("x", "", ""), 16, Target{}, Target{})
			return err
		}, ErrNoHealthyReplica, []string{"unhealthy"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			require.NotPanics(t, func() { err = tt.call() })
			require.ErrorIs(t, err, tt.want)
			msg := err.Error()
			assert.True(t, strings.HasPrefix(msg, "gateway:"), "message %q must start with gateway:", msg)
			for _, s := range tt.says {
				assert.Contains(t, msg, s)
			}
		})
	}
}

// TestBadInputChangesNothing: a rejected update leaves the gateway as it
// was.
func TestBadInputChangesNothing(t *testing.T) {
	g := mustNew(t, replicaNames(2), WithMode(ModeCacheAware))
	want := Load{QueueDepth: 2, Running: 1, KVUtilization: 0.25, Latency: time.Second}
	require.NoError(t, g.UpdateLoad("r0", want))
	for _, bad := range []Load{{QueueDepth: -1}, {KVUtilization: math.NaN()}, {Latency: -1}, {Running: 3, KVUtilization: 2}} {
		require.Error(t, g.UpdateLoad("r0", bad))
	}
	assert.Equal(t, want, status(t, g, "r0").Load)
	before := g.Replicas()
	require.Error(t, g.AddReplica(Replica{Name: "r0"}))
	require.Error(t, g.AddReplica(Replica{Name: "x", CacheBlocks: -5}))
	require.Error(t, g.RemoveReplica("x"))
	require.Error(t, g.ApplyEvent("r0", CacheEvent{Kind: 9, Blocks: keys.AppendHashes(nil, []uint64{1})}))
	_, err := g.Route(nil)
	require.Error(t, err)
	assert.Equal(t, before, g.Replicas())
	assert.Zero(t, g.Stats().Routed)
}

// TestReplicaLimit: a gateway holds at most MaxReplicas replicas; one more
// is an error, not a panic or a corrupt index.
func TestReplicaLimit(t *testing.T) {
	g := mustNew(t, []Replica{{Name: "r0", CacheBlocks: 1}})
	for i := 1; i < MaxReplicas; i++ {
		require.NoError(t, g.AddReplica(Replica{Name: fmt.Sprintf("r%d", i), CacheBlocks: 1}))
	}
	err := g.AddReplica(Replica{Name: "one-too-many", CacheBlocks: 1})
	require.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), "one-too-many")
	assert.Contains(t, err.Error(), fmt.Sprint(MaxReplicas))
	k := keys.AppendHashes(nil, []uint64{1})
	require.NoError(t, g.ApplyEvent(fmt.Sprintf("r%d", MaxReplicas-1), CacheEvent{Kind: BlocksStored, Blocks: k}))
	d, err := g.Route(k)
	require.NoError(t, err)
	d.Done(DoneInfo{})
}

package fleet

import (
	"testing"

	"github.com/examlops/gateway/config"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// replicaHealthy reports what model's gateway says of replica's health.
func replicaHealthy(t *testing.T, s *Fleet, model, replica string) bool {
	t.Helper()
	for _, r := range s.Snapshot().Models[model].Gateway.Replicas() {
		if r.Name == replica {
			return r.Healthy
		}
	}
	t.Fatalf("no replica %q", replica)
	return false
}

// An ejection the cap refuses leaves the engine in the gateway even when
// an Apply (a reload, or the reapply of a KV-cache size) ran between the
// failure that ejected it and Observe's refusal: the Apply read the
// engine as ejected and marked its replica unhealthy, and the refusal
// must mark it healthy again (no probe would: its Health is not ejected).
func TestRefusedEjectionAfterApplyKeepsReplicaIn(t *testing.T) {
	s, err := New(Options{Registerer: prometheus.NewRegistry(), Logger: quietLogger(), EjectAfter: 1, ReadmitAfter: 1, EjectionTime: -1})
	require.NoError(t, err)
	models := map[string][]config.Replica{testModel: {{Name: "a", Address: "127.0.0.1:1"}, {Name: "b", Address: "127.0.0.1:2"}}}
	require.NoError(t, applyModels(t, s, models))
	a, b := s.Snapshot().Models[testModel].ByName["a"], s.Snapshot().Models[testModel].ByName["b"]
	s.Observe(b, b.Health.Failure(true))
	require.False(t, b.Health.Healthy(), "1 of 2 at 50%")

	ev := a.Health.Failure(true) // a's ejection, not yet observed
	require.NoError(t, applyModels(t, s, models))
	s.Observe(a, ev) // refused: b is out
	require.True(t, a.Health.Healthy(), "the cap kept a in")
	assert.True(t, replicaHealthy(t, s, testModel, "a"), "a's replica is routable, as its health says")

	// Probes pass on a (not ejected: no transition) and readmit b.
	s.Observe(a, a.Health.Success(true))
	s.Observe(b, b.Health.Success(true))
	assert.True(t, replicaHealthy(t, s, testModel, "a"), "a's replica is routable once b is back")
	assert.True(t, replicaHealthy(t, s, testModel, "b"))
}

// A disaggregated model's cap holds for its decode pool too: with two
// prefill and two decode engines, half of its engines may go out, but not
// both decode engines (the model would have nothing to decode on and
// answer 503); both prefill ones may (requests then decode co-located).
func TestEjectionCapDecodePool(t *testing.T) {
	s, err := New(Options{Registerer: prometheus.NewRegistry(), Logger: quietLogger(), EjectAfter: 1, EjectionTime: -1})
	require.NoError(t, err)
	zero := 0
	require.NoError(t, s.Apply(&config.File{Version: config.Version, Models: map[string]config.Model{testModel: {
		Disaggregate: true, PrefillPool: "prefill", DecodePool: "decode", PDMinUncachedTokens: &zero,
		Pools: map[string][]config.Replica{
			"prefill": {{Name: "p0", Address: "127.0.0.1:1"}, {Name: "p1", Address: "127.0.0.1:2"}},
			"decode":  {{Name: "d0", Address: "127.0.0.1:3"}, {Name: "d1", Address: "127.0.0.1:4"}},
		},
	}}}))
	ep := func(name string) *Endpoint { return s.Snapshot().Models[testModel].ByName[name] }
	eject := func(name string) bool {
		e := ep(name)
		s.Observe(e, e.Health.Failure(true))
		return !e.Health.Healthy()
	}
	require.True(t, eject("decode/d0"), "1 of 4 engines, 1 of 2 decode ones")
	assert.False(t, eject("decode/d1"), "the decode pool's last engine stays in")
	require.True(t, eject("prefill/p0"), "2 of 4 engines")
	assert.False(t, eject("prefill/p1"), "3 of 4 engines")
	s.Observe(ep("decode/d0"), ep("decode/d0").Health.Success(true))
	s.Observe(ep("decode/d0"), ep("decode/d0").Health.Success(true))
	require.True(t, ep("decode/d0").Health.Healthy(), "readmitted")
	assert.True(t, eject("prefill/p1"), "2 of 4 engines, both prefill ones")
}

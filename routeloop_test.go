package gateway

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestPropRouteLoopsAgree: Route refreshes its candidates in one of two
// loops, a call-free one for the usual case (no allow filter, no SLO, a
// base-model request) and the general one; an allow that accepts every
// replica takes the general loop and must decide exactly as Route does,
// whatever the loads, health, peer prefill and traffic.
func TestPropRouteLoopsAgree(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 70).Draw(t, "replicas") // beyond 64: multi-word index
		fast, err := New(replicaNames(n), WithMode(ModeCacheAware))
		require.NoError(t, err)
		general, err := New(replicaNames(n), WithMode(ModeCacheAware))
		require.NoError(t, err)
		everyone := func(string) bool { return true }
		var open [][2]Decision
		for step := range rapid.IntRange(1, 60).Draw(t, "steps") {
			switch rapid.IntRange(0, 5).Draw(t, "op") {
			case 0:
				name := fmt.Sprintf("r%d", rapid.IntRange(0, n-1).Draw(t, "replica"))
				l := Load{
					QueueDepth:  rapid.IntRange(0, 8).Draw(t, "queue"),
					Running:     rapid.IntRange(0, 8).Draw(t, "running"),
					PeerPrefill: rapid.IntRange(0, 40).Draw(t, "peer"),
				}
				require.NoError(t, fast.UpdateLoad(name, l))
				require.NoError(t, general.UpdateLoad(name, l))
			case 1:
				name := fmt.Sprintf("r%d", rapid.IntRange(0, n-1).Draw(t, "replica"))
				h := rapid.Bool().Draw(t, "healthy")
				require.NoError(t, fast.SetHealthy(name, h))
				require.NoError(t, general.SetHealthy(name, h))
			case 2:
				if len(open) > 0 {
					i := rapid.IntRange(0, len(open)-1).Draw(t, "done")
					open[i][0].Done(DoneInfo{})
					open[i][1].Done(DoneInfo{})
					open = append(open[:i], open[i+1:]...)
				}
			default:
				key := drawKey(t, "key", 12, 10)
				a, errA := fast.Route(key)
				b, errB := general.RouteWith(key, Target{Allow: everyone})
				require.Equal(t, errA == nil, errB == nil, "step %d: %v / %v", step, errA, errB)
				if errA != nil {
					continue
				}
				require.Equal(t, a.Replica, b.Replica, "step %d", step)
				require.Equal(t, a.Kind, b.Kind, "step %d", step)
				require.Equal(t, a.Fallback, b.Fallback, "step %d", step)
				require.Equal(t, a.Matched, b.Matched, "step %d", step)
				open = append(open, [2]Decision{a, b})
			}
		}
	})
}

package gateway

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/examlops/gateway/keys"
)

// TestPropPDPrefillRetry: the retry of a split's failed prefill, as the
// HTTP gateway plans it (the prefill pool's RouteWith within the plan's
// prefill target, Exclude naming the failed replica, whose decision was
// released), never names the failed replica, names a healthy one within
// the target holding what the index says, and fails with
// ErrNoHealthyReplica exactly when no other prefill replica is eligible
// (then the request decodes co-located).
func TestPropPDPrefillRetry(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		key := keys.AppendHashes(nil, rapid.SliceOfN(rapid.Uint64Range(0, 1000), 1, 16).Draw(t, "key"))
		nd, np := rapid.IntRange(1, 4).Draw(t, "decode"), rapid.IntRange(1, 5).Draw(t, "prefill")
		dg, _ := drawTable(t, "d", nd, key, WithMode(ModeLoadAware))
		pg, pheld := drawTable(t, "p", np, key, WithMode(ModeCacheAware))
		pd := PD{Decode: dg, Prefill: pg}
		pallow, pin := drawAllow(t, "pa", np)
		plan, err := pd.Route(key, 16, Target{}, Target{Allow: pallow})
		if err != nil || !plan.Split {
			return // the first split is TestPropPDPlan's
		}
		defer plan.Decode.Done(DoneInfo{})
		failed := plan.Prefill.Replica
		plan.Prefill.Done(DoneInfo{Err: errors.New("prefill failed")})
		if rapid.Bool().Draw(t, "ejected") { // passive health may have ejected it
			require.NoError(t, pg.SetHealthy(failed, false))
		}
		other := false
		for i, st := range pg.Replicas() {
			other = other || (st.Healthy && pin[i] && st.Name != failed)
		}

		retry, err := pg.RouteWith(key, Target{Allow: pallow, Exclude: failed})
		if !other {
			require.ErrorIs(t, err, ErrNoHealthyReplica)
			return
		}
		require.NoError(t, err)
		defer retry.Done(DoneInfo{})
		require.NotEqual(t, failed, retry.Replica, "the retry avoids the failed replica")
		pi := nameIndex(retry.Replica)
		require.True(t, pg.Replicas()[pi].Healthy && pin[pi], "prefill replica %s is healthy and allowed", retry.Replica)
		require.Equal(t, pheld[pi], retry.Matched)
	})
}

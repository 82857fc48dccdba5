package gateway

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/examlops/gateway/keys"
)

// TestPropPDRetryPrefill: after a split's prefill fails (its decision
// released), the retry keeps the decode decision and the uncached
// estimate, never names the failed prefill replica, and is planned
// exactly when the split rule still holds without it: a prefill replica
// healthy, within the target and not the failed one, and the least queued
// of them no busier than the decode replica with this request's prefill.
// Otherwise the request is decoded co-located, with the reason named.
func TestPropPDRetryPrefill(t *testing.T) {
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
		failed := plan.Prefill.Replica
		plan.Prefill.Done(DoneInfo{Err: errors.New("prefill failed")})
		if rapid.Bool().Draw(t, "ejected") { // passive health may have ejected it
			require.NoError(t, pg.SetHealthy(failed, false))
		}

		best, eligible := 0, false
		for i, st := range pg.Replicas() {
			if !st.Healthy || !pin[i] || st.Name == failed {
				continue
			}
			if q := st.PendingPrefill + st.Load.PeerPrefill; !eligible || q < best {
				best, eligible = q, true
			}
		}
		dst := dg.Replicas()[nameIndex(plan.Decode.Replica)]
		colocated := dst.PendingPrefill + dst.Load.PeerPrefill // this request's included

		retry, err := pd.RetryPrefill(key, plan, Target{Allow: pallow})
		require.NoError(t, err)
		require.Equal(t, plan.Decode, retry.Decode, "the decode replica keeps the request")
		require.Equal(t, plan.Uncached, retry.Uncached)
		switch {
		case !eligible:
			require.False(t, retry.Split)
			require.Equal(t, "prefill_unavailable", retry.Reason)
		case best > colocated:
			require.False(t, retry.Split)
			require.Equal(t, "prefill_busy", retry.Reason)
		default:
			require.True(t, retry.Split, "least queued other prefill %d ≤ decode's %d", best, colocated)
			require.Empty(t, retry.Reason)
			require.NotEqual(t, failed, retry.Prefill.Replica, "the retry avoids the failed replica")
			pi := nameIndex(retry.Prefill.Replica)
			require.True(t, pg.Replicas()[pi].Healthy && pin[pi], "prefill replica %s is healthy and allowed", retry.Prefill.Replica)
			require.Equal(t, pheld[pi], retry.Prefill.Matched)
			retry.Prefill.Done(DoneInfo{})
		}
		if !retry.Split {
			require.Equal(t, Decision{}, retry.Prefill)
		}
		plan.Decode.Done(DoneInfo{})
	})
}

// A plan that was not split, or a PD without a decode pool, has no
// prefill to retry: ErrInvalid, naming the plan's reason.
func TestPDRetryPrefillInvalid(t *testing.T) {
	g := mustNew(t, replicaNames(2), WithMode(ModeLoadAware))
	p := mustNew(t, replicaNames(2), WithMode(ModeCacheAware))
	pd := PD{Decode: g, Prefill: p, MinUncached: 1 << 20}
	key := keys.PrefixKey("You are a helpful assistant.", "s", "")
	plan, err := pd.Route(key, 16, Target{}, Target{})
	require.NoError(t, err)
	require.False(t, plan.Split)
	_, err = pd.RetryPrefill(key, plan, Target{})
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, `reason "cached"`)
	_, err = (&PD{}).RetryPrefill(key, PDDecision{Split: true}, Target{})
	require.ErrorIs(t, err, ErrInvalid)
	plan.Decode.Done(DoneInfo{})

	// Only one prefill replica: nothing to retry on.
	one := PD{Decode: g, Prefill: mustNew(t, replicaNames(1), WithMode(ModeCacheAware))}
	plan, err = one.Route(key, 16, Target{}, Target{})
	require.NoError(t, err)
	require.True(t, plan.Split)
	plan.Prefill.Done(DoneInfo{Err: errors.New("failed")})
	retry, err := one.RetryPrefill(key, plan, Target{})
	require.NoError(t, err)
	require.False(t, retry.Split)
	require.Equal(t, "prefill_unavailable", retry.Reason)
	plan.Decode.Done(DoneInfo{})
}

// TestPDRetryPrefillAllocs: planning the retry does not allocate.
func TestPDRetryPrefillAllocs(t *testing.T) {
	g := mustNew(t, replicaNames(8), WithMode(ModeLoadAware))
	p := mustNew(t, replicaNames(4), WithMode(ModeCacheAware))
	pd := PD{Decode: g, Prefill: p}
	key := keys.PrefixKey("You are a helpful assistant.", "s", "")
	allow := func(name string) bool { return name != "r3" }
	require.Zero(t, testing.AllocsPerRun(100, func() {
		plan, err := pd.Route(key, 16, Target{}, Target{Allow: allow})
		if err != nil || !plan.Split {
			panic("no split")
		}
		plan.Prefill.Done(DoneInfo{Err: errFailedForTest})
		retry, err := pd.RetryPrefill(key, plan, Target{Allow: allow})
		if err != nil || !retry.Split || retry.Prefill.Replica == plan.Prefill.Replica {
			panic("no retry")
		}
		retry.Prefill.Done(DoneInfo{})
		plan.Decode.Done(DoneInfo{})
	}))
}

var errFailedForTest = errors.New("failed")

package gateway

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway/keys"
)

// failingPolicy picks as CacheAware does and records the Demand it was
// handed, or, when fail is set, returns an index past the candidates.
type failingPolicy struct {
	CacheAware
	fail   bool
	demand float64
}

func (p *failingPolicy) Pick(req *Request, cands []Candidate) int {
	if p.fail {
		return len(cands)
	}
	p.demand = req.Demand
	return p.CacheAware.Pick(req, cands)
}

// TestInvalidPickLeavesDemandUntouched: a Route whose policy returns an
// index out of range is ErrInvalid and leaves the prefix demand as it
// was: a gateway whose every request is preceded by such a failed call
// hands its policy the same Demand, and makes the same decisions, as one
// that never saw them, across more than two demand windows (so failed
// calls land where a halving is due too). Found in review: the demand was
// counted before the pick was checked.
func TestInvalidPickLeavesDemandUntouched(t *testing.T) {
	clean, failing := &failingPolicy{}, &failingPolicy{}
	gc := mustNew(t, replicaNames(4), WithPolicy(clean))
	gf := mustNew(t, replicaNames(4), WithPolicy(failing))
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 2*demandWindow + 100 {
		// a few hot prefixes, each request with its own tail
		key := keys.AppendHashes(nil, []uint64{uint64(rng.IntN(4)) + 1, uint64(rng.IntN(3)) + 10, uint64(i) + 100})

		failing.fail = true
		_, err := gf.Route(key)
		require.ErrorIs(t, err, ErrInvalid, "request %d", i)
		failing.fail = false

		dc, err := gc.Route(key)
		require.NoError(t, err)
		df, err := gf.Route(key)
		require.NoError(t, err)
		require.Equal(t, clean.demand, failing.demand, "request %d: the Demand handed to the policy", i)
		require.Equal(t, [5]any{dc.Replica, dc.Kind, dc.Matched, dc.Blocks, dc.Fallback}, [5]any{df.Replica, df.Kind, df.Matched, df.Blocks, df.Fallback}, "request %d", i)
		dc.Done(DoneInfo{})
		df.Done(DoneInfo{})
	}
	require.Positive(t, clean.demand, "the stream has hot prefixes")
}

package gateway

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/examlops/gateway/keys"
)

// TestPropLoRAState: a replica's LoRAState, after any sequence of engine
// reports, routes for adapters and their Done, is what its documentation
// says, computed by an oracle from the same history: Running and Waiting
// from the last report, Routed the adapter's requests not done, Active the
// distinct adapters reported running or waiting or with requests not done,
// Loaded running, routed or among the last max(MaxLoras, 1) adapters
// routed there or reported running, and Empty MaxLoras less the most of
// Active and those last used.
func TestPropLoRAState(t *testing.T) {
	names := []string{"a", "b", "c", "d", "e"}
	rapid.Check(t, func(t *rapid.T) {
		g, err := New(replicaNames(1), WithMode(ModeCacheAware))
		require.NoError(t, err)
		rs := g.snap.Load().list[0]
		var rep *AdapterReport
		routed := map[string]int{}
		var recent []string // the oracle's last used adapters, most recent first
		slots := func() int {
			if rep == nil {
				return 0
			}
			return rep.MaxLoras
		}
		use := func(name string) {
			recent = slices.DeleteFunc(recent, func(s string) bool { return s == name })
			recent = slices.Insert(recent, 0, name)
		}
		trim := func() { recent = recent[:min(len(recent), max(slots(), 1))] }
		var live []Decision
		for range rapid.IntRange(1, 30).Draw(t, "ops") {
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0: // an engine report
				r := AdapterReport{MaxLoras: rapid.IntRange(0, 4).Draw(t, "max")}
				for _, n := range names {
					switch rapid.IntRange(0, 3).Draw(t, "in") {
					case 1:
						r.Running = append(r.Running, n)
					case 2:
						r.Waiting = append(r.Waiting, n)
					}
				}
				require.NoError(t, g.UpdateAdapters("r0", r))
				rep = r.normalized()
				for _, n := range rep.Running {
					use(n)
				}
				trim()
			case 1: // a request for an adapter
				n := rapid.SampledFrom(names).Draw(t, "adapter")
				d, err := g.RouteWith(keys.Salt(keys.AppendHashes(nil, []uint64{1}), n), Target{Adapter: n})
				require.NoError(t, err)
				live = append(live, d)
				routed[n]++
				use(n)
				trim()
			case 2: // one finishes
				if len(live) == 0 {
					continue
				}
				i := rapid.IntRange(0, len(live)-1).Draw(t, "done")
				live[i].Done(DoneInfo{})
				routed[live[i].adapter]--
				live = slices.Delete(live, i, i+1)
			}
			active := map[string]bool{}
			if rep != nil {
				for _, n := range slices.Concat(rep.Running, rep.Waiting) {
					active[n] = true
				}
			}
			for n, c := range routed {
				if c > 0 {
					active[n] = true
				}
			}
			for _, n := range names {
				got := rs.lora.state(n)
				var want LoRAState
				if rep != nil {
					want.Report, want.MaxLoras = got.Report, rep.MaxLoras
					require.Equal(t, rep, got.Report)
					want.Running = slices.Contains(rep.Running, n)
					want.Waiting = slices.Contains(rep.Waiting, n)
				}
				want.Routed = routed[n]
				want.Active = len(active)
				want.Loaded = want.Running || want.Routed > 0 || slices.Contains(recent, n)
				want.Empty = max(want.MaxLoras-max(len(active), len(recent)), 0)
				require.Equal(t, want, got, "adapter %s; report %+v, routed %v, last used %v", n, rep, routed, recent)
			}
		}
	})
}

package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// oneRequest is a trace of one request of in prompt tokens (blocks of 512)
// and out output tokens, arriving at 0.
func oneRequest(t testing.TB, in, out int) Workload {
	t.Helper()
	ids := make([]string, blocksOf(in, 512))
	for i := range ids {
		ids[i] = fmt.Sprint(i + 1)
	}
	line := fmt.Sprintf(`{"timestamp": 0, "input_length": %d, "output_length": %d, "hash_ids": [%s]}`, in, out, strings.Join(ids, ","))
	w, err := TraceBytes("one", []byte(line+"\n"), TraceOptions{})
	require.NoError(t, err)
	return w
}

// runOne runs cfg with round-robin only and returns its result.
func runOne(t testing.TB, cfg Config) Result {
	t.Helper()
	if cfg.Policies == nil {
		cfg.Policies = []Policy{{Name: "round_robin"}}
	}
	cfg.Seed = orDefault(cfg.Seed, 1)
	rep, err := Run(cfg)
	require.NoError(t, err)
	return rep.Results[0]
}

// TestSpeedConfigErrors: bad speeds and speed changes are invalid configs
// naming the field and the value.
func TestSpeedConfigErrors(t *testing.T) {
	tests := []struct {
		name    string
		speeds  []float64
		changes []SpeedChange
		want    []string
	}{
		{"zero speed", []float64{1, 0}, nil, []string{"ReplicaSpeeds[1] 0"}},
		{"negative speed", []float64{-1}, nil, []string{"ReplicaSpeeds[0] -1"}},
		{"NaN speed", []float64{math.NaN()}, nil, []string{"ReplicaSpeeds[0] NaN"}},
		{"infinite speed", []float64{math.Inf(1)}, nil, []string{"ReplicaSpeeds[0] +Inf"}},
		{"too slow", []float64{1e-4}, nil, []string{"ReplicaSpeeds[0] 0.0001", "0.001..1000"}},
		{"too fast", []float64{2000}, nil, []string{"ReplicaSpeeds[0] 2000"}},
		{"more speeds than replicas", []float64{1, 1, 1}, nil, []string{"ReplicaSpeeds has 3 values for 2 replicas"}},
		{"change of replica -1", nil, []SpeedChange{{Replica: -1, Speed: 1}}, []string{"SpeedChanges[0]", "Replica -1", "0..1"}},
		{"change of a replica past the last", nil, []SpeedChange{{Speed: 1}, {Replica: 2, Speed: 1}}, []string{"SpeedChanges[1]", "Replica 2", "0..1"}},
		{"change at a negative time", nil, []SpeedChange{{At: -time.Second, Speed: 1}}, []string{"SpeedChanges[0]", "At -1s"}},
		{"change past a year", nil, []SpeedChange{{At: 366 * 24 * time.Hour, Speed: 1}}, []string{"At 8784h0m0s"}},
		{"change to speed 0", nil, []SpeedChange{{Speed: 0}}, []string{"SpeedChanges[0]: Speed 0"}},
		{"change to NaN", nil, []SpeedChange{{Speed: math.NaN()}}, []string{"SpeedChanges[0]: Speed NaN"}},
		{"too many changes", nil, make([]SpeedChange, MaxSpeedChanges+1), []string{"SpeedChanges has 4097 entries, at most 4096"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Run(Config{Workload: mustShared(t), Replicas: 2, ReplicaSpeeds: tt.speeds, SpeedChanges: tt.changes})
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.True(t, strings.HasPrefix(err.Error(), "gateway:"), err.Error())
			for _, s := range tt.want {
				assert.Contains(t, err.Error(), s)
			}
		})
	}
	t.Run("the bounds are accepted", func(t *testing.T) {
		_, err := Run(Config{Workload: mustShared(t), Replicas: 2, ReplicaSpeeds: []float64{MinSpeed, MaxSpeed},
			SpeedChanges: []SpeedChange{{Replica: 1, At: maxSpeedAt, Speed: MinSpeed}}, Policies: []Policy{{Name: "round_robin"}}})
		require.NoError(t, err)
	})
}

func TestParseSpeedChange(t *testing.T) {
	tests := []struct {
		in   string
		want SpeedChange
		err  string
	}{
		{"0@30s=0.5", SpeedChange{Replica: 0, At: 30 * time.Second, Speed: 0.5}, ""},
		{" 3 @ 1m30s = 2 ", SpeedChange{Replica: 3, At: 90 * time.Second, Speed: 2}, ""},
		{"1@0s=1", SpeedChange{Replica: 1, Speed: 1}, ""},
		{"0@30s", SpeedChange{}, "want REPLICA@AT=SPEED"},
		{"0=0.5", SpeedChange{}, "want REPLICA@AT=SPEED"},
		{"x@30s=0.5", SpeedChange{}, `replica "x" is not a number`},
		{"0@30=0.5", SpeedChange{}, `time "30" is not a duration`},
		{"0@30s=half", SpeedChange{}, `speed "half" is not a number`},
		{"-1@30s=0.5", SpeedChange{}, "Replica -1, want 0 or more"},
		{"0@-1s=0.5", SpeedChange{}, "At -1s"},
		{"0@30s=0", SpeedChange{}, "Speed 0, want a finite multiplier"},
		{"0@30s=NaN", SpeedChange{}, "Speed NaN"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSpeedChange(tt.in)
			if tt.err != "" {
				require.ErrorIs(t, err, ErrInvalidConfig)
				assert.Contains(t, err.Error(), tt.err)
				assert.Contains(t, err.Error(), fmt.Sprintf("%q", tt.in))
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			back, err := ParseSpeedChange(got.String())
			require.NoError(t, err)
			assert.Equal(t, got, back)
		})
	}
}

func FuzzParseSpeedChange(f *testing.F) {
	for _, s := range []string{"0@30s=0.5", "12@1h2m=1e-3", "@=", "0@30s=NaN", "1@-0s=+Inf", "99999999999999999999@1s=1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseSpeedChange(s)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidConfig)
			return
		}
		require.NoError(t, c.check(-1, "x"))
		back, err := ParseSpeedChange(c.String())
		require.NoError(t, err)
		require.Equal(t, c, back)
	})
}

// TestHalfSpeedLoneRequest: a request alone on a replica at 0.5× takes
// twice as long, prefill and decode, as on one at 1× (each step's time is
// rounded to the nanosecond once), and at 1× exactly Preset.LoneTTFT.
func TestHalfSpeedLoneRequest(t *testing.T) {
	for _, in := range []int{2048, 20000} { // one chunk; three chunks
		t.Run(fmt.Sprint(in), func(t *testing.T) {
			w := oneRequest(t, in, 100)
			full := runOne(t, Config{Workload: w, Replicas: 1})
			half := runOne(t, Config{Workload: w, Replicas: 1, ReplicaSpeeds: []float64{0.5}})
			require.Equal(t, 1, full.Completed)
			require.Equal(t, 1, half.Completed)
			steps := float64(blocksOf(in, DefaultPreset().MaxBatchTokens))
			assert.Equal(t, DefaultPreset().LoneTTFT(0, in).Seconds(), full.TTFT.Mean)
			assert.InDelta(t, 2*full.TTFT.Mean, half.TTFT.Mean, steps*1e-9, "TTFT %v at 1×, %v at 0.5×", full.TTFT.Mean, half.TTFT.Mean)
			dFull, dHalf := full.E2E.Mean-full.TTFT.Mean, half.E2E.Mean-half.TTFT.Mean
			assert.InDelta(t, 2*dFull, dHalf, 2e-9, "decode %v at 1×, %v at 0.5×", dFull, dHalf)
			// And 2× faster halves it the other way.
			fast := runOne(t, Config{Workload: w, Replicas: 1, ReplicaSpeeds: []float64{2}})
			assert.InDelta(t, full.TTFT.Mean/2, fast.TTFT.Mean, steps*1e-9)
		})
	}
}

// TestSpeedChange: a change applies to the steps planned from its time on;
// the step in progress keeps its end.
func TestSpeedChange(t *testing.T) {
	w := oneRequest(t, 2048, 400)
	base := runOne(t, Config{Workload: w, Replicas: 1})
	ttft, e2e := base.TTFT.Mean, base.E2E.Mean
	at := func(s float64) time.Duration { return time.Duration(s * 1e9) }
	run := func(c ...SpeedChange) Result { return runOne(t, Config{Workload: w, Replicas: 1, SpeedChanges: c}) }

	t.Run("at 0 is the same as starting at that speed", func(t *testing.T) {
		got := run(SpeedChange{Speed: 0.5})
		want := runOne(t, Config{Workload: w, Replicas: 1, ReplicaSpeeds: []float64{0.5}})
		assert.Equal(t, want.TTFT, got.TTFT)
		assert.Equal(t, want.E2E, got.E2E)
	})
	t.Run("after the end changes nothing", func(t *testing.T) {
		got := run(SpeedChange{At: at(e2e + 1), Speed: 0.5})
		assert.Equal(t, base.TTFT, got.TTFT)
		assert.Equal(t, base.E2E, got.E2E)
	})
	t.Run("to the same speed mid-decode changes nothing but rounding", func(t *testing.T) {
		got := run(SpeedChange{At: at((ttft + e2e) / 2), Speed: 1})
		assert.Equal(t, base.TTFT, got.TTFT)
		assert.InDelta(t, e2e, got.E2E.Mean, 1e-6)
	})
	t.Run("mid-prefill: the step in progress keeps its end", func(t *testing.T) {
		got := run(SpeedChange{At: at(ttft / 2), Speed: 0.5})
		assert.Equal(t, base.TTFT, got.TTFT, "the prefill step was planned at 1×")
		assert.InDelta(t, 2*(e2e-ttft), got.E2E.Mean-ttft, 1e-6, "every decode step at 0.5×")
	})
	t.Run("mid-decode: the rest of the decode at the new speed", func(t *testing.T) {
		mid := (ttft + e2e) / 2
		got := run(SpeedChange{At: at(mid), Speed: 0.5})
		assert.Equal(t, base.TTFT, got.TTFT)
		// The decode step in progress at mid ends at 1×, the rest take
		// twice as long: within one step (about 6.6 ms) of that.
		want := mid + 2*(e2e-mid)
		assert.InDelta(t, want, got.E2E.Mean, 0.01, "E2E %v, want about %v", got.E2E.Mean, want)
		assert.Greater(t, got.E2E.Mean, e2e+0.9*(e2e-mid))
	})
	t.Run("changes at the same time apply in the order listed", func(t *testing.T) {
		got := run(SpeedChange{Speed: 2}, SpeedChange{Speed: 0.5})
		want := runOne(t, Config{Workload: w, Replicas: 1, ReplicaSpeeds: []float64{0.5}})
		assert.Equal(t, want.E2E, got.E2E)
	})
}

// mixedCfg is a mixed pool on a small shared-prefix workload with classes
// that carry TPOT objectives.
func mixedCfg(t testing.TB, policies ...string) Config {
	t.Helper()
	w := smallTenants(t, 1500, 60, TenantsConfig{Classes: DefaultSLOClasses(), VaryOutput: true})
	var pols []Policy
	for _, n := range policies {
		p, err := PolicyByName(n)
		require.NoError(t, err)
		pols = append(pols, p)
	}
	return Config{Workload: w, Replicas: 4, ReplicaSpeeds: []float64{1, 0.5}, Seed: 3, Policies: pols,
		SpeedChanges: []SpeedChange{{Replica: 0, At: 10 * time.Second, Speed: 0.25}}}
}

// TestMixedPoolReport: the report states the speeds; round-robin gives
// every replica the same share, cache-aware sends more to the fast
// replicas; the same Config gives the same report.
func TestMixedPoolReport(t *testing.T) {
	cfg := mixedCfg(t, "round_robin", "cache_aware")
	cfg.SpeedChanges = nil
	rep, err := Run(cfg)
	require.NoError(t, err)
	assert.Equal(t, []float64{1, 0.5}, rep.ReplicaSpeeds)
	rr, _ := rep.Result("round_robin")
	ca, _ := rep.Result("cache_aware")
	require.Len(t, rr.BySpeed, 2)
	require.Len(t, ca.BySpeed, 2)
	for _, s := range rr.BySpeed {
		assert.Equal(t, 2, s.Replicas)
		assert.InDelta(t, 1, s.PerReplica, 0.01, "round-robin: %+v", s)
	}
	fast, slow := ca.BySpeed[0], ca.BySpeed[1]
	assert.Equal(t, "1", fast.Speed)
	assert.Equal(t, "0.5", slow.Speed)
	assert.Greater(t, fast.PerReplica, 1.1, "cache-aware: %+v", ca.BySpeed)
	assert.Less(t, slow.PerReplica, 0.9, "cache-aware: %+v", ca.BySpeed)
	assert.InDelta(t, 1, fast.Requests+slow.Requests, 1e-9)
	assert.InDelta(t, 1, fast.Prefill+slow.Prefill, 1e-9)

	var b strings.Builder
	require.NoError(t, rep.WriteTable(&b))
	assert.Contains(t, b.String(), "compute speeds 1, 0.5 × the preset's, cycled over the replicas")
	assert.Contains(t, b.String(), "work by replica speed")
	assert.Contains(t, b.String(), "cache_aware: speed 1 ×2: requests ")

	cfg.SpeedChanges = []SpeedChange{{Replica: 0, At: 10 * time.Second, Speed: 0.25}}
	a, err := Run(cfg)
	require.NoError(t, err)
	again, err := Run(cfg)
	require.NoError(t, err)
	var ja, jb bytes.Buffer
	require.NoError(t, a.WriteJSON(&ja))
	require.NoError(t, again.WriteJSON(&jb))
	assert.Equal(t, ja.String(), jb.String(), "deterministic")
	assert.Contains(t, ja.String(), `"speed_changes": [`)
	var back Report
	require.NoError(t, json.Unmarshal(ja.Bytes(), &back))
	assert.Equal(t, cfg.SpeedChanges, back.SpeedChanges)
	assert.Equal(t, a.Results[1].BySpeed, back.Results[1].BySpeed)
	ca, _ = a.Result("cache_aware")
	require.Len(t, ca.BySpeed, 3)
	assert.Equal(t, "1→0.25@10s", ca.BySpeed[0].Speed)
	// After r0 slows to 0.25×, cache-aware sends it less than before,
	// round-robin the same.
	require.NotNil(t, ca.BySpeed[0].AfterChange)
	assert.Less(t, *ca.BySpeed[0].AfterChange, 0.6, "%+v", ca.BySpeed[0])
	assert.Less(t, *ca.BySpeed[0].AfterChange, ca.BySpeed[0].PerReplica)
	assert.Nil(t, ca.BySpeed[1].AfterChange)
	rr, _ = a.Result("round_robin")
	require.NotNil(t, rr.BySpeed[0].AfterChange)
	assert.InDelta(t, 1, *rr.BySpeed[0].AfterChange, 0.01)
	// In windows of 100 requests after the change: round-robin gives each
	// of the 4 replicas 25 of each; cache-aware gives r0 less on average.
	require.NotEmpty(t, rr.BySpeed[0].Windows)
	require.Len(t, ca.BySpeed[0].Windows, len(rr.BySpeed[0].Windows))
	assert.LessOrEqual(t, len(rr.BySpeed[0].Windows), maxWindows)
	mean := 0.0
	for i, v := range rr.BySpeed[0].Windows {
		assert.InDelta(t, 1, v, 1e-9, "window %d", i)
		mean += ca.BySpeed[0].Windows[i] / float64(len(rr.BySpeed[0].Windows))
	}
	assert.Less(t, mean, 0.6, "cache-aware: %v", ca.BySpeed[0].Windows)
	assert.Nil(t, rr.BySpeed[1].Windows)
	b.Reset()
	require.NoError(t, a.WriteTable(&b))
	assert.Contains(t, b.String(), "; r0 at 10s → 0.25×")
}

// TestSpeedsOfOneChangeNothing: speeds all 1 give the report of no speeds,
// byte for byte, in text and JSON.
func TestSpeedsOfOneChangeNothing(t *testing.T) {
	cfg := mixedCfg(t, "round_robin", "cache_aware")
	cfg.SpeedChanges = nil
	out := func(speeds []float64) (string, string) {
		c := cfg
		c.ReplicaSpeeds = speeds
		rep, err := Run(c)
		require.NoError(t, err)
		var tb, jb bytes.Buffer
		require.NoError(t, rep.WriteTable(&tb))
		require.NoError(t, rep.WriteJSON(&jb))
		return tb.String(), jb.String()
	}
	t0, j0 := out(nil)
	t1, j1 := out([]float64{1, 1, 1, 1})
	assert.Equal(t, t0, t1)
	assert.Equal(t, j0, j1)
	assert.NotContains(t, t0, "speed")
	assert.NotContains(t, j0, "speed")
}

// TestSpeedProperties: on random mixed pools with speed changes, every
// request has an outcome, the work by speed adds up, the objectives are
// consistent, and the run is deterministic.
func TestSpeedProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(1, 4).Draw(rt, "replicas")
		speeds := rapid.SliceOfN(rapid.Float64Range(0.2, 4), 0, n).Draw(rt, "speeds")
		var changes []SpeedChange
		for i := range rapid.IntRange(0, 3).Draw(rt, "changes") {
			changes = append(changes, SpeedChange{
				Replica: rapid.IntRange(0, n-1).Draw(rt, fmt.Sprint("replica", i)),
				At:      time.Duration(rapid.IntRange(0, 3000).Draw(rt, fmt.Sprint("at_ms", i))) * time.Millisecond,
				Speed:   rapid.Float64Range(0.2, 4).Draw(rt, fmt.Sprint("speed", i)),
			})
		}
		w := smallTenants(t, rapid.IntRange(10, 120).Draw(rt, "requests"), rapid.Float64Range(5, 200).Draw(rt, "rate"),
			TenantsConfig{Classes: DefaultSLOClasses(), VaryOutput: rapid.Bool().Draw(rt, "vary")})
		cfg := Config{Workload: w, Replicas: n, ReplicaSpeeds: speeds, SpeedChanges: changes, Preset: smallPreset(), Seed: 5,
			Policies: []Policy{{Name: "round_robin"}, cacheAware}}
		rep, err := Run(cfg)
		require.NoError(t, err)
		again, err := Run(cfg)
		require.NoError(t, err)
		require.Equal(t, rep.Results, again.Results)
		for _, r := range rep.Results {
			require.Equal(t, r.Requests, r.Completed+r.Dropped+r.Failed, r.Policy)
			if cfg.mixedSpeeds() {
				sum := 0.0
				for _, s := range r.BySpeed {
					sum += s.Requests
				}
				require.InDelta(t, 1, sum, 1e-9)
			} else {
				require.Nil(t, r.BySpeed)
			}
			checkObjectives(t, r)
		}
	})
}

// checkObjectives: for every class, both objectives are met no more often
// than either and no less than their overlap allows.
func checkObjectives(t require.TestingT, r Result) {
	for _, g := range r.Classes {
		o := g.Objectives
		require.NotNil(t, o, g.Name)
		require.Equal(t, g.SLOAttainment, o.TTFT)
		require.LessOrEqual(t, o.Both, min(o.TTFT, o.TPOT)+1e-12)
		require.GreaterOrEqual(t, o.Both, o.TTFT+o.TPOT-1-1e-12)
	}
}

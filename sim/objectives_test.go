package sim

import (
	"bytes"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/examlops/gateway"
	fronts "github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/reference"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTPOTMeasured: a lone request's TPOT is (last token − first token) /
// (output tokens − 1), and it meets an objective just above it and misses
// one just below.
func TestTPOTMeasured(t *testing.T) {
	run := func(k Class) Result {
		w, err := Tenants(TenantsConfig{Base: oneRequest(t, 2048, 100), Classes: []Class{k}})
		require.NoError(t, err)
		return runOne(t, Config{Workload: w, Replicas: 1})
	}
	loose := run(Class{Name: "c", TPOT: time.Hour, Share: 1})
	require.Len(t, loose.Classes, 1)
	o := loose.Classes[0].Objectives
	require.NotNil(t, o)
	tpot := (loose.E2E.Mean - loose.TTFT.Mean) / 99
	assert.InDelta(t, tpot, o.TPOTLatency.Mean, 1e-12)
	assert.Equal(t, Objectives{TTFT: 1, TPOT: 1, Both: 1, Goodput: o.Goodput, TPOTLatency: o.TPOTLatency}, *o)
	assert.InDelta(t, 1/loose.Duration, o.Goodput, 1e-9)

	ns := tpot * 1e9
	above := run(Class{Name: "c", TPOT: time.Duration(math.Ceil(ns)) + 1, Share: 1}).Classes[0].Objectives
	below := run(Class{Name: "c", TPOT: time.Duration(math.Floor(ns)) - 1, Share: 1}).Classes[0].Objectives
	assert.Equal(t, 1.0, above.TPOT)
	assert.Equal(t, 0.0, below.TPOT)
	assert.Equal(t, 0.0, below.Both)
	assert.Equal(t, 0.0, below.Goodput)

	// A TTFT objective missed: TPOT met, both missed.
	late := run(Class{Name: "c", SLO: time.Nanosecond, TPOT: time.Hour, Share: 1}).Classes[0].Objectives
	assert.Equal(t, Objectives{TTFT: 0, TPOT: 1, Both: 0, TPOTLatency: late.TPOTLatency}, *late)

	// One output token: no TPOT to measure, the objective is met.
	w, err := Tenants(TenantsConfig{Base: oneRequest(t, 2048, 1), Classes: []Class{{Name: "c", TPOT: time.Nanosecond, Share: 1}}})
	require.NoError(t, err)
	one := runOne(t, Config{Workload: w, Replicas: 1}).Classes[0].Objectives
	assert.Equal(t, 1.0, one.TPOT)
	assert.Equal(t, Latency{}, one.TPOTLatency)
}

// TestObjectivesAddUp: splitting one class in two with the same
// objectives splits its requests and its met objectives: the two classes'
// counts add up to the one's, as routing does not depend on the class.
func TestObjectivesAddUp(t *testing.T) {
	base, err := SharedPrefix(SharedPrefixConfig{Requests: 1500, Rate: 60, Groups: 8, SystemTokens: 512, QuestionTokens: 128, OutputTokens: 64})
	require.NoError(t, err)
	obj := Class{SLO: 150 * time.Millisecond, TPOT: 9 * time.Millisecond, Share: 1}
	classes := func(names ...string) Workload {
		var ks []Class
		for _, n := range names {
			k := obj
			k.Name = n
			ks = append(ks, k)
		}
		w, err := Tenants(TenantsConfig{Base: base, Classes: ks})
		require.NoError(t, err)
		return w
	}
	cfg := Config{Replicas: 4, ReplicaSpeeds: []float64{1, 0.5}, Seed: 2, Policies: []Policy{cacheAware, {Name: "round_robin"}}}
	cfg.Workload = classes("all")
	one, err := Run(cfg)
	require.NoError(t, err)
	cfg.Workload = classes("a", "b")
	two, err := Run(cfg)
	require.NoError(t, err)
	for i, r := range one.Results {
		all := r.Classes[0]
		a, b := two.Results[i].Classes[0], two.Results[i].Classes[1]
		count := func(g Group, f float64) float64 { return math.Round(f * float64(g.Requests)) }
		require.Equal(t, all.Requests, a.Requests+b.Requests)
		for _, f := range []func(*Objectives) float64{
			func(o *Objectives) float64 { return o.TTFT },
			func(o *Objectives) float64 { return o.TPOT },
			func(o *Objectives) float64 { return o.Both },
		} {
			assert.Equal(t, count(all, f(all.Objectives)), count(a, f(a.Objectives))+count(b, f(b.Objectives)), r.Policy)
		}
		assert.InDelta(t, all.Objectives.Goodput, a.Objectives.Goodput+b.Objectives.Goodput, 1e-9)
		// The objectives must be neither all met nor all missed for the
		// test to say anything.
		assert.Greater(t, all.Objectives.TPOT, 0.05, r.Policy)
		assert.Less(t, all.Objectives.Both, 0.95, r.Policy)
		checkObjectives(t, r)
	}
}

// TestObjectivesOnlyWithTPOT: classes without a TPOT objective (the
// interactive-batch workload's) report as before, without objectives.
func TestObjectivesOnlyWithTPOT(t *testing.T) {
	w := smallTenants(t, 300, 60, TenantsConfig{Classes: []Class{InteractiveClass, BatchClass}})
	rep, err := Run(Config{Workload: w, Replicas: 2, Policies: []Policy{cacheAware}})
	require.NoError(t, err)
	for _, g := range rep.Results[0].Classes {
		assert.Nil(t, g.Objectives, g.Name)
	}
	var tb, jb bytes.Buffer
	require.NoError(t, rep.WriteTable(&tb))
	require.NoError(t, rep.WriteJSON(&jb))
	assert.NotContains(t, tb.String(), "objectives")
	assert.NotContains(t, tb.String(), "TPOT")
	assert.NotContains(t, jb.String(), "objectives")

	w = smallTenants(t, 300, 60, TenantsConfig{Classes: DefaultSLOClasses()})
	rep, err = Run(Config{Workload: w, Replicas: 2, Policies: []Policy{cacheAware}})
	require.NoError(t, err)
	tb.Reset()
	require.NoError(t, rep.WriteTable(&tb))
	assert.Contains(t, tb.String(), "per class objectives")
	assert.Contains(t, rep.Workload, "interactive (priority 2, SLO 250ms, TPOT 25ms, share 1)")
}

func TestParseClasses(t *testing.T) {
	tests := []struct {
		in   string
		want []Class
		err  string
	}{
		{"interactive:ttft=500ms,tpot=50ms;batch:ttft=10s,tpot=250ms,share=2,priority=-1", []Class{
			{Name: "interactive", SLO: 500 * time.Millisecond, TPOT: 50 * time.Millisecond, Share: 1},
			{Name: "batch", SLO: 10 * time.Second, TPOT: 250 * time.Millisecond, Share: 2, Priority: -1},
		}, ""},
		{" a ; b:share=0.5 ", []Class{{Name: "a", Share: 1}, {Name: "b", Share: 0.5}}, ""},
		{"", nil, `class 1 name ""`},
		{"a;a", nil, `class "a" named twice`},
		{"a b:ttft=1s", nil, `name "a b"`},
		{"a:ttft", nil, `"ttft": want KEY=VALUE`},
		{"a:ttft=-1s", nil, `ttft "-1s": want a duration 0..1h`},
		{"a:tpot=2h", nil, `tpot "2h"`},
		{"a:share=0", nil, `share "0": want a weight`},
		{"a:share=NaN", nil, `share "NaN"`},
		{"a:priority=1.5", nil, `priority "1.5": want an integer`},
		{"a:colour=red", nil, `key "colour" unknown`},
		{strings.Repeat("x", 65), nil, "want 1..64 letters"},
		{manyClasses(65), nil, "more than 64"},
	}
	tests = append(tests, struct {
		in   string
		want []Class
		err  string
	}{manyClasses(64), nil, ""})
	for _, tt := range tests {
		t.Run(tt.in[:min(len(tt.in), 40)], func(t *testing.T) {
			got, err := ParseClasses(tt.in)
			if tt.err != "" {
				require.ErrorIs(t, err, ErrInvalidConfig)
				assert.Contains(t, err.Error(), tt.err)
				return
			}
			require.NoError(t, err)
			if tt.want != nil {
				assert.Equal(t, tt.want, got)
			}
			_, err = Tenants(TenantsConfig{Base: mustShared(t), Classes: got})
			require.NoError(t, err)
		})
	}
}

// manyClasses is n classes c0, c1, ….
func manyClasses(n int) string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprint("c", i)
	}
	return strings.Join(names, ";")
}

func FuzzParseClasses(f *testing.F) {
	for _, s := range []string{"interactive:ttft=500ms,tpot=50ms;batch:ttft=10s,tpot=250ms,share=2", "a", "a:;b", ";;", "a:share=1e6,priority=1000", "é:ttft=1s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		cs, err := ParseClasses(s)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidConfig)
			return
		}
		require.NotEmpty(t, cs)
		require.LessOrEqual(t, len(cs), MaxGroups)
		// Whatever parses is a valid set of classes, and writes back to
		// the same.
		_, err = Tenants(TenantsConfig{Base: mustShared(t), Classes: cs})
		require.NoError(t, err)
		parts := make([]string, len(cs))
		for i, k := range cs {
			parts[i] = fmt.Sprintf("%s:ttft=%v,tpot=%v,share=%v,priority=%d", k.Name, k.SLO, k.TPOT, k.Share, k.Priority)
		}
		back, err := ParseClasses(strings.Join(parts, ";"))
		require.NoError(t, err)
		require.Equal(t, cs, back)
	})
}

// TestObjectivesReject: with the fronts' reject rule (Config.Unattainable,
// internal/front.Objectives.Refuse) the gateway's own policy sheds the
// requests no replica is predicted to meet, each counted with the reason
// slo_unattainable, once speeds are known; best effort, the default,
// sheds none; a peer is not run behind the rule.
func TestObjectivesReject(t *testing.T) {
	tight := Class{Name: "tight", Priority: 1, SLO: time.Microsecond, TPOT: time.Microsecond, Share: 1}
	w := smallTenants(t, 300, 60, TenantsConfig{Classes: []Class{tight}})
	peer := Policy{Name: "gie", Source: "test peer", New: func(seed uint64) gateway.Policy { return reference.NewGIE(seed) }}
	for _, u := range []fronts.Unattainable{fronts.BestEffort, fronts.Reject} {
		rep, err := Run(Config{Workload: w, Replicas: 2, Policies: []Policy{cacheAware, peer}, ObjectiveHeaders: true, Unattainable: u})
		require.NoError(t, err)
		own, other := rep.Results[0], rep.Results[1]
		assert.Zero(t, other.Shed, "a peer is not behind the fronts' rule")
		if u == fronts.BestEffort {
			assert.Zero(t, own.Shed)
			continue
		}
		assert.Positive(t, own.Shed, "requests shed once speeds are known")
		assert.Less(t, own.Shed, own.Requests, "the first requests, before any speed is known, are routed")
		assert.Equal(t, own.Shed, own.ShedReasons[fronts.CodeSLOUnattainable])
	}
}

// TestObjectivesRejectUnderAdmission: behind Config.Admission too, the
// requests the reject rule sheds are counted by their reason; they were
// counted in Shed alone, ShedReasons nil, so that the JSON could not tell
// them from the admission rule's.
func TestObjectivesRejectUnderAdmission(t *testing.T) {
	tight := Class{Name: "tight", Priority: 1, SLO: time.Microsecond, TPOT: time.Microsecond, Share: 1}
	w := smallTenants(t, 300, 60, TenantsConfig{Classes: []Class{tight}})
	rep, err := Run(Config{Workload: w, Replicas: 2, Policies: []Policy{cacheAware}, ObjectiveHeaders: true, Unattainable: fronts.Reject,
		Admission: gateway.Admission{QueueDepth: 1000}}) // never saturated here
	require.NoError(t, err)
	own := rep.Results[0]
	require.Positive(t, own.Shed)
	assert.Equal(t, map[string]int{fronts.CodeSLOUnattainable: own.Shed}, own.ShedReasons)
}

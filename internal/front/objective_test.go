package front

import (
	"errors"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
)

func TestParseSLOHeader(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  time.Duration
		err   string // in the message, "" for none
	}{
		{"0", 0, ""},
		{"1", time.Millisecond, ""},
		{"250", 250 * time.Millisecond, ""},
		{"3600000", time.Hour, ""},
		{"0003600000", time.Hour, ""},
		{"3600001", 0, `"3600001" is too large`},
		{"99999999999999999999999", 0, "is too large"},
		{"", 0, "is empty"},
		{"-5", 0, `"-5" is not an integer`},
		{"+5", 0, "is not an integer"},
		{"1.5", 0, `"1.5" is not an integer`},
		{"1e3", 0, "is not an integer"},
		{"10 ", 0, "is not an integer"},
		{"0x10", 0, "is not an integer"},
		{"ten", 0, `"ten" is not an integer`},
		{strings.Repeat("a", 100), 0, `"` + strings.Repeat("a", 32) + `..."`},
	} {
		got, err := ParseSLOHeader(HeaderSLOTTFT, tc.value)
		if tc.err == "" {
			require.NoError(t, err, tc.value)
			assert.Equal(t, tc.want, got, tc.value)
			continue
		}
		require.Error(t, err, tc.value)
		assert.ErrorIs(t, err, ErrBadRequest)
		assert.Equal(t, HeaderSLOTTFT, Param(err), tc.value)
		assert.Contains(t, err.Error(), HeaderSLOTTFT)
		assert.Contains(t, err.Error(), tc.err)
	}
}

func TestObjectivesFor(t *testing.T) {
	o := Objectives{Defaults: map[string]SLO{
		"a": {TTFT: time.Second, TPOT: 50 * time.Millisecond},
		"*": {TTFT: 2 * time.Second},
	}}
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Add(kv[i], kv[i+1])
		}
		return h
	}
	for _, tc := range []struct {
		name  string
		model string
		h     http.Header
		want  SLO
		param string
	}{
		{"default of the model", "a", hdr(), SLO{time.Second, 50 * time.Millisecond}, ""},
		{"default of any model", "b", hdr(), SLO{TTFT: 2 * time.Second}, ""},
		{"header replaces one", "a", hdr("x-slo-ttft-ms", "300"), SLO{300 * time.Millisecond, 50 * time.Millisecond}, ""},
		{"zero removes one", "a", hdr("x-slo-tpot-ms", "0"), SLO{TTFT: time.Second}, ""},
		{"both headers", "b", hdr("x-slo-ttft-ms", "10", "x-slo-tpot-ms", "20"), SLO{10 * time.Millisecond, 20 * time.Millisecond}, ""},
		{"bad ttft", "a", hdr("x-slo-ttft-ms", "fast"), SLO{}, HeaderSLOTTFT},
		{"bad tpot", "a", hdr("x-slo-tpot-ms", "-1"), SLO{}, HeaderSLOTPOT},
		{"twice", "a", hdr("x-slo-tpot-ms", "1", "x-slo-tpot-ms", "2"), SLO{}, HeaderSLOTPOT},
	} {
		got, err := o.For(tc.model, tc.h)
		if tc.param != "" {
			require.Error(t, err, tc.name)
			assert.Equal(t, tc.param, Param(err), tc.name)
			continue
		}
		require.NoError(t, err, tc.name)
		assert.Equal(t, tc.want, got, tc.name)
	}
	var none Objectives
	got, err := none.For("a", hdr())
	require.NoError(t, err)
	assert.False(t, got.Set())
}

// FuzzParseSLOHeader: any value parses to the integer of milliseconds it
// spells when it is digits only and within MaxSLO, and to a 400 naming
// the header otherwise; never a panic.
func FuzzParseSLOHeader(f *testing.F) {
	for _, s := range []string{"0", "1", "500", "3600000", "3600001", "", "-1", "1.5", " 1", "1e9", "99999999999999999999", "\x00", "٣"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		d, err := ParseSLOHeader(HeaderSLOTPOT, v)
		n, perr := strconv.ParseUint(v, 10, 64)
		valid := perr == nil && v != "" && !strings.ContainsAny(v, "+-") && n <= uint64(maxSLOMillis)
		if valid != (err == nil) {
			t.Fatalf("ParseSLOHeader(%q) = %v, %v; ParseUint %d, %v", v, d, err, n, perr)
		}
		if err != nil {
			if Param(err) != HeaderSLOTPOT || !errors.Is(err, ErrBadRequest) {
				t.Fatalf("ParseSLOHeader(%q) error %v does not name the header", v, err)
			}
			return
		}
		if d != time.Duration(n)*time.Millisecond || d < 0 || d > MaxSLO {
			t.Fatalf("ParseSLOHeader(%q) = %v, want %d ms", v, d, n)
		}
	})
}

func TestSLOValidate(t *testing.T) {
	require.NoError(t, SLO{TTFT: time.Hour}.Validate())
	require.ErrorContains(t, SLO{TTFT: -time.Second}.Validate(), "TTFT -1s")
	require.ErrorContains(t, SLO{TPOT: 2 * time.Hour}.Validate(), "TPOT 2h0m0s")
}

// Objectives.Validate names the field and value at fault.
func TestObjectivesValidate(t *testing.T) {
	for _, tc := range []struct {
		o    Objectives
		want string
	}{
		{Objectives{}, ""},
		{Objectives{Defaults: map[string]SLO{"*": {TTFT: time.Second, TPOT: MaxSLO}}, Unattainable: Reject}, ""},
		{Objectives{Defaults: map[string]SLO{"m": {TPOT: MaxSLO + 1}}}, `Objectives.Defaults["m"]: objective TPOT 1h0m0.000000001s`},
		{Objectives{Unattainable: -1}, "Objectives.Unattainable -1 is not a mode"},
	} {
		err := tc.o.Validate()
		if tc.want == "" {
			assert.NoError(t, err)
			continue
		}
		assert.ErrorContains(t, err, tc.want)
	}
}

func TestParseUnattainable(t *testing.T) {
	for _, u := range []Unattainable{BestEffort, Reject} {
		got, err := ParseUnattainable(u.String())
		require.NoError(t, err)
		assert.Equal(t, u, got)
	}
	_, err := ParseUnattainable("drop")
	require.ErrorContains(t, err, `"drop"`)
}

// slowGateway is a gateway of one replica that has learned a time per
// block of 10 ms, so a 1 ms TTFT objective cannot be met there.
func slowGateway(t *testing.T) *gateway.Gateway {
	t.Helper()
	g, err := gateway.New([]gateway.Replica{{Name: "r"}}, gateway.WithMode(gateway.ModeCacheAware))
	require.NoError(t, err)
	for i := range 40 { // about 30 first tokens publish the time per block
		d, err := g.RouteWith(gateway.Key{uint64(i + 1)}, gateway.Target{})
		require.NoError(t, err)
		d.Done(gateway.DoneInfo{TTFT: 20 * time.Millisecond, Elapsed: 40 * time.Millisecond, OutputTokens: 3})
	}
	return g
}

func TestRefuse(t *testing.T) {
	g := slowGateway(t)
	for _, tc := range []struct {
		mode   Unattainable
		slo    SLO
		refuse bool
	}{
		{BestEffort, SLO{TTFT: time.Millisecond}, false},
		{Reject, SLO{TTFT: time.Millisecond}, true},
		{Reject, SLO{TTFT: time.Hour}, false},
		{Reject, SLO{}, false},
	} {
		o := Objectives{Unattainable: tc.mode}
		var tg gateway.Target
		tc.slo.Apply(&tg)
		d, err := g.RouteWith(gateway.Key{99, 100}, tg)
		require.NoError(t, err)
		before := g.Replicas()[0].InFlight
		got := o.Refuse(tc.slo, &d)
		assert.Equal(t, tc.refuse, got, "%v %+v", tc.mode, tc.slo)
		if got {
			// The decision is released: its in-flight count is gone.
			assert.Equal(t, before-1, g.Replicas()[0].InFlight)
			rec := httptest.NewRecorder()
			WriteSLOUnattainable(rec, "m", tc.slo, &d)
			assert.Equal(t, http.StatusTooManyRequests, rec.Code)
			assert.Contains(t, rec.Body.String(), `"code":"slo_unattainable"`)
			assert.Contains(t, rec.Body.String(), `"type":"rate_limit_error"`)
		} else {
			d.Done(gateway.DoneInfo{})
		}
	}
}

// Attained counts as the library's Stats do: the same random outcomes
// fed to both give the same met and missed counts.
func TestAttainedMatchesLibrary(t *testing.T) {
	g, err := gateway.New([]gateway.Replica{{Name: "r"}}, gateway.WithMode(gateway.ModeCacheAware))
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(1, 2))
	ms := func() time.Duration { return time.Duration(rng.IntN(50)) * time.Millisecond }
	var met, missed [2]uint64
	for i := range 2000 {
		s := SLO{TTFT: ms(), TPOT: ms()}
		var tg gateway.Target
		s.Apply(&tg)
		d, err := g.RouteWith(gateway.Key{uint64(i)}, tg)
		require.NoError(t, err)
		info := gateway.DoneInfo{TTFT: ms(), Elapsed: ms() * 3, OutputTokens: rng.IntN(5)}
		if rng.IntN(10) == 0 {
			info.Err = errors.New("failed")
		}
		a, b := Attained(s, &info)
		for k, x := range [2]Attainment{a, b} {
			switch x {
			case Met:
				met[k]++
			case Missed:
				missed[k]++
			}
		}
		d.Done(info)
	}
	st := g.Stats()
	assert.Equal(t, [2]uint64{st.TTFTMet, st.TPOTMet}, met)
	assert.Equal(t, [2]uint64{st.TTFTMissed, st.TPOTMissed}, missed)
	assert.NotZero(t, met[0]+met[1])
	assert.NotZero(t, missed[0]+missed[1])
}

// The prefill pool is asked for the objective's TTFT only; the rest of
// the decode pool's target stays.
func TestPrefillTarget(t *testing.T) {
	d := gateway.Target{Adapter: "a", Exclude: "e1", TTFT: time.Second, TPOT: 50 * time.Millisecond}
	assert.Equal(t, gateway.Target{Adapter: "a", Exclude: "e1", TTFT: time.Second}, PrefillTarget(d))
	assert.Equal(t, 50*time.Millisecond, d.TPOT, "the decode target is not modified")
}

// TestRefuseOnlyTheObjective: a decision that fell back because every
// replica breaches the gateway's latency SLO (WithSLOLatency), for a
// request whose objective its replica is predicted to meet, is not
// refused: FallbackSLO, which both reasons share, was read as the
// objective's alone, and such a request was answered 429 "no replica is
// predicted to meet the latency objective".
func TestRefuseOnlyTheObjective(t *testing.T) {
	g, err := gateway.New([]gateway.Replica{{Name: "r"}}, gateway.WithMode(gateway.ModeCacheAware), gateway.WithSLOLatency(time.Second))
	require.NoError(t, err)
	for i := range 40 { // publish a time per block, about 1 ms
		d, err := g.RouteWith(gateway.Key{uint64(i + 1)}, gateway.Target{})
		require.NoError(t, err)
		d.Done(gateway.DoneInfo{TTFT: 2 * time.Millisecond, Elapsed: 4 * time.Millisecond, OutputTokens: 3})
	}
	require.NoError(t, g.UpdateLoad("r", gateway.Load{Latency: 2 * time.Second})) // over the latency SLO
	o := Objectives{Unattainable: Reject}
	for _, tc := range []struct {
		slo    SLO
		refuse bool
	}{
		{SLO{TTFT: time.Hour}, false},
		{SLO{TPOT: time.Hour}, false},
		{SLO{TTFT: time.Hour, TPOT: time.Hour}, false},
		{SLO{TTFT: time.Nanosecond}, true},
		{SLO{TTFT: time.Hour, TPOT: time.Nanosecond}, true},
	} {
		var tg gateway.Target
		tc.slo.Apply(&tg)
		d, err := g.RouteWith(gateway.Key{99, 100}, tg)
		require.NoError(t, err)
		require.NotZero(t, d.Fallback&gateway.FallbackSLO, "every replica breaches the latency SLO")
		require.Equal(t, tc.refuse, o.Refuse(tc.slo, &d), "%+v, predicted ttft %v tpot %v", tc.slo, d.PredictedTTFT, d.PredictedTPOT)
		d.Done(gateway.DoneInfo{})
	}
}

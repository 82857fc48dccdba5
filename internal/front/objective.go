package front

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/examlops/gateway"
)

// This file holds the fronts' rule for per-request latency objectives
// (the library's Target.TTFT and TPOT, objective.go in the root package):
// where a request's objective comes from, and what a front does when the
// library finds no replica predicted to meet it: one rule (Refuse,
// through Metrics.CheckSLO) for the HTTP gateway and the picker. The
// simulator routes with the objectives (sim.Config.ObjectiveHeaders) and
// applies the same Refuse to the gateway's own policies
// (sim.Config.Unattainable, exa simulate --slo-unattainable).

// The request headers of a latency objective, llm-d's names: integers in
// milliseconds, 0 (or absent) none.
const (
	HeaderSLOTTFT = "X-Slo-Ttft-Ms"
	HeaderSLOTPOT = "X-Slo-Tpot-Ms"
)

// MaxSLO bounds an objective, from a header or the configuration: an
// hour, past DefaultResponseTimeout's 10 minutes, beyond which no
// objective says anything.
const MaxSLO = time.Hour

// maxSLOMillis is MaxSLO in milliseconds: at most 7 digits.
const maxSLOMillis = int64(MaxSLO / time.Millisecond)

// SLO is a latency objective: the time to first token and per output
// token a request asks for. A zero field sets none; the zero value sets
// none at all.
type SLO struct{ TTFT, TPOT time.Duration }

// Set reports whether s sets an objective.
func (s SLO) Set() bool { return s.TTFT > 0 || s.TPOT > 0 }

// Validate checks s as configuration: neither field negative nor above
// MaxSLO. Its error names the field and value.
func (s SLO) Validate() error {
	for _, f := range [...]struct {
		name string
		v    time.Duration
	}{{"TTFT", s.TTFT}, {"TPOT", s.TPOT}} {
		if f.v < 0 || f.v > MaxSLO {
			return fmt.Errorf("objective %s %v is outside 0..%v", f.name, f.v, MaxSLO)
		}
	}
	return nil
}

// Apply sets t's objective to s.
func (s SLO) Apply(t *gateway.Target) { t.TTFT, t.TPOT = s.TTFT, s.TPOT }

// Unattainable says what a front does with a request whose objective no
// replica is predicted to meet (gateway.FallbackSLO). The zero value is
// BestEffort.
type Unattainable int

const (
	// BestEffort routes it anyway, to the replica the library chose.
	BestEffort Unattainable = iota
	// Reject answers 429 (code slo_unattainable) and releases the
	// decision; the engine never sees the request.
	Reject
)

// String returns best-effort or reject.
func (u Unattainable) String() string {
	if u == Reject {
		return "reject"
	}
	return "best-effort"
}

// ParseUnattainable reads best-effort or reject.
func ParseUnattainable(s string) (Unattainable, error) {
	switch s {
	case "best-effort":
		return BestEffort, nil
	case "reject":
		return Reject, nil
	}
	return 0, fmt.Errorf("%q: want best-effort or reject", s)
}

// Objectives is a front's configuration of latency objectives. The zero
// value sets no default and routes best effort. It is read-only once in
// use, and then safe for concurrent use.
type Objectives struct {
	// Defaults maps a model name to the objective of its requests that
	// name none in their headers; the entry "*" is the default of every
	// model not named. Nil: no defaults.
	Defaults map[string]SLO
	// Unattainable is what to do when no replica is predicted to meet a
	// request's objective; default BestEffort.
	Unattainable Unattainable
}

// Validate checks o as a front's configuration: every default valid
// (SLO.Validate) and Unattainable a mode. Its error names the field and
// value; the fronts wrap it with their ErrInvalidOptions.
func (o *Objectives) Validate() error {
	for m, slo := range o.Defaults {
		if err := slo.Validate(); err != nil {
			return fmt.Errorf("Objectives.Defaults[%q]: %w", m, err)
		}
	}
	if u := o.Unattainable; u != BestEffort && u != Reject {
		return fmt.Errorf("Objectives.Unattainable %d is not a mode", u)
	}
	return nil
}

// ErrSLOUnattainable is the error a refused request's decision is
// released with (Objectives.Refuse).
var ErrSLOUnattainable = errors.New("gateway: no replica is predicted to meet the request's latency objective")

// CodeSLOUnattainable is the OpenAI error code of a refused request, and
// the reason label it is counted with in exa_gateway_requests_total
// (CodeSLO429).
const (
	CodeSLOUnattainable = "slo_unattainable"
	CodeSLO429          = "429:" + CodeSLOUnattainable
)

// For returns the objective of a request for model with headers h:
// each header present replaces the model's default (Defaults[model],
// else Defaults["*"]) for its objective, 0 removing it. A bad header
// value is a *RequestError naming the header (the client's 400).
func (o *Objectives) For(model string, h http.Header) (SLO, error) {
	s, ok := o.Defaults[model]
	if !ok {
		s = o.Defaults["*"]
	}
	var err error
	if s.TTFT, err = sloHeader(h, HeaderSLOTTFT, s.TTFT); err != nil {
		return SLO{}, err
	}
	if s.TPOT, err = sloHeader(h, HeaderSLOTPOT, s.TPOT); err != nil {
		return SLO{}, err
	}
	return s, nil
}

// sloHeader returns the objective header name of h, def when absent.
func sloHeader(h http.Header, name string, def time.Duration) (time.Duration, error) {
	vv := h.Values(name)
	switch len(vv) {
	case 0:
		return def, nil
	case 1:
		return ParseSLOHeader(name, vv[0])
	}
	return 0, FieldError(name, fmt.Sprintf("header %s is given %d times; give it once", name, len(vv)))
}

// ParseSLOHeader reads one objective header's value: an integer of
// milliseconds in 0..MaxSLO, digits only. Its error is a *RequestError
// naming the header, its message the value (quoted, cut to 32 bytes).
func ParseSLOHeader(name, value string) (time.Duration, error) {
	bad := func(why string) error {
		v := value
		if len(v) > 32 {
			v = v[:32] + "..."
		}
		return FieldError(name, fmt.Sprintf("header %s %s %s; want an integer of milliseconds, 0 to %d", name, strconv.Quote(v), why, maxSLOMillis))
	}
	if value == "" {
		return 0, bad("is empty")
	}
	var ms int64
	for i := 0; i < len(value); i++ {
		c := value[i]
		if c < '0' || c > '9' {
			return 0, bad("is not an integer")
		}
		ms = ms*10 + int64(c-'0')
		if ms > maxSLOMillis {
			return 0, bad("is too large")
		}
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// Unmet reports whether decision d, made for a request with objective
// s, found no replica predicted to meet it (the library's FallbackSLO,
// with its replica's predictions missing s: that flag is also the
// gateway-wide SLO's, when every replica breaches it).
func Unmet(s SLO, d *gateway.Decision) bool {
	return s.Set() && d.Fallback&gateway.FallbackSLO != 0 &&
		(s.TTFT > 0 && d.PredictedTTFT > s.TTFT || s.TPOT > 0 && d.PredictedTPOT > s.TPOT)
}

// Refuse applies the rule to decision d, made for a request with
// objective s: with Reject, a decision that is Unmet is released with
// ErrSLOUnattainable and Refuse returns true: the front answers 429
// (WriteSLOUnattainable). Otherwise it returns false and d stands (best
// effort).
func (o *Objectives) Refuse(s SLO, d *gateway.Decision) bool {
	if o.Unattainable != Reject || !Unmet(s, d) {
		return false
	}
	d.Done(gateway.DoneInfo{Err: ErrSLOUnattainable})
	return true
}

// WriteSLOUnattainable answers a request refused by Refuse: 429, an
// OpenAI rate_limit_error with code slo_unattainable, its message giving
// the objective and the chosen replica's predictions.
func WriteSLOUnattainable(w http.ResponseWriter, model string, s SLO, d *gateway.Decision) {
	WriteError(w, http.StatusTooManyRequests, TypeRateLimit, CodeSLOUnattainable, "", SLOUnattainableMessage(model, s, d))
}

// SLOUnattainableMessage is the message of a request of model with
// objective s refused by Refuse (decision d): the objective and the
// chosen replica's predictions. Both fronts answer with it.
func SLOUnattainableMessage(model string, s SLO, d *gateway.Decision) string {
	return fmt.Sprintf("gateway: model %q: no replica is predicted to meet the latency objective (ttft %v, tpot %v); the best predicts ttft %v, tpot %v (0: unknown). Retry later or relax %s / %s",
		model, s.TTFT, s.TPOT, d.PredictedTTFT, d.PredictedTPOT, HeaderSLOTTFT, HeaderSLOTPOT)
}

// Attainment is how a finished request did against one objective.
type Attainment int8

const (
	// NotMeasured: no objective, or the answer did not show it (a failed
	// request, a first token not seen, fewer than two output tokens).
	NotMeasured Attainment = iota
	Met
	Missed
)

// Attained returns how a request with objective s that ended as info did
// against each objective, by the library's rule (gateway.Stats' TTFTMet
// and TPOTMet): TTFT when info has one; TPOT, the time after the first
// token over the tokens after it, when info has TTFT, Elapsed and more
// than one OutputTokens. A failed request is not measured.
func Attained(s SLO, info *gateway.DoneInfo) (ttft, tpot Attainment) {
	if info.Err != nil || info.TTFT <= 0 {
		return NotMeasured, NotMeasured
	}
	if s.TTFT > 0 {
		ttft = Missed
		if info.TTFT <= s.TTFT {
			ttft = Met
		}
	}
	if s.TPOT > 0 && info.OutputTokens > 1 && info.Elapsed >= info.TTFT {
		tpot = Missed
		if (info.Elapsed-info.TTFT)/time.Duration(info.OutputTokens-1) <= s.TPOT {
			tpot = Met
		}
	}
	return ttft, tpot
}

// CountSeen counts in SLORequests, by Attained, a request of model with
// objective s that ended with a success, as its client saw it: from its
// arrival at the front (flow control's queue and a P/D prefill included),
// its first token after ttft when seen (firstSeen), its end after elapsed,
// with tokens output tokens; each time at least 1 ns. Both fronts count
// so.
func (m *Metrics) CountSeen(model string, s SLO, ttft time.Duration, firstSeen bool, elapsed time.Duration, tokens int) {
	seen := gateway.DoneInfo{Elapsed: max(elapsed, 1), OutputTokens: tokens}
	if firstSeen {
		seen.TTFT = max(ttft, 1)
	}
	onTTFT, onTPOT := Attained(s, &seen)
	for _, a := range [...]struct {
		name string
		a    Attainment
	}{{"ttft", onTTFT}, {"tpot", onTPOT}} {
		switch a.a {
		case Met:
			m.SLORequests.WithLabelValues(model, a.name, "met").Inc()
		case Missed:
			m.SLORequests.WithLabelValues(model, a.name, "missed").Inc()
		}
	}
}

// CheckSLO is both fronts' objective rule on decision d of a request of
// model with objective s: a decision that is Unmet is counted in
// SLOUnattainable (action best_effort or rejected) and refused or not by
// o.Refuse, whose result it returns; the front answers a refused one 429
// (WriteSLOUnattainable).
func (m *Metrics) CheckSLO(o *Objectives, model string, s SLO, d *gateway.Decision) (refused bool) {
	if !Unmet(s, d) {
		return false
	}
	action := "best_effort"
	if refused = o.Refuse(s, d); refused {
		action = "rejected"
	}
	m.SLOUnattainable.WithLabelValues(model, action).Inc()
	return refused
}

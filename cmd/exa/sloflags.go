package main

import (
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/examlops/gateway/internal/front"
)

// sloFlags are the latency objectives' flags (--slo-ttft, --slo-tpot,
// --slo-unattainable); options turns them into front.Objectives.
type sloFlags struct {
	ttft, tpot   []string
	unattainable string
}

func (f *sloFlags) register(fs *pflag.FlagSet) {
	fs.StringArrayVar(&f.ttft, "slo-ttft", nil,
		"[MODEL=]DURATION: the time-to-first-token objective of MODEL's chat, completions and responses requests (of every model not named, without MODEL=), which a request's "+front.HeaderSLOTTFT+" header replaces (0 removes it); up to 1h; repeatable; docs/gateway.md")
	fs.StringArrayVar(&f.tpot, "slo-tpot", nil,
		"[MODEL=]DURATION: the time-per-output-token objective, as --slo-ttft (header "+front.HeaderSLOTPOT+")")
	fs.StringVar(&f.unattainable, "slo-unattainable", front.BestEffort.String(),
		"what to do with a request whose latency objective no replica is predicted to meet: best-effort (route it to the best replica) or reject (429, code slo_unattainable)")
}

// options returns the flags as front.Objectives, or a usage error naming
// the first bad flag and its value.
func (f *sloFlags) options() (front.Objectives, error) {
	var o front.Objectives
	u, err := front.ParseUnattainable(f.unattainable)
	if err != nil {
		return o, usagef("invalid --slo-unattainable %q: want best-effort or reject", f.unattainable)
	}
	o.Unattainable = u
	for _, fl := range [...]struct {
		name   string
		values []string
		field  func(*front.SLO) *time.Duration
	}{
		{"slo-ttft", f.ttft, func(s *front.SLO) *time.Duration { return &s.TTFT }},
		{"slo-tpot", f.tpot, func(s *front.SLO) *time.Duration { return &s.TPOT }},
	} {
		seen := map[string]bool{}
		for _, v := range fl.values {
			model, dur := "*", v
			// A duration has no "=": a model name may.
			if i := strings.LastIndexByte(v, '='); i >= 0 {
				model, dur = v[:i], v[i+1:]
			}
			d, err := time.ParseDuration(dur)
			if model == "" || err != nil || d <= 0 || d > front.MaxSLO {
				return o, usagef("invalid --%s %q: want [MODEL=]DURATION, a duration in (0, %v]", fl.name, v, front.MaxSLO)
			}
			if seen[model] {
				return o, usagef("invalid --%s %q: model %q is given twice", fl.name, v, model)
			}
			seen[model] = true
			if o.Defaults == nil {
				o.Defaults = map[string]front.SLO{}
			}
			s := o.Defaults[model]
			*fl.field(&s) = d
			o.Defaults[model] = s
		}
	}
	return o, nil
}

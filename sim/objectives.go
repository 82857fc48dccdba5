package sim

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Per-request objectives (issue 27): a request may carry a time-per-
// output-token objective (Request.TPOTSLO) beside its time-to-first-token
// one (Request.SLO), as llm-d's x-slo-ttft-ms and x-slo-tpot-ms headers
// do. The engine measures each completed request's TPOT, (last token −
// first token) / (output tokens − 1), and the report gives, per class and
// per tenant whose requests carry a TPOT objective, the attainment of each
// objective, of both, and the goodput (requests meeting both per second).

// Objectives is a Group's figures against its requests' time-per-output-
// token objectives, set when any of its requests has one (Request.TPOTSLO).
// Attainments are shares, 0..1, of all the group's Requests: a request
// shed, expired or failed misses both objectives; a request with one
// output token, or without a TPOT objective, meets its TPOT objective.
type Objectives struct {
	// TTFT is the share whose first token came within their TTFT
	// objective (the same as Group.SLOAttainment).
	TTFT float64 `json:"ttft_attainment"`
	// TPOT is the share that completed within their TPOT objective.
	TPOT float64 `json:"tpot_attainment"`
	// Both is the share that met both objectives.
	Both float64 `json:"both_attainment"`
	// Goodput is the requests that met both objectives per second of the
	// run's Duration.
	Goodput float64 `json:"goodput"`
	// TPOTLatency is the distribution of the measured TPOT, in seconds,
	// over the completed requests with more than one output token.
	TPOTLatency Latency `json:"tpot"`
}

// objAcc accumulates one group's Objectives.
type objAcc struct {
	on         bool // a request of the group has a TPOT objective
	tpot, both int
	lat        hist
}

// objectives records s's TPOT against its objective as it completes at
// e.now.
func (e *engine) objectives(s *seq) {
	if s.tenant < 0 && s.class < 0 {
		return
	}
	met := true
	tpot := -1.0
	if s.out > 1 {
		dec := e.now - s.arrival - s.ttft
		tpot = float64(dec) / float64(s.out-1) / 1e9
		met = s.tpotSLO <= 0 || float64(dec) <= float64(s.tpotSLO)*float64(s.out-1)
	}
	e.group(s, func(g *groupAcc) {
		if tpot >= 0 {
			g.obj.lat.add(tpot)
		}
		if met {
			g.obj.tpot++
			if s.ttft <= s.slo { // as firstToken counted it
				g.obj.both++
			}
		}
	})
}

// result is the group's Objectives, nil when none of its requests has a
// TPOT objective.
func (a *objAcc) result(requests, ttftMet int, dur float64) *Objectives {
	if !a.on {
		return nil
	}
	o := &Objectives{TPOTLatency: latencyOf(&a.lat)}
	if requests > 0 {
		n := float64(requests)
		o.TTFT, o.TPOT, o.Both = float64(ttftMet)/n, float64(a.tpot)/n, float64(a.both)/n
	}
	if dur > 0 {
		o.Goodput = float64(a.both) / dur
	}
	return o
}

// writeObjectives writes the objectives table of the groups of one kind
// (title "class" or "tenant"), when any has objectives.
func writeObjectives(b *strings.Builder, r *Report, title string, of func(*Result) []Group) {
	any := false
	for i := range r.Results {
		for _, g := range of(&r.Results[i]) {
			any = any || g.Objectives != nil
		}
	}
	if !any {
		return
	}
	fmt.Fprintf(b, "\nper %s objectives (TPOT: (last token − first token)/(output tokens − 1); attainment of all requests, the shed, expired and failed missing both; good/s: meeting both):\n", title)
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "policy\t%s\trequests\tTTFT SLO\tTPOT SLO\tboth\tgood/s\tTPOT mean\tp50\tp99\t\n", title)
	for i := range r.Results {
		x := &r.Results[i]
		for _, g := range of(x) {
			o := g.Objectives
			if o == nil {
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%.2f\t%s\t%s\t%s\t\n", x.Policy, g.Name, g.Requests, pct(o.TTFT), pct(o.TPOT), pct(o.Both),
				o.Goodput, sec(o.TPOTLatency.Mean), sec(o.TPOTLatency.P50), sec(o.TPOTLatency.P99))
		}
	}
	_ = tw.Flush()
}

// The classes of the slo-classes workload, with objectives on both TTFT
// and TPOT: an interactive class (250 ms, 25 ms: tight on both, met by
// cache-aware routing on an idle 8b-h100 pool but not by every policy on
// a mixed one), a standard class (1 s, 50 ms), and a batch class (5 s,
// 150 ms, half of the requests).
var (
	SLOInteractive = Class{Name: "interactive", Priority: 2, SLO: 250 * time.Millisecond, TPOT: 25 * time.Millisecond, Share: 1}
	SLOStandard    = Class{Name: "standard", Priority: 1, SLO: time.Second, TPOT: 50 * time.Millisecond, Share: 1}
	SLOBatch       = Class{Name: "batch", Priority: 0, SLO: 5 * time.Second, TPOT: 150 * time.Millisecond, Share: 2}
)

// DefaultSLOClasses returns the classes of the slo-classes workload:
// SLOInteractive, SLOStandard and SLOBatch.
func DefaultSLOClasses() []Class { return []Class{SLOInteractive, SLOStandard, SLOBatch} }

// SLOClasses returns the slo-classes workload: the default workload's
// prompts, requests and rate (0: 20,000 at 40/s), output lengths drawn
// around their mean, each request given a class of classes (nil:
// DefaultSLOClasses) by Share, with its TTFT and TPOT objectives.
func SLOClasses(requests int, rate float64, classes []Class) (Workload, error) {
	if classes == nil {
		classes = DefaultSLOClasses()
	}
	return Tenants(TenantsConfig{Requests: requests, Rate: rate, Classes: classes})
}

// maxClassName bounds a class name's length.
const maxClassName = 64

// ParseClasses reads classes written NAME:KEY=VALUE,...;NAME:..., as
// "interactive:ttft=500ms,tpot=50ms,share=1,priority=2;batch:ttft=10s,tpot=250ms,share=2".
// Keys: ttft and tpot, Go durations (the TTFT and TPOT objectives, 0..1h;
// 0 or absent: ttft the run's, tpot none); share, a positive weight
// (default 1); priority, an integer band (default 0). Names are 1..64
// letters, digits, '-', '_' or '.', each once; at most MaxGroups classes.
func ParseClasses(spec string) ([]Class, error) {
	var out []Class
	seen := map[string]bool{}
	for i, part := range strings.Split(spec, ";") {
		part = strings.TrimSpace(part)
		name, kvs, _ := strings.Cut(part, ":")
		name = strings.TrimSpace(name)
		if len(out) == MaxGroups {
			return nil, fmt.Errorf("%w: classes %q: more than %d", ErrInvalidConfig, spec, MaxGroups)
		}
		if !className(name) {
			return nil, fmt.Errorf("%w: class %d name %q: want 1..%d letters, digits, '-', '_' or '.'", ErrInvalidConfig, i+1, name, maxClassName)
		}
		if seen[name] {
			return nil, fmt.Errorf("%w: class %q named twice", ErrInvalidConfig, name)
		}
		seen[name] = true
		k := Class{Name: name, Share: 1}
		if strings.TrimSpace(kvs) != "" {
			for _, kv := range strings.Split(kvs, ",") {
				key, val, ok := strings.Cut(kv, "=")
				key, val = strings.TrimSpace(key), strings.TrimSpace(val)
				if !ok {
					return nil, fmt.Errorf("%w: class %q: %q: want KEY=VALUE (ttft, tpot, share, priority)", ErrInvalidConfig, name, kv)
				}
				if err := k.set(key, val); err != nil {
					return nil, err
				}
			}
		}
		out = append(out, k)
	}
	return out, nil
}

func className(s string) bool {
	if s == "" || len(s) > maxClassName {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// set sets one key of k from val, checking its range.
func (k *Class) set(key, val string) error {
	bad := func(want string) error {
		return fmt.Errorf("%w: class %q: %s %q: want %s", ErrInvalidConfig, k.Name, key, val, want)
	}
	switch key {
	case "ttft", "tpot":
		d, err := time.ParseDuration(val)
		if err != nil || d < 0 || d > time.Hour {
			return bad("a duration 0..1h, such as 500ms")
		}
		if key == "ttft" {
			k.SLO = d
		} else {
			k.TPOT = d
		}
	case "share":
		f, err := strconv.ParseFloat(val, 64)
		if err != nil || !(f > 0 && f <= 1e6) {
			return bad("a weight in (0, 1e6]")
		}
		k.Share = f
	case "priority":
		p, err := strconv.Atoi(val)
		if err != nil || p < -1000 || p > 1000 {
			return bad("an integer -1000..1000")
		}
		k.Priority = p
	default:
		return fmt.Errorf("%w: class %q: key %q unknown, want ttft, tpot, share or priority", ErrInvalidConfig, k.Name, key)
	}
	return nil
}

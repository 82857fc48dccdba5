package sim

import (
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
)

// Group is one tenant's or one class's figures in a Result. Times are in
// seconds.
type Group struct {
	// Name is the tenant's or the class's ("other" past MaxGroups).
	Name string `json:"name"`
	// Requests is the number that arrived: Completed + Shed + Expired +
	// the failed (too large, unroutable).
	Requests int `json:"requests"`
	// Completed is the number that produced their last token.
	Completed int `json:"completed"`
	// TTFT is the time to first token from arrival (time in queue
	// included) of those that got one.
	TTFT Latency `json:"ttft"`
	// SLOAttainment is the share of Requests whose first token came
	// within their SLO (the class's, else Config.SLO).
	SLOAttainment float64 `json:"slo_attainment"`
	// Goodput is the requests whose first token came within their SLO per
	// second of the run's Duration.
	Goodput float64 `json:"goodput"`
	// Shed is the number shed: by Config.Admission, or refused or
	// displaced by the flow-control queue, or by a full replica queue.
	Shed int `json:"shed"`
	// Expired is the number a flow-control queue answered at their
	// deadline, undispatched.
	Expired int `json:"expired"`
	// Queue is the time in a flow-control queue, arrival to dispatch, of
	// the dispatched requests; 0 without flow control.
	Queue Latency `json:"queue"`
	// Objectives has the figures against the requests' TPOT objectives
	// when any has one (Request.TPOTSLO); nil, and left out of the JSON,
	// otherwise.
	Objectives *Objectives `json:"objectives,omitempty"`
}

// groupAcc accumulates one Group.
type groupAcc struct {
	name                                    string
	requests, completed, met, shed, expired int
	ttft, queue                             hist
	obj                                     objAcc
}

// groups is a bounded table of groups by name.
type groups struct {
	acc []*groupAcc
	idx map[string]int16
}

// of returns the index of the group called name, made if new; -1 for "".
func (g *groups) of(name string) int16 {
	if name == "" {
		return -1
	}
	if i, ok := g.idx[name]; ok {
		return i
	}
	if len(g.acc) >= MaxGroups {
		name = "other"
		if i, ok := g.idx[name]; ok {
			return i
		}
	}
	if g.idx == nil {
		g.idx = map[string]int16{}
	}
	i := int16(len(g.acc))
	g.acc = append(g.acc, &groupAcc{name: name})
	g.idx[name] = i
	return i
}

// result returns the groups sorted by name; nil when there are none.
func (g *groups) result(dur float64) []Group {
	if len(g.acc) == 0 {
		return nil
	}
	out := make([]Group, 0, len(g.acc))
	for _, a := range g.acc {
		x := Group{Name: a.name, Requests: a.requests, Completed: a.completed, TTFT: latencyOf(&a.ttft),
			Shed: a.shed, Expired: a.expired, Queue: latencyOf(&a.queue)}
		if a.requests > 0 {
			x.SLOAttainment = float64(a.met) / float64(a.requests)
		}
		if dur > 0 {
			x.Goodput = float64(a.met) / dur
		}
		x.Objectives = a.obj.result(a.requests, a.met, dur)
		out = append(out, x)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// group calls fn with s's tenant and class accumulators, if any.
func (e *engine) group(s *seq, fn func(*groupAcc)) {
	if s.tenant >= 0 {
		fn(e.tenants.acc[s.tenant])
	}
	if s.class >= 0 {
		fn(e.classes.acc[s.class])
	}
}

// tenantName is s's fairness id.
func (e *engine) tenantName(s *seq) string {
	if s.tenant < 0 {
		return ""
	}
	return e.tenants.acc[s.tenant].name
}

// writeGroupTables writes the per-tenant and per-class tables, when any
// result has them.
func (r *Report) writeGroupTables(b *strings.Builder) {
	held := false
	for i := range r.Results {
		held = held || r.Results[i].QueueTime != nil
	}
	if held {
		fmt.Fprintf(b, "\nflow control (requests held past saturation, routed at dispatch; expired: answered at their deadline undispatched):\n")
		tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "policy\tqueue mean\tp50\tp99\tmax\texpired\tpast deadline\tshed\tshed by reason\t")
		for i := range r.Results {
			x := &r.Results[i]
			if x.QueueTime == nil {
				continue
			}
			reasons := make([]string, 0, len(x.ShedReasons))
			for k, v := range x.ShedReasons {
				reasons = append(reasons, fmt.Sprintf("%s %d", k, v))
			}
			sort.Strings(reasons)
			q := x.QueueTime
			late := fmt.Sprint(x.Late)
			if x.front == frontGIE { // GIE holds without a deadline
				late = "no TTL"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\t\n", x.Policy, sec(q.Mean), sec(q.P50), sec(q.P99), sec(q.Max), x.Expired, late, x.Shed, strings.Join(reasons, ", "))
		}
		_ = tw.Flush()
	}
	for _, k := range []struct {
		title string
		of    func(*Result) []Group
	}{
		{"tenant", func(x *Result) []Group { return x.Tenants }},
		{"class", func(x *Result) []Group { return x.Classes }},
	} {
		any := false
		for i := range r.Results {
			any = any || len(k.of(&r.Results[i])) > 0
		}
		if !any {
			continue
		}
		fmt.Fprintf(b, "\nper %s (TTFT from arrival; SLO: the class's, else the run's; queue: time held by flow control):\n", k.title)
		tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "policy\t%s\trequests\tdone\tTTFT mean\tp99\tSLO\tgood/s\tshed\texpired\tqueue mean\tp99\t\n", k.title)
		for i := range r.Results {
			x := &r.Results[i]
			for _, g := range k.of(x) {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%.2f\t%d\t%d\t%s\t%s\t\n", x.Policy, g.Name, g.Requests, g.Completed,
					sec(g.TTFT.Mean), sec(g.TTFT.P99), pct(g.SLOAttainment), g.Goodput, g.Shed, g.Expired, sec(g.Queue.Mean), sec(g.Queue.P99))
			}
		}
		_ = tw.Flush()
		writeObjectives(b, r, k.title, k.of)
	}
}

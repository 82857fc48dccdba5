package sim

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Mixed pools (issue 27): each replica runs at a multiple of its preset's
// compute speed (Config.ReplicaSpeeds), and may change speed during a run
// (Config.SpeedChanges). A replica at speed s takes 1/s times the preset's
// time for every step: its StepOverhead, prefill, decode and adapter-load
// terms are all divided by s. Speed 1 computes exactly as the preset does.

// Bounds of the speed settings: a speed outside them would put a step's
// time outside what the simulated clock counts.
const (
	// MinSpeed is the slowest speed multiplier a replica may run at.
	MinSpeed = 1e-3
	// MaxSpeed is the fastest speed multiplier a replica may run at.
	MaxSpeed = 1e3
	// MaxSpeedChanges is the most entries Config.SpeedChanges may hold.
	MaxSpeedChanges = 4096
	// maxSpeedAt bounds SpeedChange.At: a year of simulated time.
	maxSpeedAt = 365 * 24 * time.Hour
	// SpeedWindow is the number of requests in each window of
	// SpeedShare.Windows.
	SpeedWindow = 100
	// maxWindows is the most windows SpeedShare.Windows holds.
	maxWindows = 20
)

// SpeedChange changes one replica's speed during a run.
type SpeedChange struct {
	// Replica is the replica's number, 0..Config.Replicas-1 (replica
	// "r0" is 0).
	Replica int
	// At is when the change happens, in simulated time from the first
	// request's arrival; 0..a year. The replica's step in progress at At
	// keeps its planned end; every step planned from At on runs at Speed.
	// Changes at the same At apply in the order listed.
	At time.Duration
	// Speed is the replica's new multiplier of the preset's compute
	// speed, MinSpeed..MaxSpeed.
	Speed float64
}

// String formats c as ParseSpeedChange reads it: "0@30s=0.5".
func (c SpeedChange) String() string {
	return strconv.Itoa(c.Replica) + "@" + c.At.String() + "=" + strconv.FormatFloat(c.Speed, 'g', -1, 64)
}

// MarshalJSON writes c with At in seconds, like the report's other times.
func (c SpeedChange) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Replica int     `json:"replica"`
		At      float64 `json:"at_s"`
		Speed   float64 `json:"speed"`
	}{c.Replica, c.At.Seconds(), c.Speed})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (c *SpeedChange) UnmarshalJSON(b []byte) error {
	var v struct {
		Replica int     `json:"replica"`
		At      float64 `json:"at_s"`
		Speed   float64 `json:"speed"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*c = SpeedChange{Replica: v.Replica, At: time.Duration(math.Round(v.At * 1e9)), Speed: v.Speed}
	return nil
}

// ParseSpeedChange reads a speed change written REPLICA@AT=SPEED, as
// "0@30s=0.5": replica 0 runs at half the preset's speed from 30 s after
// the first arrival. AT is a Go duration. It checks the syntax and the
// ranges that do not depend on the Config (Replica >= 0, At, Speed);
// Run checks Replica against Config.Replicas.
func ParseSpeedChange(s string) (SpeedChange, error) {
	var c SpeedChange
	rep, rest, ok1 := strings.Cut(s, "@")
	at, speed, ok2 := strings.Cut(rest, "=")
	if !ok1 || !ok2 {
		return c, fmt.Errorf("%w: speed change %q: want REPLICA@AT=SPEED, as 0@30s=0.5", ErrInvalidConfig, s)
	}
	var err error
	if c.Replica, err = strconv.Atoi(strings.TrimSpace(rep)); err != nil {
		return c, fmt.Errorf("%w: speed change %q: replica %q is not a number", ErrInvalidConfig, s, rep)
	}
	if c.At, err = time.ParseDuration(strings.TrimSpace(at)); err != nil {
		return c, fmt.Errorf("%w: speed change %q: time %q is not a duration such as 30s", ErrInvalidConfig, s, at)
	}
	if c.Speed, err = strconv.ParseFloat(strings.TrimSpace(speed), 64); err != nil {
		return c, fmt.Errorf("%w: speed change %q: speed %q is not a number", ErrInvalidConfig, s, speed)
	}
	if err := c.check(-1, fmt.Sprintf("speed change %q", s)); err != nil {
		return c, err
	}
	return c, nil
}

// check validates c, with replicas > 0 also its Replica; what names it
// in the error.
func (c SpeedChange) check(replicas int, what string) error {
	switch {
	case c.Replica < 0 || (replicas > 0 && c.Replica >= replicas):
		want := "0 or more"
		if replicas > 0 {
			want = fmt.Sprintf("0..%d", replicas-1)
		}
		return fmt.Errorf("%w: %s: Replica %d, want %s", ErrInvalidConfig, what, c.Replica, want)
	case c.At < 0 || c.At > maxSpeedAt:
		return fmt.Errorf("%w: %s: At %v, want 0..%v", ErrInvalidConfig, what, c.At, maxSpeedAt)
	}
	return checkSpeed(c.Speed, what+": Speed")
}

func checkSpeed(v float64, what string) error {
	if !(v >= MinSpeed && v <= MaxSpeed) { // NaN fails both
		return fmt.Errorf("%w: %s %v, want a finite multiplier in %g..%g", ErrInvalidConfig, what, v, MinSpeed, MaxSpeed)
	}
	return nil
}

// validSpeeds checks Config.ReplicaSpeeds and Config.SpeedChanges once
// Replicas is set.
func validSpeeds(c *Config) error {
	if len(c.ReplicaSpeeds) > c.Replicas {
		return fmt.Errorf("%w: ReplicaSpeeds has %d values for %d replicas, want at most one per replica", ErrInvalidConfig, len(c.ReplicaSpeeds), c.Replicas)
	}
	for i, v := range c.ReplicaSpeeds {
		if err := checkSpeed(v, fmt.Sprintf("ReplicaSpeeds[%d]", i)); err != nil {
			return err
		}
	}
	if len(c.SpeedChanges) > MaxSpeedChanges {
		return fmt.Errorf("%w: SpeedChanges has %d entries, at most %d", ErrInvalidConfig, len(c.SpeedChanges), MaxSpeedChanges)
	}
	for i, sc := range c.SpeedChanges {
		if err := sc.check(c.Replicas, fmt.Sprintf("SpeedChanges[%d]", i)); err != nil {
			return err
		}
	}
	return nil
}

// speedOf is replica i's speed at the start of a run: ReplicaSpeeds
// cycled over the replicas, 1 without.
func (c *Config) speedOf(i int) float64 {
	if len(c.ReplicaSpeeds) == 0 {
		return 1
	}
	return c.ReplicaSpeeds[i%len(c.ReplicaSpeeds)]
}

// mixedSpeeds reports whether any replica runs at a speed other than 1
// at any time: the report then states the speeds and each speed's share.
func (c *Config) mixedSpeeds() bool {
	if len(c.SpeedChanges) > 0 {
		return true
	}
	for _, v := range c.ReplicaSpeeds {
		if v != 1 {
			return true
		}
	}
	return false
}

// fastest is the fastest replica's speed at the start of a run.
func (c *Config) fastest() float64 {
	if len(c.ReplicaSpeeds) == 0 {
		return 1
	}
	return slices.Max(c.ReplicaSpeeds)
}

// speedClock is an engine's schedule of speed changes.
type speedClock struct {
	changes []SpeedChange // by At, stable
	next    int
	base    int64 // the first arrival, ns
	// At each replica's first change: the requests it had admitted, and
	// all replicas had (-1: no change yet).
	snapReq, snapAll []int64
	// all counts the requests admitted to any replica's queue; win, per
	// replica, those it admitted in each window of SpeedWindow after its
	// first change.
	all int64
	win [][maxWindows]int32
}

func (k *speedClock) init(cfg *Config, base int64) {
	k.changes = byAt(cfg.SpeedChanges)
	k.base = base
	if len(k.changes) > 0 {
		k.snapReq, k.snapAll = make([]int64, cfg.Replicas), make([]int64, cfg.Replicas)
		k.win = make([][maxWindows]int32, cfg.Replicas)
		for i := range k.snapReq {
			k.snapReq[i], k.snapAll[i] = -1, -1
		}
	}
}

// byAt returns a copy of cs sorted by At, in the order listed at equal
// times.
func byAt(cs []SpeedChange) []SpeedChange {
	cs = slices.Clone(cs)
	slices.SortStableFunc(cs, func(a, b SpeedChange) int { return cmp.Compare(a.At, b.At) })
	return cs
}

// speedDue applies the next speed change if it comes no later than the
// next arrival (when have) and the next event; it reports whether it did.
// A replica in a macro step of several decode steps has it cut at the end
// of the step in progress, so that its next steps run at the new speed.
func (e *engine) speedDue(have bool, arrival int64) bool {
	k := &e.speeds
	if k.next >= len(k.changes) || (!have && len(e.events) == 0) {
		return false
	}
	c := k.changes[k.next]
	t := k.base + int64(c.At)
	if (have && arrival < t) || (len(e.events) > 0 && e.events[0].key < t) {
		return false
	}
	k.next++
	e.now = max(e.now, t)
	r := e.reps[c.Replica]
	if k.snapReq[c.Replica] < 0 {
		k.snapReq[c.Replica], k.snapAll[c.Replica] = r.requests, k.all
	}
	r.speed = c.Speed
	if r.busy && r.stepK > 1 {
		e.truncate(c.Replica)
	}
	return true
}

// admitted counts a request admitted to replica ri's queue, for the
// windows after a change.
func (k *speedClock) admitted(ri int) {
	if k.snapReq == nil {
		return
	}
	k.all++
	if k.snapReq[ri] < 0 {
		return
	}
	if w := (k.all - k.snapAll[ri] - 1) / SpeedWindow; w < maxWindows {
		k.win[ri][w]++
	}
}

// SpeedShare is the work done by the replicas of one speed profile.
type SpeedShare struct {
	// Speed is the replicas' speed profile: their speed multiplier, then
	// each change as "→SPEED@AT" ("1", "0.5", "1→0.5@30s").
	Speed string `json:"speed"`
	// Replicas is how many replicas have it.
	Replicas int `json:"replicas"`
	// Requests is the share, 0..1, of all the requests admitted to a
	// replica's queue that these replicas admitted.
	Requests float64 `json:"requests"`
	// PerReplica is the requests each of these replicas admitted on
	// average, over the mean of all replicas (1: an equal share).
	PerReplica float64 `json:"per_replica"`
	// Prefill is the share, 0..1, of the prompt tokens computed that these
	// replicas computed.
	Prefill float64 `json:"prefill"`
	// AfterChange, for replicas whose speed changes, is PerReplica over
	// the requests admitted after their first change only; nil, and left
	// out of the JSON, for the others or when the run ended before it.
	AfterChange *float64 `json:"after_change_per_replica,omitempty"`
	// Windows, for replicas whose speed changes, is PerReplica over each
	// successive window of SpeedWindow requests admitted after their first
	// change, up to 20 complete windows: how fast routing follows the
	// change. Nil for the others.
	Windows []float64 `json:"after_change_windows,omitempty"`
}

// speedProfiles names each replica's speed profile and lists the
// profiles in order of first replica.
func speedProfiles(c *Config) (of []string, order []string) {
	of = make([]string, c.Replicas)
	for i := range of {
		of[i] = strconv.FormatFloat(c.speedOf(i), 'g', -1, 64)
	}
	for _, sc := range byAt(c.SpeedChanges) {
		of[sc.Replica] += "→" + strconv.FormatFloat(sc.Speed, 'g', -1, 64) + "@" + sc.At.String()
	}
	for _, p := range of {
		if !slices.Contains(order, p) {
			order = append(order, p)
		}
	}
	return of, order
}

// bySpeed sums res's per-replica work by speed profile.
func (e *engine) bySpeed(res *Result) []SpeedShare {
	c, k := e.cfg, &e.speeds
	of, order := speedProfiles(c)
	out := make([]SpeedShare, len(order))
	var reqs, pre int64
	for i := range of {
		reqs += res.RequestsPerReplica[i]
		pre += res.PrefillTokens[i]
	}
	for g, name := range order {
		s := &out[g]
		s.Speed = name
		var rq, pf, after, all int64
		var win [maxWindows]int64
		snapped := false
		for i, p := range of {
			if p != name {
				continue
			}
			s.Replicas++
			rq += res.RequestsPerReplica[i]
			pf += res.PrefillTokens[i]
			if k.snapReq != nil && k.snapReq[i] >= 0 {
				// The group's replicas share their changes: all took their
				// snapshots at the same event.
				snapped = true
				after += res.RequestsPerReplica[i] - k.snapReq[i]
				all = reqs - k.snapAll[i]
				for w, n := range k.win[i] {
					win[w] += int64(n)
				}
			}
		}
		if reqs > 0 {
			s.Requests = float64(rq) / float64(reqs)
			s.PerReplica = s.Requests * float64(len(of)) / float64(s.Replicas)
		}
		if pre > 0 {
			s.Prefill = float64(pf) / float64(pre)
		}
		scale := float64(len(of)) / float64(s.Replicas)
		if snapped && all > 0 {
			v := float64(after) / float64(all) * scale
			s.AfterChange = &v
		}
		for w := range min(int64(maxWindows), all/SpeedWindow) {
			s.Windows = append(s.Windows, float64(win[w])/SpeedWindow*scale)
		}
	}
	return out
}

// speedHeader is the report header's statement of the speeds, "" when
// every replica runs at the preset's speed throughout.
func (r *Report) speedHeader() string {
	if len(r.ReplicaSpeeds) == 0 && len(r.SpeedChanges) == 0 {
		return ""
	}
	var b strings.Builder
	if len(r.ReplicaSpeeds) == 0 {
		b.WriteString("; compute speed 1 × the preset's")
	} else {
		b.WriteString("; compute speeds ")
		for i, v := range r.ReplicaSpeeds {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(strconv.FormatFloat(v, 'g', -1, 64))
		}
		b.WriteString(" × the preset's, cycled over the replicas")
	}
	for _, c := range r.SpeedChanges {
		fmt.Fprintf(&b, "; r%d at %v → %g×", c.Replica, c.At, c.Speed)
	}
	return b.String()
}

// writeSpeedTable writes each policy's share of the work by speed
// profile, when the speeds differ.
func (r *Report) writeSpeedTable(b *strings.Builder) {
	if len(r.Results) == 0 || len(r.Results[0].BySpeed) == 0 {
		return
	}
	fmt.Fprintf(b, "\nwork by replica speed (requests: share of all admitted; per replica: over the mean, 1 is an equal share; prefill: share of tokens computed):\n")
	for _, x := range r.Results {
		fmt.Fprintf(b, "  %s:", x.Policy)
		for i, s := range x.BySpeed {
			sep := ";"
			if i == 0 {
				sep = ""
			}
			after := ""
			if s.AfterChange != nil {
				after = fmt.Sprintf(", %.2f after the change", *s.AfterChange)
			}
			fmt.Fprintf(b, "%s speed %s ×%d: requests %s (%.2f per replica%s), prefill %s", sep, s.Speed, s.Replicas, pct(s.Requests), s.PerReplica, after, pct(s.Prefill))
		}
		b.WriteString("\n")
		for _, s := range x.BySpeed {
			if len(s.Windows) == 0 {
				continue
			}
			fmt.Fprintf(b, "    speed %s, per replica in each %d requests after the change:", s.Speed, SpeedWindow)
			for _, v := range s.Windows {
				fmt.Fprintf(b, " %.2f", v)
			}
			b.WriteString("\n")
		}
	}
}

// loneTTFTAt is Preset.LoneTTFT on a replica at speed s.
func (p Preset) loneTTFTAt(cached, n int, s float64) time.Duration {
	var t int64
	for pos := cached; n > 0; {
		c := min(n, p.MaxBatchTokens)
		t += max(1, int64(math.Round((p.StepOverhead+p.prefillCost(pos, c))/s*1e9)))
		pos += c
		n -= c
	}
	return time.Duration(t)
}

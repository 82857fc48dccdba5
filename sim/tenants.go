package sim

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// Multi-tenant workloads (issue 28): requests carry a tenant, the fairness
// id flow control groups them by, and a class, a priority and a TTFT
// objective. Both are drawn from a stream of their own, seeded by the
// run's seed, so the base workload's requests (arrivals and prompts) are
// the same whatever the tenants and classes.

// Class is a request class: a priority band and a time-to-first-token
// objective.
type Class struct {
	// Name labels the class in the report; required and unique.
	Name string
	// Priority is the band flow control holds the class's requests in:
	// higher dispatches first. Default 0.
	Priority int
	// SLO is the class's time-to-first-token objective; 0 means
	// Config.SLO.
	SLO time.Duration
	// TPOT is the class's time-per-output-token objective
	// (Request.TPOTSLO); 0, the default, is none.
	TPOT time.Duration
	// Share is the class's share of the requests, relative to the other
	// classes' shares; must be positive.
	Share float64
}

// TenantsConfig configures Tenants.
type TenantsConfig struct {
	// Base is the workload whose requests are given tenants and classes;
	// nil means the default workload's prompts (256 system prompts of
	// 4,096 tokens, a 128-token question, 256 output tokens) with
	// Requests and Rate.
	Base Workload
	// Requests is the nil Base's request count; 0 means 20,000.
	Requests int
	// Rate is the nil Base's Poisson rate per second; 0 means 40.
	Rate float64
	// Tenants is the number of tenants, 1..MaxGroups; 0 means no tenant
	// (requests carry none).
	Tenants int
	// Noisy is how many times more requests the first tenant sends than
	// each other tenant; 0 means 1 (all alike). With Noisy other than 1
	// the first tenant is called "noisy" and the others "quiet1",
	// "quiet2", …; otherwise "t0", "t1", ….
	Noisy float64
	// VaryOutput, when true, draws each request's output length uniformly
	// from 1..2×its length - 1 (the same mean): completions at fixed
	// lengths fall in step, and a concurrency limit then opens in bursts.
	// The nil Base sets it. Default false.
	VaryOutput bool
	// Only, if set, keeps only the requests of the tenant of that name,
	// at the arrivals they have in the full workload: the tenant's run
	// alone.
	Only string
	// Classes the requests are drawn from by Share; nil means none.
	Classes []Class
}

// MaxGroups is the most tenants, and the most classes, a report tells
// apart; requests of further tenants or classes (a trace's) are counted
// under "other".
const MaxGroups = 64

// Tenants returns c.Base's requests, each given a tenant (drawn with
// weight Noisy for the first, 1 for the others) and a class (by Share).
func Tenants(c TenantsConfig) (Workload, error) {
	if c.Base == nil {
		if err := checkGen("tenants", c.Requests, c.Rate); err != nil {
			return nil, err
		}
		b, err := SharedPrefix(SharedPrefixConfig{Requests: orDefault(c.Requests, 20000), Rate: orDefault(c.Rate, 40),
			Groups: 256, SystemTokens: 4096, QuestionTokens: 128, OutputTokens: 256})
		if err != nil {
			return nil, err
		}
		c.Base = b
		c.VaryOutput = true
	}
	c.Noisy = orDefault(c.Noisy, 1)
	switch {
	case c.Tenants < 0 || c.Tenants > MaxGroups:
		return nil, fmt.Errorf("%w: tenants: Tenants %d, want 0..%d", ErrInvalidConfig, c.Tenants, MaxGroups)
	case !(c.Noisy > 0) || math.IsInf(c.Noisy, 0):
		return nil, fmt.Errorf("%w: tenants: Noisy %v, want a finite factor > 0", ErrInvalidConfig, c.Noisy)
	case len(c.Classes) > MaxGroups:
		return nil, fmt.Errorf("%w: tenants: %d classes, at most %d", ErrInvalidConfig, len(c.Classes), MaxGroups)
	}
	seen := map[string]bool{}
	for i, k := range c.Classes {
		switch {
		case k.Name == "" || seen[k.Name]:
			return nil, fmt.Errorf("%w: tenants: Classes[%d] name %q is empty or repeated", ErrInvalidConfig, i, k.Name)
		case !(k.Share > 0) || math.IsInf(k.Share, 0):
			return nil, fmt.Errorf("%w: tenants: class %q Share %v, want > 0", ErrInvalidConfig, k.Name, k.Share)
		case k.SLO < 0:
			return nil, fmt.Errorf("%w: tenants: class %q SLO %v is negative", ErrInvalidConfig, k.Name, k.SLO)
		case k.TPOT < 0:
			return nil, fmt.Errorf("%w: tenants: class %q TPOT %v is negative", ErrInvalidConfig, k.Name, k.TPOT)
		}
		seen[k.Name] = true
	}
	w := &tenants{c: c}
	for i := range c.Tenants {
		w.names = append(w.names, tenantName(i, c.Noisy))
	}
	if c.Only != "" && !seen[c.Only] && !containsStr(w.names, c.Only) {
		return nil, fmt.Errorf("%w: tenants: Only %q names no tenant (have %v)", ErrInvalidConfig, c.Only, w.names)
	}
	return w, nil
}

func containsStr(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func tenantName(i int, noisy float64) string {
	switch {
	case noisy == 1:
		return "t" + strconv.Itoa(i)
	case i == 0:
		return "noisy"
	}
	return "quiet" + strconv.Itoa(i)
}

type tenants struct {
	c     TenantsConfig
	names []string
}

func (w *tenants) Name() string {
	s := w.c.Base.Name()
	if w.c.VaryOutput {
		s += " (output lengths drawn uniformly around that mean)"
	}
	if n := w.c.Tenants; n > 0 {
		s += fmt.Sprintf("; %d tenants", n)
		if w.c.Noisy != 1 {
			s += fmt.Sprintf(", %q sending %g× each other's requests", w.names[0], w.c.Noisy)
		}
	}
	for i, k := range w.c.Classes {
		sep := ", "
		if i == 0 {
			sep = "; classes "
		}
		slo := "the run's SLO"
		if k.SLO > 0 {
			slo = "SLO " + k.SLO.String()
		}
		if k.TPOT > 0 {
			slo += ", TPOT " + k.TPOT.String()
		}
		s += fmt.Sprintf("%s%s (priority %d, %s, share %g)", sep, k.Name, k.Priority, slo, k.Share)
	}
	if w.c.Only != "" {
		s += fmt.Sprintf("; only %q's requests", w.c.Only)
	}
	return s
}

func (w *tenants) BlockTokens() int { return w.c.Base.BlockTokens() }

func (w *tenants) Open(seed uint64) (Stream, error) {
	st, err := w.c.Base.Open(seed)
	if err != nil {
		return nil, err
	}
	return &tenantStream{w: w, base: st, rng: newRand(seed, 28)}, nil
}

type tenantStream struct {
	w    *tenants
	base Stream
	rng  interface{ Float64() float64 }
}

// draw picks an index by weights w(i), i < n.
func (s *tenantStream) draw(n int, w func(int) float64) int {
	sum := 0.0
	for i := range n {
		sum += w(i)
	}
	x := s.rng.Float64() * sum
	for i := range n - 1 {
		if x -= w(i); x < 0 {
			return i
		}
	}
	return n - 1
}

func (s *tenantStream) Next(r *Request) error {
	c := &s.w.c
	for {
		if err := s.base.Next(r); err != nil {
			return err
		}
		r.Tenant, r.Class, r.Priority, r.SLO, r.TPOTSLO = "", "", 0, 0, 0
		if c.VaryOutput && r.OutputTokens > 1 {
			r.OutputTokens = 1 + int(s.rng.Float64()*float64(2*r.OutputTokens-1))
		}
		if c.Tenants > 0 {
			r.Tenant = s.w.names[s.draw(c.Tenants, func(i int) float64 {
				if i == 0 {
					return c.Noisy
				}
				return 1
			})]
		}
		if len(c.Classes) > 0 {
			k := c.Classes[s.draw(len(c.Classes), func(i int) float64 { return c.Classes[i].Share })]
			r.Class, r.Priority, r.SLO, r.TPOTSLO = k.Name, k.Priority, k.SLO, k.TPOT
		}
		if c.Only == "" || c.Only == r.Tenant || c.Only == r.Class {
			return nil
		}
	}
}

func (s *tenantStream) Len() int {
	if s.w.c.Only != "" {
		return -1
	}
	return s.base.Len()
}

func (s *tenantStream) Close() error { return s.base.Close() }

// The classes of the interactive-batch workload: an interactive class
// (priority 1, 1 s TTFT objective, a quarter of the requests) and a batch
// class (priority 0, 30 s).
var (
	InteractiveClass = Class{Name: "interactive", Priority: 1, SLO: time.Second, Share: 1}
	BatchClass       = Class{Name: "batch", Priority: 0, SLO: 30 * time.Second, Share: 3}
)

// NoisyNeighbour returns the noisy-neighbour workload: the default
// workload's prompts, requests and rate (0: 20,000 at 40/s), from tenants
// tenants (0: 2) of which the first, "noisy", sends noisy (0: 5) times as
// many requests as each other; only, if set, keeps one tenant's requests.
func NoisyNeighbour(requests int, rate float64, tenants int, noisy float64, only string) (Workload, error) {
	return Tenants(TenantsConfig{Requests: requests, Rate: rate, Tenants: orDefault(tenants, 2), Noisy: orDefault(noisy, 5), Only: only})
}

// InteractiveBatch returns the interactive-batch workload: the default
// workload's prompts, requests and rate (0: 20,000 at 40/s), a quarter
// of them InteractiveClass, the rest BatchClass; only, if set, keeps one
// class's requests.
func InteractiveBatch(requests int, rate float64, only string) (Workload, error) {
	return Tenants(TenantsConfig{Requests: requests, Rate: rate, Classes: []Class{InteractiveClass, BatchClass}, Only: only})
}

// tenantHeader is a request's headers as Config.RateLimit's limiter
// reads them: every header is the tenant, so that a limit keyed by a
// header or by address keys each tenant apart.
type tenantHeader string

func (h tenantHeader) Get(string) string { return string(h) }

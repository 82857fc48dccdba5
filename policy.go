package gateway

import "fmt"

// Policy chooses a replica for a request among eligible candidates. It is
// the strategy behind a Gateway; the package provides RoundRobin,
// CacheAware and LoadAware, and other packages may implement their own.
//
// Pick is called with only eligible candidates (healthy, and within the
// latency SLO unless none is), never with an empty slice, and in a fixed
// order (the order replicas were added). Pick must not block, must not
// modify req or cands nor keep them after it returns, and must be safe for
// concurrent use.
type Policy interface {
	Pick(req *Request, cands []Candidate) Choice
}

// Request is what a Policy knows of the request being routed.
type Request struct {
	// Key is the request's prefix; never empty.
	Key Key
	// MaxMatched is the longest Candidate.Matched among the candidates.
	MaxMatched int
	// Demand is the share, 0..1, of recent requests whose longest prefix
	// held by a candidate was the same as this request's, Key[:MaxMatched]:
	// how hot that prefix is (see demand.go). 0 when MaxMatched is 0.
	Demand float64
	// Adapter is the LoRA adapter the request targets (RouteAdapter); ""
	// is the base model.
	Adapter string
}

// Candidate is one eligible replica as a Policy sees it.
type Candidate struct {
	// Name is the replica's name.
	Name string
	// Matched is how many leading blocks of the request's Key the
	// replica holds, according to the gateway's index.
	Matched int
	// Load is the replica's last reported load; Load.Latency is smoothed.
	Load Load
	// InFlight counts requests this gateway routed here that are not done.
	InFlight int
	// PendingPrefill counts uncached blocks routed here whose first token
	// has not been reported: prefill work queued or running.
	PendingPrefill int
	// AssignedPrefill counts the uncached blocks routed here since the
	// replica was added: the prefill work this gateway has sent it.
	AssignedPrefill int
	// CacheBlocks is the replica's prefix-cache capacity in blocks.
	CacheBlocks int
	// LoRA is the replica's state for the request's adapter (see
	// lora.go); the zero value for a request of the base model.
	LoRA LoRAState
}

// Outstanding is the replica's best-known count of unfinished requests:
// the larger of the gateway's own in-flight count (fresh, but blind to
// other gateways' traffic) and the engine's waiting plus running count
// (complete, but as old as the last scrape).
func (c *Candidate) Outstanding() int {
	return max(c.InFlight, c.Load.QueueDepth+c.Load.Running)
}

// Choice is a Policy's answer.
type Choice struct {
	// Index is the chosen candidate's position in the slice given to Pick.
	Index int
	// Kind is the kind of decision.
	Kind Kind
	// Fallback says why the policy fell back from its first preference,
	// if it did.
	Fallback Fallback
}

// Mode names one of the built-in policies. The zero value is
// ModeRoundRobin, the default.
type Mode int

// The built-in modes.
const (
	// ModeRoundRobin rotates across eligible replicas (RoundRobin).
	ModeRoundRobin Mode = iota
	// ModeCacheAware prefers the replica holding the longest prefix,
	// guarded by load (CacheAware).
	ModeCacheAware
	// ModeLoadAware picks the least loaded replica (LoadAware).
	ModeLoadAware
)

var modeNames = [...]string{"round_robin", "cache_aware", "load_aware"}

// String returns the mode's name: round_robin, cache_aware or load_aware.
func (m Mode) String() string {
	if m >= 0 && int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// ParseMode returns the Mode named s (round_robin, cache_aware or
// load_aware; hyphens are accepted for underscores).
func ParseMode(s string) (Mode, error) {
	for i, n := range modeNames {
		if s == n || s == hyphenate(n) {
			return Mode(i), nil
		}
	}
	return 0, fmt.Errorf("%w: mode %q, want round_robin, cache_aware or load_aware", ErrInvalidOption, s)
}

func hyphenate(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == '_' {
			b[i] = '-'
		}
	}
	return string(b)
}

// Kind is the kind of a routing decision. The zero value is
// KindRoundRobin.
type Kind int

// The kinds of decision.
const (
	// KindRoundRobin: chosen by rotation.
	KindRoundRobin Kind = iota
	// KindAffinity: chosen because it holds the longest cached prefix.
	KindAffinity
	// KindLoadAware: chosen for its load.
	KindLoadAware
	numKinds
)

var kindNames = [...]string{"round_robin", "affinity", "load_aware"}

// String returns round_robin, affinity or load_aware.
func (k Kind) String() string {
	if k >= 0 && k < numKinds {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Fallback is a set of reasons a decision fell back from its first
// preference. The zero value means no fallback.
type Fallback uint8

// The fallback reasons.
const (
	// FallbackNoMatch: no eligible replica holds any of the prefix, so
	// the cache-aware policy routed by load.
	FallbackNoMatch Fallback = 1 << iota
	// FallbackLoadGuard: a replica holds more of the prefix, but load made
	// another replica the better choice: its queue outweighed the prefill
	// the prefix saves, or the prefix is hot and being replicated to a less
	// loaded replica (CacheAware).
	FallbackLoadGuard
	// FallbackSLO: every healthy replica breaches the latency SLO, so the
	// gateway routed within the healthy set rather than to nothing.
	FallbackSLO
)

// String lists the reasons, comma-separated: no_match, load_guard, slo.
func (f Fallback) String() string {
	if f == 0 {
		return "none"
	}
	s := ""
	for i, n := range [...]string{"no_match", "load_guard", "slo"} {
		if f&(1<<i) != 0 {
			if s != "" {
				s += ","
			}
			s += n
		}
	}
	return s
}

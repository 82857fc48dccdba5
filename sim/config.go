package sim

import (
	"fmt"
	"time"

	"github.com/examlops/gateway/flow"
	fronts "github.com/examlops/gateway/internal/front"

	"github.com/examlops/gateway"
)

// IndexMode is how a simulated gateway keeps its cache index current.
type IndexMode int

// The index modes.
const (
	// IndexApproximate: routing records a request's blocks on the chosen
	// replica (the gateway's default).
	IndexApproximate IndexMode = iota
	// IndexExact: the index follows the replicas' cache events.
	IndexExact
)

// Config configures Run. The zero value simulates DefaultWorkload on 8
// replicas of DefaultPreset with DefaultPolicies.
type Config struct {
	// Workload is the request source; nil means DefaultWorkload().
	Workload Workload
	// Preset is the replica model; the zero value means DefaultPreset().
	Preset Preset
	// Replicas is the number of replicas; 0 means 8.
	Replicas int
	// Policies to compare, each simulated on the same requests; nil means
	// DefaultPolicies().
	Policies []Policy
	// Index is how the gateway's cache index is kept current: the zero
	// value, IndexApproximate, warms it at Route;
	// IndexExact feeds it the simulated replicas' cache events
	// (gateway.WithExactIndex).
	Index IndexMode
	// Gateways is the number of gateway replicas sharing the traffic,
	// each with its own index, in-flight counts and demand sketch (see
	// router): each request goes to one of them drawn at random, seeded by
	// Seed, so each sees about 1/Gateways of the requests. All are pushed
	// the same scraped load; with Index exact, all are fed every engine's
	// KV events. 0 means 1, one gateway; at most MaxGateways.
	Gateways int
	// SharePending, with Gateways > 1, has the gateways share their
	// pending prefill, as gateways configured with each other as peers
	// do (docs/multi-gateway.md): at every load refresh each gateway is
	// pushed, in gateway.Load.PeerPrefill, the sum of the other gateways'
	// PendingPrefill per replica as of that refresh, and keeps it until
	// the next. False, the default, shares nothing (gateways without
	// peers); it changes nothing with one gateway.
	SharePending bool
	// PeerRefreshInterval, with SharePending, is how often the gateways'
	// pending prefill is shared, apart from the engines' load (gateways
	// scraping each other more often than the engines, as the HTTP
	// gateway's --peer-scrape-interval): each gateway is then pushed, with
	// the engines' last load, the others' PendingPrefill as of that
	// moment. 0 shares it at every load refresh, as before.
	PeerRefreshInterval time.Duration
	// RefreshInterval is how often the replicas' load signals (queue depth,
	// running, KV utilisation) are pushed to the gateway; 0 means
	// DefaultRefreshInterval.
	RefreshInterval time.Duration
	// SLO is the time-to-first-token objective that SLO attainment counts
	// against; 0 means DefaultSLO.
	SLO time.Duration
	// RouterSLO, when positive, is passed to gateway.WithSLOLatency: the
	// gateway avoids replicas whose smoothed time to first token exceeds
	// it. Zero disables it.
	RouterSLO time.Duration
	// NonStreamed is the share, 0..1, of requests whose client does not
	// stream its answer. The HTTP gateway learns a request's first token
	// from the first byte of the response, which for a non-streamed
	// answer is its completion: for these requests the gateway's Decision
	// is told nothing at the first token, and Done, at completion, frees
	// the pending prefill. Which requests they are is drawn from Seed and
	// the request's number, the same for every policy. Reference policies
	// keep their own signals (a Tracker's Decision is told of every first
	// token:
	// Dynamo's frontend streams from the engine whatever the client asked;
	// the other peers do not use it). 0, the default, has every client
	// stream.
	NonStreamed float64
	// UpstreamStream models the gateway's fronts asking the engine to
	// stream a non-streamed request's answer and assembling it for the
	// client (both fronts do by default: exa serve gateway and exa serve
	// picker --upstream-stream): the gateway's own policies then hear
	// every first token, whatever NonStreamed says. The zero value, false,
	// forwards such requests unchanged, so that their first token is heard
	// at completion. exa simulate sets it from --upstream-stream (default
	// true).
	UpstreamStream bool
	// ObjectiveHeaders sends each request's own objectives (Request.SLO
	// and Request.TPOTSLO, as x-slo-ttft-ms and x-slo-tpot-ms) to the
	// router (gateway.Target.TTFT and TPOT): the gateway's policies and
	// the peers that read them (llmd_predicted) route by them. Default
	// false: objectives are only counted in the report. exa simulate sets
	// it from --slo-headers (default true).
	ObjectiveHeaders bool
	// Unattainable is what the gateway's fronts do with a request whose
	// objective (ObjectiveHeaders) no replica is predicted to meet, by
	// their own rule (internal/front.Objectives.Refuse): front.BestEffort,
	// the default, routes it anyway; front.Reject sheds it (a 429,
	// counted as shed "slo_unattainable"). The gateway's own policies
	// only; exa simulate sets it from --slo-unattainable.
	Unattainable fronts.Unattainable
	// PredictedRelease has the gateway's front release a non-streamed
	// request's pending prefill when its prefill is predicted over
	// (Decision.PredictedTTFT, known once first tokens of other requests
	// at its replica were seen) instead of at completion, as both fronts
	// do for answers they relay whole. The gateway's own policies only:
	// a peer's front hears such a first token at the end. Default false;
	// exa simulate sets it from --predicted-release (default true).
	PredictedRelease bool
	// CacheAtSchedule has each simulated engine cache a prefill's blocks
	// when the step that computes them is scheduled, as vLLM v1 does
	// (KVCacheManager.allocate_slots caches the full blocks up to the
	// tokens it schedules, before the forward pass): a request admitted
	// later in the same step, or in any later step, finds them, instead
	// of prefilling them again (a burst of one cold prompt). The blocks
	// stay pinned by the request computing them until it completes. The
	// zero value, false, caches them when that step ends, as every figure
	// in the docs was measured; exa simulate sets it from
	// --cache-at-schedule (default false).
	CacheAtSchedule bool
	// ReplicaSpeeds are the replicas' compute speeds, multipliers of the
	// preset's, cycled over the replicas: with {1, 0.5}, r0, r2, ... run at
	// the preset's speed and r1, r3, ... take twice as long for every step
	// (StepOverhead, prefill, decode and adapter loads all divided by the
	// multiplier). Each is MinSpeed..MaxSpeed; at most Replicas values.
	// Nil or empty, the default, runs every replica at speed 1, exactly as
	// the preset.
	ReplicaSpeeds []float64
	// SpeedChanges change replicas' speeds during the run (see
	// SpeedChange); at most MaxSpeedChanges. Nil, the default, changes
	// none.
	SpeedChanges []SpeedChange
	// Admission, when set, sheds requests the gateway's own policies (those
	// without Policy.Source) would route while no replica has room (see
	// Admission); peers run without it. The zero value sheds nothing.
	Admission gateway.Admission
	// RateLimit, when its Rate's PerSecond is positive, limits each
	// client's request rate in front of every policy, as the HTTP
	// gateway's --rate-limit does (flow.RateLimiter, the same decision):
	// each tenant (Request.Tenant; "" is one client) is a client, and each
	// simulated gateway keeps its own limiter, as each gateway process
	// does. A request over its tenant's rate is refused before routing
	// (Result.RateLimited, counted in Dropped and in its tenant's shed).
	// Its Key must be valid but changes nothing (the tenant is every
	// header and the address); its MaxClients must be 0 (every tenant is kept, so that the run
	// does not depend on which one a bounded limiter forgets). The zero
	// value limits nothing.
	RateLimit flow.RateLimit
	// FlowControl, when Enabled, holds the requests the gateway's own
	// policies would shed under Admission in a flow-control queue and
	// dispatches them as replicas get room (see FlowControl). The zero
	// value is off.
	FlowControl FlowControl
	// MaxQueue, when positive, caps each replica's waiting queue; requests
	// routed to a full queue are shed and counted as dropped. Zero means
	// unbounded.
	MaxQueue int
	// MaxLoras is each replica's number of LoRA adapter slots (vLLM's
	// --max-loras), for workloads whose requests name adapters; 0 means
	// DefaultMaxLoras (1), at most gateway.MaxAdapterSlots.
	MaxLoras int
	// AdapterLoad is how much longer a replica's step takes for each
	// adapter it loads into a slot; 0 means DefaultAdapterLoad (30 ms), a
	// negative value no cost. See lora.go.
	AdapterLoad time.Duration
	// Seed seeds the workload and the randomised policies; the same Config
	// gives the same Report.
	Seed uint64
	// Parallel is how many policies are simulated at once; 0 means
	// runtime.GOMAXPROCS(0).
	Parallel int
	// Progress, if set, is called as the run advances, at most a few
	// hundred times, never concurrently.
	Progress func(Progress)
}

// Defaults of Config.
const (
	// DefaultReplicas is the replica count when Config.Replicas is 0.
	DefaultReplicas = 8
	// DefaultRefreshInterval is 50 ms, the metrics refresh interval of the
	// Kubernetes Gateway API Inference Extension's endpoint picker.
	DefaultRefreshInterval = 50 * time.Millisecond
	// DefaultSLO is a 2 s time-to-first-token objective.
	DefaultSLO = 2 * time.Second
)

// Progress reports how far a Run has got, in requests summed over all
// policies and the bounds pass.
type Progress struct {
	// Done is the number of request arrivals simulated so far, counted
	// once per policy and once for the bounds pass; it only grows.
	Done int
	// Total is the number Done will reach, the workload's request count ×
	// (len(Config.Policies) + 1), or 0 when the workload does not say how
	// many requests it holds. The last call, made once Run has finished,
	// has Total >= Done, equal when the workload's count is right.
	Total int
}

func (c *Config) fill() error {
	if c.Workload == nil {
		c.Workload = DefaultWorkload()
	}
	if c.Preset == (Preset{}) {
		c.Preset = DefaultPreset()
	}
	if c.Replicas == 0 {
		c.Replicas = DefaultReplicas
	}
	if c.Policies == nil {
		c.Policies = DefaultPolicies()
	}
	if c.Gateways == 0 {
		c.Gateways = 1
	}
	if c.RefreshInterval == 0 {
		c.RefreshInterval = DefaultRefreshInterval
	}
	if c.SLO == 0 {
		c.SLO = DefaultSLO
	}
	if c.MaxLoras == 0 {
		c.MaxLoras = DefaultMaxLoras
	}
	switch {
	case c.AdapterLoad == 0:
		c.AdapterLoad = DefaultAdapterLoad
	case c.AdapterLoad < 0:
		c.AdapterLoad = 0
	}
	switch {
	case c.Replicas < 0 || c.Replicas > gateway.MaxReplicas:
		return fmt.Errorf("%w: Replicas %d, want 1..%d", ErrInvalidConfig, c.Replicas, gateway.MaxReplicas)
	case len(c.Policies) == 0:
		return fmt.Errorf("%w: Policies is empty", ErrInvalidConfig)
	case c.RefreshInterval < 0:
		return fmt.Errorf("%w: RefreshInterval %v is negative", ErrInvalidConfig, c.RefreshInterval)
	case c.PeerRefreshInterval < 0:
		return fmt.Errorf("%w: PeerRefreshInterval %v is negative", ErrInvalidConfig, c.PeerRefreshInterval)
	case c.SLO < 0:
		return fmt.Errorf("%w: SLO %v is negative", ErrInvalidConfig, c.SLO)
	case c.RouterSLO < 0:
		return fmt.Errorf("%w: RouterSLO %v is negative", ErrInvalidConfig, c.RouterSLO)
	case !(c.NonStreamed >= 0 && c.NonStreamed <= 1):
		return fmt.Errorf("%w: NonStreamed %v, want 0..1", ErrInvalidConfig, c.NonStreamed)
	case c.MaxQueue < 0:
		return fmt.Errorf("%w: MaxQueue %d is negative", ErrInvalidConfig, c.MaxQueue)
	case c.Gateways < 0 || c.Gateways > MaxGateways:
		return fmt.Errorf("%w: Gateways %d, want 1..%d", ErrInvalidConfig, c.Gateways, MaxGateways)
	case c.Parallel < 0:
		return fmt.Errorf("%w: Parallel %d is negative", ErrInvalidConfig, c.Parallel)
	case c.MaxLoras < 0 || c.MaxLoras > gateway.MaxAdapterSlots:
		return fmt.Errorf("%w: MaxLoras %d, want 1..%d", ErrInvalidConfig, c.MaxLoras, gateway.MaxAdapterSlots)
	case c.AdapterLoad > time.Hour:
		return fmt.Errorf("%w: AdapterLoad %v, at most an hour", ErrInvalidConfig, c.AdapterLoad)
	case c.Index != IndexApproximate && c.Index != IndexExact:
		return fmt.Errorf("%w: Index %d unknown", ErrInvalidConfig, int(c.Index))
	}
	if err := validSpeeds(c); err != nil {
		return err
	}
	if err := validAdmission(c.Admission); err != nil {
		return err
	}
	if c.RateLimit.Rate.PerSecond != 0 {
		if err := c.RateLimit.Validate(); err != nil {
			return fmt.Errorf("%w: RateLimit: %w", ErrInvalidConfig, err)
		}
	}
	if c.RateLimit.MaxClients != 0 {
		// A bounded limiter forgets clients in the map's random order:
		// the run would depend on it. Tenants are at most MaxGroups.
		return fmt.Errorf("%w: RateLimit.MaxClients %d: the simulator keeps every tenant; leave it 0", ErrInvalidConfig, c.RateLimit.MaxClients)
	}
	if err := validFlow(c); err != nil {
		return err
	}
	if err := c.Preset.validate(); err != nil {
		return err
	}
	bt := c.Workload.BlockTokens()
	if bt < 1 {
		return fmt.Errorf("%w: workload block size %d tokens", ErrInvalidConfig, bt)
	}
	if blocks := c.Preset.KVTokens / bt; blocks < 1 || blocks > gateway.MaxCacheBlocks {
		return fmt.Errorf("%w: preset %q: %d KV tokens make %d blocks of %d tokens, want 1..%d",
			ErrInvalidConfig, c.Preset.Name, c.Preset.KVTokens, blocks, bt, gateway.MaxCacheBlocks)
	}
	seen := map[string]bool{}
	for i, p := range c.Policies {
		if p.Name == "" {
			return fmt.Errorf("%w: Policies[%d] has no Name", ErrInvalidConfig, i)
		}
		if seen[p.Name] {
			return fmt.Errorf("%w: policy %q listed twice", ErrInvalidConfig, p.Name)
		}
		if p.New == nil {
			if _, err := p.Mode.MarshalText(); err != nil {
				return fmt.Errorf("%w: policy %q: Mode %d is not a built-in gateway.Mode", ErrInvalidConfig, p.Name, int(p.Mode))
			}
		}
		seen[p.Name] = true
	}
	return nil
}

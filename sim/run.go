package sim

import (
	"runtime"
	"slices"
	"sync"
)

// Run simulates every policy of cfg on the same requests, computes the
// bounds, and returns the report. It is deterministic: the same cfg gives
// the same Report. Errors start with "gateway:" and wrap ErrInvalidConfig
// (a policy the gateway refuses also wraps the gateway's error) or, for a
// bad trace line, ErrMalformedTrace, or, for a simulation that stopped
// making progress (a simulator bug), ErrStalled.
func Run(cfg Config) (*Report, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	bt := cfg.Workload.BlockTokens()
	capacity := cfg.Preset.KVTokens / bt
	rep := &Report{
		Workload:        cfg.Workload.Name(),
		Preset:          cfg.Preset,
		Replicas:        cfg.Replicas,
		BlockTokens:     bt,
		CacheBlocks:     capacity,
		Index:           indexName(cfg.Index),
		Gateways:        gatewaysField(cfg.Gateways),
		SharePending:    cfg.SharePending && cfg.Gateways > 1,
		NonStreamed:     cfg.NonStreamed,
		UpstreamStream:  cfg.UpstreamStream && cfg.NonStreamed > 0,
		CacheAtSchedule: cfg.CacheAtSchedule,
		RateLimit:       cfg.RateLimit.Rate,
		RefreshInterval: cfg.RefreshInterval.Seconds(),
		SLO:             cfg.SLO.Seconds(),
		Seed:            cfg.Seed,
		Results:         make([]Result, len(cfg.Policies)),
	}
	if cfg.SharePending && cfg.Gateways > 1 {
		rep.PeerRefreshInterval = cfg.PeerRefreshInterval.Seconds()
	}
	if cfg.mixedSpeeds() {
		rep.ReplicaSpeeds, rep.SpeedChanges = slices.Clone(cfg.ReplicaSpeeds), byAt(cfg.SpeedChanges)
	}

	var pmu sync.Mutex
	done, total := 0, 0
	if st, err := cfg.Workload.Open(cfg.Seed); err == nil {
		if n := st.Len(); n > 0 {
			total = n * (len(cfg.Policies) + 1)
			rep.Requests = n
		}
		st.Close()
	}
	lastShown := -1
	tick := func() {}
	if cfg.Progress != nil {
		step := max(1, total/200)
		if total == 0 {
			step = 4096
		}
		tick = func() {
			pmu.Lock()
			done++
			if done/step != lastShown {
				lastShown = done / step
				cfg.Progress(Progress{Done: done, Total: total})
			}
			pmu.Unlock()
		}
	}

	par := cfg.Parallel
	if par == 0 {
		par = runtime.GOMAXPROCS(0)
	}
	jobs := make(chan int)
	errs := make([]error, len(cfg.Policies)+1)
	var wg sync.WaitGroup
	for range min(par, len(cfg.Policies)+1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				errs[j] = runJob(&cfg, j, rep, capacity, tick)
			}
		}()
	}
	for j := range len(cfg.Policies) + 1 {
		jobs <- j
	}
	close(jobs)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	if rep.Requests == 0 && len(rep.Results) > 0 {
		rep.Requests = rep.Results[0].Requests
	}
	if len(rep.Results) > 0 && rep.Results[0].LoRA != nil {
		rep.MaxLoras, rep.AdapterLoad = cfg.MaxLoras, cfg.AdapterLoad.Seconds()
	}
	for i := range rep.Results {
		if rep.Ideal.Mean > 0 {
			rep.Results[i].IdealRatio = rep.Results[i].TTFT.Mean / rep.Ideal.Mean
		}
	}
	if cfg.Progress != nil {
		cfg.Progress(Progress{Done: done, Total: max(total, done)})
	}
	return rep, nil
}

// runJob runs job j: policy j, or the bounds for j == len(Policies).
func runJob(cfg *Config, j int, rep *Report, capacity int, tick func()) error {
	st, err := cfg.Workload.Open(cfg.Seed)
	if err != nil {
		return err
	}
	defer st.Close()
	if j == len(cfg.Policies) {
		var ideal hist
		pooled, unb, err := bounds(st, cfg.Workload.BlockTokens(), capacity*cfg.Replicas, capacity, cfg.Preset, cfg.fastest(), &ideal, tick)
		if err != nil {
			return err
		}
		rep.PooledLRU, rep.Unbounded = pooled, unb
		rep.Ideal = latencyOf(&ideal)
		return nil
	}
	pol := cfg.Policies[j]
	e, err := newEngine(cfg, pol)
	if err != nil {
		return err
	}
	if err := e.run(st, tick); err != nil {
		// The stream fails a run, the same way for every policy, or a
		// stall (ErrStalled): the error already starts with "gateway:"
		// and wraps the sentinel.
		return err
	}
	rep.Results[j] = e.result()
	if cfg.mixedSpeeds() {
		rep.Results[j].BySpeed = e.bySpeed(&rep.Results[j])
	}
	if l := rep.Results[j].LoRA; l != nil {
		l.Handling = pol.Adapters
	}
	return nil
}

func indexName(m IndexMode) string {
	if m == IndexExact {
		return "exact"
	}
	return "approximate"
}

// gatewaysField is Report.Gateways: n when more than one, else 0.
func gatewaysField(n int) int {
	if n > 1 {
		return n
	}
	return 0
}

package fleet

import (
	"fmt"
	"net/url"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
)

// planPD builds the table of a disaggregated model served by its pools:
// a load-aware gateway over the decode pool (the model's gw) and a
// cache-aware one over the prefill pool, both kept across reloads that
// leave the routing options alone, as planModel keeps a model's gateway.
// A decode pool without replicas leaves the model without a gateway (503);
// a prefill pool without replicas leaves every request co-located
// (fallback prefill_unavailable).
func (s *Fleet) planPD(name string, cfg config.Model, old, next *State) (modelPlan, error) {
	prefill, decode := cfg.Pools[cfg.PrefillPool], cfg.Pools[cfg.DecodePool]
	ms := &Model{Name: name, Cfg: cfg, ByName: make(map[string]*Endpoint, len(prefill)+len(decode)),
		Disaggregate: true, Mode: gateway.ModeLoadAware}
	pwant, err := s.tableOf(ms, prefill, cfg.PrefillPool, old, next)
	if err != nil {
		return modelPlan{}, err
	}
	dwant, err := s.tableOf(ms, decode, cfg.DecodePool, old, next)
	if err != nil {
		return modelPlan{}, err
	}
	s.attach(ms)
	if len(dwant) == 0 {
		ms.NoReplicas = true
		s.log.Warn("gateway: disaggregated model's decode pool has no replicas; it answers 503 until it has",
			"model", name, "pool", cfg.DecodePool)
		return modelPlan{ms: ms}, nil
	}
	pd := &Disagg{
		Sidecar:        cfg.PDModeName() == config.PDModeSidecar,
		MinUncached:    cfg.MinUncachedTokens(),
		tokensPerBlock: max(1, s.opts.BlockSize/bytesPerToken),
		hostPort:       make(map[string]string, len(pwant)),
		PrefillNames:   make(map[string]bool, len(pwant)),
		exactBS:        ms.ExactBlockSize,
		Counters:       new(DisaggCounters),
	}
	for _, r := range pwant {
		pd.PrefillNames[r.Name] = true
		u, err := url.Parse(r.Address)
		if err != nil { // config.ValidateAddress accepted it, so url.Parse does
			return modelPlan{}, &config.FieldError{Field: "models." + name + ".pools." + cfg.PrefillPool, Value: r.Address, Reason: err.Error()}
		}
		pd.hostPort[r.Address] = u.Host
	}
	var opts []gateway.Option
	if cfg.SLOLatencyMS > 0 {
		opts = append(opts, gateway.WithSLOLatency(cfg.SLOLatency()))
	}
	if cfg.Exact() {
		// Both pools' indexes follow their engines' KV events (exact.go):
		// the prefill pool's informs its cache-aware choice, the decode
		// pool's the decider.
		opts = append(opts, gateway.WithExactIndex())
	}
	opts = append(append(opts, gateway.WithClock(s.opts.Clock)), s.opts.GatewayOptions...) // as in reload.go
	dpol := &gateway.LoadAware{}                                                           // the decode pool's policy, with the model's weights
	if cfg.LoadWeights != nil {
		dpol.Weights = cfg.LoadWeights.Gateway()
	}
	dopts := append([]gateway.Option{gateway.WithPolicy(dpol)}, opts...)
	popts := append([]gateway.Option{gateway.WithMode(gateway.ModeCacheAware)}, opts...)

	plan := modelPlan{ms: ms, want: dwant, opts: dopts, pwant: pwant, popts: popts}
	prev := old.Models[name]
	reuse := prev != nil && prev.PD != nil && prev.Gateway != nil && sameRouting(prev.Cfg, cfg)
	dis := &gateway.PD{MinUncached: pd.MinUncached}
	if reuse {
		dis.Decode, plan.keep = prev.Gateway, prev.Gateway
		pd.Counters = prev.PD.Counters
	} else if dis.Decode, err = s.newGateway(dwant, dopts...); err != nil {
		return modelPlan{}, fmt.Errorf("%w (model %q, pool %q)", err, name, cfg.DecodePool)
	}
	if len(pwant) > 0 {
		if reuse && prev.PD.Plan.Prefill != nil {
			dis.Prefill, plan.pkeep = prev.PD.Plan.Prefill, prev.PD.Plan.Prefill
		} else if dis.Prefill, err = s.newGateway(pwant, popts...); err != nil {
			return modelPlan{}, fmt.Errorf("%w (model %q, pool %q)", err, name, cfg.PrefillPool)
		}
	}
	pd.Plan = dis
	ms.Gateway, ms.PD = dis.Decode, pd
	return plan, nil
}

// servedReplicas returns the replicas that serve a model as its routing
// table names them: the members of its prefill then decode pool, named
// pool/name, when it is served by its pools (servedByPools), else its
// replicas.
func servedReplicas(cfg config.Model) []config.Replica {
	if !servedByPools(cfg) {
		return cfg.Replicas
	}
	var out []config.Replica
	for _, pool := range []string{cfg.PrefillPool, cfg.DecodePool} {
		for _, r := range cfg.Pools[pool] {
			r.Name = pool + "/" + r.Name
			out = append(out, r)
		}
	}
	return out
}

// prefillGateway returns the prefill pool's gateway of a disaggregated
// model, nil for other models and an empty prefill pool.
func (m *Model) prefillGateway() *gateway.Gateway {
	if m.PD == nil {
		return nil
	}
	return m.PD.Plan.Prefill
}

// gatewayOf returns the gateway that routes the model's replica name: the
// prefill pool's for a prefill replica of a disaggregated model, else gw.
func (m *Model) gatewayOf(name string) *gateway.Gateway {
	if m.PD != nil && m.PD.PrefillNames[name] {
		return m.PD.Plan.Prefill
	}
	return m.Gateway
}

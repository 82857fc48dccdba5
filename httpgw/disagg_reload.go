package httpgw

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
func (s *Server) planPD(name string, cfg config.Model, old, next *state) (modelPlan, error) {
	prefill, decode := cfg.Pools[cfg.PrefillPool], cfg.Pools[cfg.DecodePool]
	ms := &modelState{name: name, cfg: cfg, byName: make(map[string]*endpoint, len(prefill)+len(decode)),
		disaggr: true, mode: gateway.ModeLoadAware}
	pwant, err := s.tableOf(ms, prefill, cfg.PrefillPool, old, next)
	if err != nil {
		return modelPlan{}, err
	}
	dwant, err := s.tableOf(ms, decode, cfg.DecodePool, old, next)
	if err != nil {
		return modelPlan{}, err
	}
	ms.mm = newModelMetrics(ms.order)
	if cfg.Exact() {
		ms.exactBS, ms.exactCnt = cfg.TokenBlockSize(), s.kv.countersOf(name)
	}
	if len(dwant) == 0 {
		ms.noReps = true
		s.log.Warn("gateway: disaggregated model's decode pool has no replicas; it answers 503 until it has",
			"model", name, "pool", cfg.DecodePool)
		return modelPlan{ms: ms}, nil
	}
	pd := &pdState{
		sidecar:        cfg.PDModeName() == config.PDModeSidecar,
		minUncached:    cfg.MinUncachedTokens(),
		tokensPerBlock: max(1, s.opts.BlockSize/bytesPerToken),
		hostPort:       make(map[string]string, len(pwant)),
		prefillNames:   make(map[string]bool, len(pwant)),
		exactBS:        ms.exactBS,
		counters:       new(pdCounters),
	}
	for _, r := range pwant {
		pd.prefillNames[r.Name] = true
		u, err := url.Parse(r.Address)
		if err != nil { // config.ValidateAddress accepted it, so url.Parse does
			return modelPlan{}, &config.FieldError{Field: "models." + name + ".pools." + cfg.PrefillPool, Value: r.Address, Reason: err.Error()}
		}
		pd.hostPort[r.Name] = u.Host
	}
	var opts []gateway.Option
	if cfg.SLOLatencyMS > 0 {
		opts = append(opts, gateway.WithSLOLatency(cfg.SLOLatency()))
	}
	if cfg.Exact() {
		// Both pools' indexes follow their engines' KV events (exact.go):
		// the prefill pool's informs its cache-aware choice, the decode
		// pool's the decider.
		opts = append(opts, gateway.WithIndex(gateway.IndexExact))
	}
	opts = append(opts, s.opts.GatewayOptions...)
	dpol := &gateway.LoadAware{} // the decode pool's policy, with the model's weights
	if cfg.LoadWeights != nil {
		dpol.Weights = cfg.LoadWeights.Gateway()
	}
	dopts := append([]gateway.Option{gateway.WithPolicy(dpol)}, opts...)
	popts := append([]gateway.Option{gateway.WithMode(gateway.ModeCacheAware)}, opts...)

	plan := modelPlan{ms: ms, want: dwant, opts: dopts, pwant: pwant, popts: popts}
	prev := old.models[name]
	reuse := prev != nil && prev.pd != nil && prev.gw != nil && sameRouting(prev.cfg, cfg)
	dis := &gateway.PD{MinUncached: pd.minUncached}
	if reuse {
		dis.Decode, plan.keep = prev.gw, prev.gw
		pd.counters = prev.pd.counters
	} else if dis.Decode, err = s.newGateway(dwant, dopts...); err != nil {
		return modelPlan{}, fmt.Errorf("%w (model %q, pool %q)", err, name, cfg.DecodePool)
	}
	if len(pwant) > 0 {
		if reuse && prev.pd.dis.Prefill != nil {
			dis.Prefill, plan.pkeep = prev.pd.dis.Prefill, prev.pd.dis.Prefill
		} else if dis.Prefill, err = s.newGateway(pwant, popts...); err != nil {
			return modelPlan{}, fmt.Errorf("%w (model %q, pool %q)", err, name, cfg.PrefillPool)
		}
	}
	pd.dis = dis
	ms.gw, ms.pd = dis.Decode, pd
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
func (m *modelState) prefillGateway() *gateway.Gateway {
	if m.pd == nil {
		return nil
	}
	return m.pd.dis.Prefill
}

// gatewayOf returns the gateway that routes the model's replica name: the
// prefill pool's for a prefill replica of a disaggregated model, else gw.
func (m *modelState) gatewayOf(name string) *gateway.Gateway {
	if m.pd != nil && m.pd.prefillNames[name] {
		return m.pd.dis.Prefill
	}
	return m.gw
}

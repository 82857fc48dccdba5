package fleet

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Run runs the background loops until ctx is done: configuration reloads
// every ReloadInterval (when ConfigPath is set), /health probes every
// ProbeInterval, /metrics scrapes every ScrapeInterval, LoRA adapter
// discovery (GET /v1/models) every DiscoverInterval and, with the
// default transport, closing of connections idle too long to be reused.
// When ctx is done it closes the default transport's idle connections
// and returns ctx.Err(). Serving requests does not need Run, but without it engines
// are ejected only passively, never readmitted, and load is not scraped.
// While Run runs, Apply also scrapes each engine it adds once, at once,
// for its KV-cache size (see learnCapacity).
func (s *Fleet) Run(ctx context.Context) error {
	s.running.Store(&ctx)
	defer s.running.Store(nil)
	var wg sync.WaitGroup
	loop := func(every time.Duration, f func(context.Context)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(every)
			defer t.Stop()
			for {
				f(ctx)
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		}()
	}
	if s.opts.ConfigPath != "" {
		loop(s.opts.ReloadInterval, func(context.Context) { _, _ = s.Reload() })
	}
	loop(s.opts.ProbeInterval, s.ProbeAll)
	// Engines and peers are scraped in loops of their own: a slow peer
	// never delays the engines' load.
	loop(s.opts.ScrapeInterval, s.scrapeEngines)
	loop(s.opts.PeerScrapeInterval, s.ScrapePeers)
	loop(s.opts.DiscoverInterval, s.DiscoverAll)
	loop(s.opts.DiscoverInterval, s.DiscoverModelInfo)
	if s.pool != nil {
		loop(s.pool.IdleTimeout(), func(context.Context) { s.pool.Prune() })
	}
	wg.Wait()
	_ = s.Close()
	return ctx.Err()
}

// eachEndpoint calls f concurrently for every configured engine and waits.
func (s *Fleet) eachEndpoint(ctx context.Context, f func(context.Context, *Endpoint)) {
	st := s.state.Load()
	var wg sync.WaitGroup
	for _, ep := range st.Endpoints {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(ctx, ep)
		}()
	}
	wg.Wait()
}

// ProbeAll probes every engine's /health once and ejects or readmits
// engines as the thresholds say. Run calls it every ProbeInterval.
func (s *Fleet) ProbeAll(ctx context.Context) {
	s.eachEndpoint(ctx, func(ctx context.Context, ep *Endpoint) {
		ok, cause := probe(ctx, s.control, ep.Base)
		if ok {
			s.Observe(ep, ep.Health.Success(true))
			return
		}
		if ctx.Err() != nil {
			return
		}
		s.countAt(s.metrics.probeFails, ep)
		s.Observe(ep, ep.Health.probeFailure(cause))
	})
}

// ScrapeAll scrapes every engine's /metrics once and feeds the load into
// the gateway of each model it serves; at the same time it scrapes every
// model's peer gateways (config.Model.Peers) and, once both are done,
// feeds each replica's gateway the pending prefill the peers report
// there (gateway.Load.PeerPrefill; peers.go). A peer that does not answer
// within ProbeTimeout (at most PeerScrapeInterval) is skipped; its last
// counts are used for 3 peer scrape intervals, then dropped. Run does the
// same in two loops: the engines' scrapes every ScrapeInterval, and
// ScrapePeers every PeerScrapeInterval.
func (s *Fleet) ScrapeAll(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.scrapePeers(ctx)
	}()
	s.scrapeEngines(ctx)
	<-done
	s.pushPeerPrefill()
}

// scrapeEngines scrapes every engine's /metrics once, with the metric
// names of its engine type, and feeds the load, with the peers' last
// pending prefill, into the gateway of each model it serves.
func (s *Fleet) scrapeEngines(ctx context.Context) {
	st := s.state.Load()
	var resized atomic.Bool
	peers := roundPeers{s: s}
	s.eachEndpoint(ctx, func(ctx context.Context, ep *Endpoint) {
		engine := s.engineTypeOf(st, ep)
		res, err := scrape(ctx, s.control, ep.Base, engine, s.custom, s.scrapeBudget)
		if err == nil && res.kvTokens > 0 && ep.kvTokens.Swap(res.kvTokens) != res.kvTokens {
			s.log.Info("gateway: engine KV-cache size", "engine", ep.Base, "tokens", res.kvTokens)
			resized.Store(true)
		}
		l, rep := res.load, res.adapters
		l.At = s.opts.Clock() // its age, kept when the peers' counts are passed on
		ep.feed.Lock()
		defer ep.feed.Unlock()
		ep.setLoad(l, err)
		if err != nil {
			if ctx.Err() == nil {
				s.countAt(s.metrics.scrapeErrors, ep)
			}
			return
		}
		s.noteEngine(ep, engine, res.engine)
		if rep != nil {
			ep.lora.report.Store(rep)
		}
		s.eachReplicaOf(ep, func(m *Model, name string) {
			l := l
			l.PeerPrefill = peers.at(m, name)
			if err := m.gatewayOf(name).UpdateLoad(name, l); err != nil {
				s.log.Warn("gateway: load update rejected", "model", m.Name, "replica", name, "err", err)
			}
			if rep != nil {
				if err := m.gatewayOf(name).UpdateAdapters(name, *rep); err != nil {
					s.log.Warn("gateway: adapter report rejected", "model", m.Name, "replica", name, "err", err)
				}
			}
		})
	})
	s.pruneEngines(s.state.Load())
	if resized.Load() {
		// An engine reported its KV-cache size for the first time, or a
		// new one: replicas that leave cache_blocks unset take it up.
		if err := s.reapply(); err != nil {
			s.log.Warn("gateway: applying the engines' KV-cache sizes failed", "err", err)
		}
	}
}

// eachReplicaOf calls fn for every replica, of every model with a gateway,
// that ep serves in the current state.
func (s *Fleet) eachReplicaOf(ep *Endpoint, fn func(m *Model, name string)) {
	for _, m := range s.state.Load().Models {
		if m.Gateway == nil {
			continue
		}
		for name, e := range m.ByName {
			if e == ep {
				fn(m, name)
			}
		}
	}
}

// Observe applies a health transition of ep to every model that uses it.
// An ejection that would take more than Options.MaxEjectionPercent of a
// model's engines out (EjectionAllowed) is refused: ep stays in, and the
// first refusal since it last succeeded is logged.
func (s *Fleet) Observe(ep *Endpoint, ev HealthEvent) {
	if ev == healthNoChange {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.configured(ep) {
		// A reload removed it (a request or probe begun before): no
		// replica to mark, and no series of its address to count again.
		return
	}
	switch ev {
	case healthEjected:
		c := ep.Health.Cause()
		if ok, ejected, total := s.allowEjection(ep); !ok {
			s.metrics.ejectionsCapped.WithLabelValues(c.Source.String(), c.Reason.String()).Inc()
			if ep.Health.refuse() {
				s.log.Warn("gateway: engine not ejected: at the ejection cap", "address", ep.Base,
					"source", c.Source.String(), "reason", c.Reason.String(), "detail", c.Detail,
					"ejected", ejected, "engines", total, "max_ejection_percent", s.opts.MaxEjectionPercent)
			}
			// An Apply between the failure and this refusal read ep as
			// ejected and marked its replicas unhealthy: mark them as
			// ep now is, or no probe would bring them back.
			healthy := ep.Health.Healthy()
			s.eachReplicaOf(ep, func(m *Model, name string) { _ = m.gatewayOf(name).SetHealthy(name, healthy) })
			return
		}
		ep.Health.hold()
		s.metrics.ejections.WithLabelValues(ep.Base, c.Source.String(), c.Reason.String()).Inc()
		s.log.Warn("gateway: engine ejected", "address", ep.Base,
			"source", c.Source.String(), "reason", c.Reason.String(), "detail", c.Detail)
		// On the exact index, its blocks leave the index: it may come
		// back with an empty cache (see kvRuntime.resetEngines).
		if n := s.kv.resetEngines(s.state.Load().KV, ep); n > 0 {
			s.log.Info("gateway: KV events of an ejected engine reset", "address", ep.Base, "engines", n)
		}
	case healthReadmitted:
		s.metrics.readmissions.WithLabelValues(ep.Base).Inc()
		s.log.Info("gateway: engine readmitted", "address", ep.Base)
	}
	healthy := ep.Health.Healthy()
	s.eachReplicaOf(ep, func(m *Model, name string) { _ = m.gatewayOf(name).SetHealthy(name, healthy) })
}

// configured reports whether ep is an engine of the current state; s.mu
// held, so that no Apply removes it (and its series) meanwhile.
func (s *Fleet) configured(ep *Endpoint) bool { return s.state.Load().Endpoints[ep.Base] == ep }

// countAt counts one in c's series of ep's address, unless a reload
// removed ep while it was being probed or scraped: dropStaleSeries
// deleted that series, and counting it again would keep it for good.
func (s *Fleet) countAt(c *prometheus.CounterVec, ep *Endpoint) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.configured(ep) {
		c.WithLabelValues(ep.Base).Inc()
	}
}

package fleet

import (
	"slices"
	"strings"
	"sync"

	"github.com/examlops/gateway/config"
)

// engineTable records, per engine address, the engine type whose metric
// names its last /metrics page had, so that /stats shows it and a page
// with no known load series is warned about once, not at every scrape.
// The zero value is empty; safe for concurrent use.
type engineTable struct {
	mu sync.Mutex
	m  map[string]engineSeen // by address; only configured addresses (prune)
}

// engineSeen is what the last successful scrape of one engine found.
type engineSeen struct {
	configured string // the type its models name, "" for autodetection
	detected   string // the type whose series the page had, "" none
}

// engineTypeOf returns the engine type configured for ep: that of the
// first model, in name order, that names one and routes to ep; "" (auto)
// when none does.
func (s *Fleet) engineTypeOf(st *State, ep *Endpoint) string {
	var names []string
	for name, m := range st.Models {
		if m.Cfg.Engine == config.EngineAuto {
			continue
		}
		for _, e := range m.ByName {
			if e == ep {
				names = append(names, name)
				break
			}
		}
	}
	if len(names) == 0 {
		return config.EngineAuto
	}
	return st.Models[slices.Min(names)].Cfg.Engine
}

// noteEngine records what ep's page showed, logging a warning when it has
// no load series of the expected type (the engine then reads as idle)
// and a note when it has them again.
func (s *Fleet) noteEngine(ep *Endpoint, configured, detected string) {
	t := &s.engines
	t.mu.Lock()
	old, seen := t.m[ep.Base]
	if t.m == nil {
		t.m = map[string]engineSeen{}
	}
	now := engineSeen{configured: configured, detected: detected}
	t.m[ep.Base] = now
	t.mu.Unlock()
	if seen && old == now {
		return
	}
	switch {
	case detected == "":
		s.log.Warn("gateway: engine metrics page has none of the expected load series; its load reads as zero",
			"address", ep.Base, "engine", s.engineLabel(configured), "expected", s.expectedSeries(configured),
			"fix", "set the model's engine type: exa serve routing set MODEL --engine vllm|sglang|trtllm")
	case seen && old.detected == "" || !seen && configured == config.EngineAuto && detected != config.EngineVLLM && detected != EngineCustom:
		s.log.Info("gateway: engine load series found", "address", ep.Base, "engine", detected)
	}
}

// engineOf returns the type whose names ep's last successful scrape read,
// and a warning when it found none; "", "" before any scrape.
func (s *Fleet) engineOf(ep *Endpoint) (engine, warning string) {
	t := &s.engines
	t.mu.Lock()
	e, ok := t.m[ep.Base]
	t.mu.Unlock()
	if !ok || e.detected != "" {
		return e.detected, ""
	}
	return "", "no " + s.engineLabel(e.configured) + " load series on the metrics page (" + s.expectedSeries(e.configured) + "); load reads as zero"
}

// pruneEngines forgets the addresses no longer configured.
func (s *Fleet) pruneEngines(st *State) {
	t := &s.engines
	t.mu.Lock()
	defer t.mu.Unlock()
	for a := range t.m {
		if st.Endpoints[a] == nil {
			delete(t.m, a)
		}
	}
}

func (s *Fleet) engineLabel(engine string) string {
	switch {
	case engine == config.EngineAuto && s.custom != nil:
		return "configured (" + EngineCustom + ")"
	case engine == config.EngineAuto:
		return "known"
	}
	return engine
}

// expectedSeries names the waiting-request series of the engine type (of
// every type for autodetection, the configured ones with
// Options.EngineMetrics).
func (s *Fleet) expectedSeries(engine string) string {
	if engine == config.EngineAuto && s.custom != nil {
		return s.custom.described
	}
	var names []string
	for _, n := range engineNames {
		if engine == config.EngineAuto || engine == n.engine {
			names = append(names, n.waiting.String())
		}
	}
	return strings.Join(names, ", ")
}

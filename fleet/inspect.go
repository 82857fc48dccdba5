package fleet

import "github.com/examlops/gateway/kvevents"

// HandleKVFrames feeds the exact index one message of KV events (its ZMQ
// frames) as if it had been received on endpoint, a kv_events endpoint
// of the configuration: for an embedder with a transport of its own, and
// for tests.
func (s *Fleet) HandleKVFrames(endpoint string, frames [][]byte) { s.kv.tr.Handle(endpoint, frames) }

// KVStats returns the exact index's event counters, per engine and
// overall (as /stats and /metrics report them).
func (s *Fleet) KVStats() ([]kvevents.EngineStats, kvevents.GlobalStats) { return s.kv.tr.Stats() }

// KVEndpoints returns the state of the endpoints KV events come from.
func (s *Fleet) KVEndpoints() []kvevents.EndpointStatus { return s.kv.endpoints() }

// KVMapBound returns the most block hashes the exact index maps for the
// engine publishing on endpoint as pod (KVMapFactor times its replica's
// capacity), 0 when st attaches no such engine.
func (st *State) KVMapBound(endpoint, pod string) int {
	if e := st.KV.engines[kvID(endpoint, pod)]; e != nil {
		return e.maxBlocks
	}
	return 0
}

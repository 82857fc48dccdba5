package gateway

// This file is the library's own measurement, MeasureHitRate. The design
// card asks for a top-level simulate.go beside the routing core, and this
// is the part of simulation a library user needs without package sim:
// replaying keys through a real Gateway. Time to first token, load balance
// and real traces are package sim's job.

// MeasureHitRate routes each key in turn through g, completing each
// request before the next, and returns the fraction whose chosen replica
// already held the whole prefix (Decision.Hit). With one repeated prefix on
// 4 replicas, cache-aware routing hits on every request after the first
// (0.99 over 100) and round-robin on every request after each replica's
// first visit (0.96).
//
// It is the simplest measure of affinity. For time to first token, load
// balance and real traces, use package sim. An error from Route (an empty
// key, no healthy replica) stops the measurement and is returned.
func MeasureHitRate(g *Gateway, keys []Key) (float64, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	hits := 0
	for _, k := range keys {
		d, err := g.Route(k)
		if err != nil {
			return 0, err
		}
		if d.Hit {
			hits++
		}
		d.Done(DoneInfo{})
	}
	return float64(hits) / float64(len(keys)), nil
}

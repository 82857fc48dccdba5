package flow

import "testing"

// TestRateWindowBound: Rate.Admit's documented bound, at most
// Burst + L·PerSecond requests over any window of length L, for a rate
// whose interval is not a whole number of nanoseconds (1e9/300,000 is
// 3,333.3 ns): a client sending each request as soon as it is admitted,
// for 100 ms, gets at most 1 + 0.1 × 300,000 = 30,001.
func TestRateWindowBound(t *testing.T) {
	r := Rate{PerSecond: 300_000, Burst: 1}
	const window = int64(100_000_000) // 100 ms
	var tat, now int64
	n := 0
	for now <= window {
		next, wait := r.Admit(tat, now)
		if wait > 0 {
			now += int64(wait)
			continue
		}
		tat = next
		n++
	}
	if bound := r.Burst + int(float64(window)/1e9*r.PerSecond); n > bound {
		t.Fatalf("%d admitted in %d ns at %v a second, burst %d: more than %d", n, window, r.PerSecond, r.Burst, bound)
	}
}

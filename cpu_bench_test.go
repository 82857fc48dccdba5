package gateway

import (
	"runtime"
	"syscall"
	"testing"
)

// BenchmarkCPU reruns the routing and flooding benchmarks reporting, with
// the usual wall-clock ns/op, the CPU time the benchmark's own thread
// spent per op (cpu-ns/op, from getrusage(RUSAGE_THREAD)). On a machine
// shared with other work, wall time swings with the share of the CPU the
// benchmark gets; its own CPU time mostly does not, so same-run
// comparisons converge with fewer runs. The operations are allocation-free,
// so the garbage collector's threads have next to nothing to add.
//
// This file uses only helpers that bench_test.go and flood_bench_test.go
// have had since a12cab6, so it builds against that code too.
//
// Run: go test -run '^$' -bench CPU -count 6 .
func BenchmarkCPU(b *testing.B) {
	cases := []struct {
		name string
		run  func(*testing.B)
	}{
		{"Route16-warm", func(b *testing.B) { benchRoute(b, fixture(b, 16, 200, false, ModeCacheAware)) }},
		{"Route16-hot", func(b *testing.B) { benchRoute(b, hot(fixture(b, 16, 200, false, ModeCacheAware))) }},
		{"Route16-warm-exact", func(b *testing.B) {
			benchRoute(b, fixture(b, 16, 200, false, ModeCacheAware, withIndex(indexExact)))
		}},
		{"Route256-warm", func(b *testing.B) { benchRoute(b, fixture(b, 256, 50, false, ModeCacheAware)) }},
		{"Route256-hot", func(b *testing.B) { benchRoute(b, hot(fixture(b, 256, 50, false, ModeCacheAware))) }},
		{"RouteRoundRobin16", func(b *testing.B) { benchRoute(b, fixture(b, 16, 200, false, ModeRoundRobin)) }},
	}
	for _, fam := range []string{"random", "consecutive", "top20"} {
		for _, op := range []string{"route", "apply"} {
			cases = append(cases, struct {
				name string
				run  func(*testing.B)
			}{"Flood-" + fam + "-" + op, func(b *testing.B) { benchFlood(b, fam, op) }})
		}
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			t0 := threadCPU()
			// The fixture, once built in the first run, is reused, so the
			// final run's CPU time is all in its loop.
			c.run(b)
			b.ReportMetric(float64(threadCPU()-t0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// threadCPU returns the CPU time, user and system, of the calling thread.
func threadCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

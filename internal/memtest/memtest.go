// Package memtest measures what a piece of code costs in memory, for the
// measurement tests (EXA_MEASURE=1) of the packages that bound memory: the
// peak of the live heap, sampled, and the process's peak resident set.
package memtest

import (
	"os"
	"runtime"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const heapObjects = "/memory/classes/heap/objects:bytes"

// LiveHeap is the heap live after a collection (MemStats.HeapAlloc): the
// difference of two calls is what was kept between them.
func LiveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// PeakHeap runs f while sampling the live heap every 100µs, and returns
// the largest sample above the heap live before f (0 if none was above).
func PeakHeap(f func()) uint64 {
	runtime.GC()
	s := []rtmetrics.Sample{{Name: heapObjects}}
	rtmetrics.Read(s)
	base := s[0].Value.Uint64()
	var peak atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		s := []rtmetrics.Sample{{Name: heapObjects}}
		for {
			rtmetrics.Read(s)
			if v := s[0].Value.Uint64(); v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Microsecond):
			}
		}
	})
	f()
	close(stop)
	wg.Wait()
	if peak.Load() < base {
		return 0
	}
	return peak.Load() - base
}

// PeakRSS runs f and returns the process's peak RSS over it, in bytes
// above its RSS before f (Linux: the peak is reset through clear_refs
// and read from VmHWM), or -1 where it cannot be read.
func PeakRSS(f func()) int64 {
	runtime.GC()
	debug.FreeOSMemory()
	if os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) != nil {
		return -1
	}
	before := Status("VmRSS")
	f()
	peak := Status("VmHWM")
	if before < 0 || peak < 0 {
		return -1
	}
	return peak - before
}

// Status returns a size field of /proc/self/status ("VmRSS", "VmHWM") in
// bytes, -1 where it cannot be read.
func Status(field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return -1
}

// EnvInt is the integer in the environment variable name, def if it is
// unset; a measurement's knob (EXA_N and the like). A value that is not
// an integer fails t.
func EnvInt(t testing.TB, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return n
}

package flow

import (
	"fmt"
	"net/http"
	"os"
	"runtime"
	"testing"
	"time"
)

// BenchmarkQueue is the cost of queueing one request: a Push and the Next
// that dispatches it, with 64 requests held over 16 flows in 2 bands.
// Compare with the root package's BenchmarkRoute16 in the same run:
//
//	go test -run '^$' -bench 'Route16/warm$|Queue' -count 8 . ./flow
func BenchmarkQueue(b *testing.B) {
	for _, fair := range []Fairness{RoundRobin, GlobalStrict} {
		name := map[Fairness]string{RoundRobin: "round-robin", GlobalStrict: "global-strict"}[fair]
		b.Run(name, func(b *testing.B) {
			q, err := New[int](Config{Fairness: fair})
			if err != nil {
				b.Fatal(err)
			}
			flows := make([]string, 16)
			for i := range flows {
				flows[i] = fmt.Sprint("tenant-", i)
			}
			for i := 0; i < 64; i++ {
				if _, err := q.Push(Request[int]{Value: i, Flow: flows[i%16], Priority: i % 2, Bytes: 2048}, t0, nil); err != nil {
					b.Fatal(err)
				}
			}
			room := func(int) bool { return true }
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := q.Push(Request[int]{Value: i, Flow: flows[i%16], Priority: i % 2, Bytes: 2048}, t0, nil); err != nil {
					b.Fatal(err)
				}
				if _, ok := q.Next(room); !ok {
					b.Fatal("nothing dispatched")
				}
			}
		})
	}
}

// TestHeldMemory measures the heap a held request takes in a Queue
// (EXA_MEASURE=1): 100,000 requests over 256 flows in 4 bands, the
// payload a pointer, as the fronts hold theirs.
func TestHeldMemory(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("set EXA_MEASURE=1 to measure")
	}
	const n = 100_000
	q, err := New[*int](Config{Total: Limits{MaxRequests: n}, Band: Limits{MaxRequests: n}})
	if err != nil {
		t.Fatal(err)
	}
	flows := make([]string, 256)
	for i := range flows {
		flows[i] = fmt.Sprint("tenant-", i)
	}
	v := new(int)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := 0; i < n; i++ {
		if _, err := q.Push(Request[*int]{Value: v, Flow: flows[i%256], Priority: i % 4, Deadline: t0.Add(time.Duration(i))}, t0, nil); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	t.Logf("%d held: heap +%d bytes, %.0f bytes a request", q.Len(), after.HeapAlloc-before.HeapAlloc, float64(after.HeapAlloc-before.HeapAlloc)/n)
	runtime.KeepAlive(q)
}

// BenchmarkRateLimiter: a request's client key (by header, or by
// address) and decision, among 65,536 clients kept.
func BenchmarkRateLimiter(b *testing.B) {
	l, err := NewRateLimiter(RateLimit{Rate: Rate{PerSecond: 1e6, Burst: 1000}, Key: "header:X-Api-Key"})
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	for i := range DefaultRateClients {
		l.Allow(uint64(i)*0x9e3779b97f4a7c15, now)
	}
	for _, bc := range []struct {
		name string
		h    http.Header
	}{{"header", http.Header{"X-Api-Key": {"sk-0123456789abcdef"}}}, {"address", http.Header{}}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if ok, _ := l.Allow(l.Client(bc.h, "10.1.2.3:54321"), now); !ok {
					b.Fatal("refused")
				}
				now = now.Add(time.Microsecond)
			}
		})
	}
}

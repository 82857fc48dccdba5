package httpgw

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway/internal/memtest"
)

// TestAssembledMemory is issue 29's N1 probe: N concurrent non-streamed
// requests (default 50) whose engine streams MiB MiB of content each
// (default 30), through the gateway with its default MaxAssembledBytes
// (or EXA_ASSEMBLED_BUDGET_MIB). It logs the process's peak RSS above its
// start (gateway, fake engine and clients together: an upper bound of the
// gateway's), how many clients got the answer and how many a 503, and the
// RSS once the requests are done. Run:
//
//	EXA_MEASURE=1 go test ./httpgw -run TestAssembledMemory -v
func TestAssembledMemory(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("measurement: set EXA_MEASURE=1")
	}
	n := memtest.EnvInt(t, "EXA_ASSEMBLED_N", 50)
	size := memtest.EnvInt(t, "EXA_ASSEMBLED_MIB", 30) << 20
	opts := Options{MaxAssembledBytes: int64(memtest.EnvInt(t, "EXA_ASSEMBLED_BUDGET_MIB", DefaultMaxAssembledBytes>>20)) << 20}
	url, _ := bigStreamEngine(t, size, 64<<10)
	f := rawFixture(t, opts, url)
	body := chatBody(testModel, false, "sys", "hi")

	runtime.GC()
	start := memtest.Status("VmRSS")
	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if r := memtest.Status("VmRSS"); r > peak.Load() {
					peak.Store(r)
				}
			}
		}
	}()
	var ok, shed, other atomic.Int64
	var wg sync.WaitGroup
	began := time.Now()
	for range n {
		wg.Go(func() {
			resp, err := http.Post(f.http.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				other.Add(1)
				t.Logf("client: %v", err)
				return
			}
			defer resp.Body.Close()
			// The answer is counted and dropped, so the clients hold
			// nothing; its end is checked.
			var tail [64]byte
			got, err := io.CopyBuffer(io.Discard, io.TeeReader(resp.Body, tailWriter(tail[:])), make([]byte, 64<<10))
			switch {
			case err == nil && resp.StatusCode == http.StatusOK && got > int64(size) && bytes.HasSuffix(bytes.TrimRight(tail[:], "\x00"), []byte("}")):
				ok.Add(1)
			case err == nil && resp.StatusCode == http.StatusServiceUnavailable:
				shed.Add(1)
			default:
				other.Add(1)
				t.Logf("client: status %d, %d bytes, %v", resp.StatusCode, got, err)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(began)
	close(stop)
	<-sampled
	f.settle()
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	t.Logf("%d requests of %d MiB, budget %d MiB: %d answered, %d got 503, %d other, in %v; RSS %.0f MiB at start, peak +%.0f MiB (budget + %.0f MiB)",
		n, size>>20, opts.MaxAssembledBytes>>20, ok.Load(), shed.Load(), other.Load(), elapsed.Round(time.Millisecond),
		mib(start), mib(peak.Load()-start), mib(peak.Load()-start-opts.MaxAssembledBytes))
	for _, wait := range []time.Duration{0, 5 * time.Second, 7 * time.Second} {
		time.Sleep(wait) // a measurement over time, not synchronisation
		t.Logf("then after %v more: RSS %.0f MiB (+%.0f MiB over the start), budget in use %d", wait, mib(memtest.Status("VmRSS")), mib(memtest.Status("VmRSS")-start), f.srv.assembled.Used())
	}
	require.Zero(t, other.Load(), "each client gets the answer or a 503")
}

// tailWriter keeps the last len(buf) bytes written.
type tailWriter []byte

func (w tailWriter) Write(p []byte) (int, error) {
	if len(p) >= len(w) {
		copy(w, p[len(p)-len(w):])
		return len(p), nil
	}
	copy(w, w[len(p):])
	copy(w[len(w)-len(p):], p)
	return len(p), nil
}

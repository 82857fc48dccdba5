package httpgw

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway/internal/memtest"
)

// TestRequestBodiesMemory measures what the request bodies the gateway
// holds cost: n concurrent requests (EXA_N, 64) of EXA_BODY_MIB MiB each
// (7: within the 8 MiB bound), all held in flight at the engine until
// every one has arrived or been refused, streamed (EXA_STREAM=1, the
// default) or not (0: the gateway then asks the engine for a stream),
// under a MaxRequestBytes of EXA_BUDGET_MIB (the default; a large one
// shows the cost without the budget).
// It logs the peak of the live heap and of the process's RSS above their
// start, and how many requests were forwarded and how many refused. Run:
//
//	EXA_MEASURE=1 go test ./httpgw -run TestRequestBodiesMemory -count=1 -v
func TestRequestBodiesMemory(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("measurement: set EXA_MEASURE=1")
	}
	n := memtest.EnvInt(t, "EXA_N", 64)
	size := memtest.EnvInt(t, "EXA_BODY_MIB", 7) << 20
	stream := memtest.EnvInt(t, "EXA_STREAM", 1) == 1
	release := make(chan struct{})
	url, arrived := gateEngine(t, release)
	opts := Options{MaxRequestBytes: int64(memtest.EnvInt(t, "EXA_BUDGET_MIB", DefaultMaxRequestBytes>>20)) << 20}
	f := rawFixture(t, opts, url)
	body := bigChat(stream, size)

	var ok, refused, other atomic.Int64
	var heap uint64
	rss := memtest.PeakRSS(func() {
		heap = memtest.PeakHeap(func() {
			var wg sync.WaitGroup
			for range n {
				wg.Go(func() {
					resp, err := http.Post(f.http.URL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
					if err != nil {
						other.Add(1)
						t.Logf("client: %v", err)
						return
					}
					defer resp.Body.Close()
					_, err = io.Copy(io.Discard, resp.Body)
					switch {
					case err == nil && resp.StatusCode == http.StatusOK:
						ok.Add(1)
					case err == nil && resp.StatusCode == http.StatusServiceUnavailable:
						refused.Add(1)
					default:
						other.Add(1)
						t.Logf("client: status %d, %v", resp.StatusCode, err)
					}
				})
			}
			// Every request is at the engine or answered: let them go.
			deadline := time.Now().Add(2 * time.Minute)
			for arrived.Load()+refused.Load()+other.Load() < int64(n) && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond) // polling a count, not synchronisation
			}
			close(release)
			wg.Wait()
		})
	})
	f.settle()
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	t.Logf("budget %d MiB, %d requests of %d MiB (stream %t): %d at the engine at once, %d answered, %d refused 503, %d other; peak heap +%.0f MiB (%.2f× the bodies forwarded), peak RSS +%.0f MiB",
		opts.MaxRequestBytes>>20, n, size>>20, stream, arrived.Load(), ok.Load(), refused.Load(), other.Load(),
		mib(int64(heap)), float64(heap)/float64(max(arrived.Load(), 1)*int64(len(body))), mib(rss))
	require.Zero(t, other.Load(), "each client gets its answer or a 503")
}

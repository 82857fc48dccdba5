package httpgw

import (
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/httpgw/enginetest"
)

// TestTimeoutAfterHeadRetried: an engine that sends the head of its
// answer at once, as vLLM's server does for a stream, and then nothing
// runs out of the first-byte timer (a non-streamed request streamed from
// the engine, waiting for its first chunk) or the response timer (the
// whole answer, assembled or relayed) before anything was sent to the
// client: the request is retried on another replica, as one whose engine
// sent no head within the timer is (TestFirstByteTimeout), and the client
// gets that replica's answer. The timer is a fake, fired once the gateway
// has the hung engine's head.
func TestTimeoutAfterHeadRetried(t *testing.T) {
	const firstByte, response = 5 * time.Second, 7 * time.Second
	for _, tc := range []struct {
		name  string
		mode  UpstreamStreamMode
		timer time.Duration
	}{
		{"assembled, first byte", UpstreamStreamOn, firstByte},
		{"assembled, response", UpstreamStreamOn, response},
		{"relayed, response", UpstreamStreamOff, response},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hung := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if tc.mode == UpstreamStreamOn {
					w.Header().Set("Content-Type", "text/event-stream")
				} else {
					w.Header().Set("Content-Type", "application/json")
					w.Header().Set("Content-Length", "100")
				}
				w.WriteHeader(http.StatusOK)
				_ = http.NewResponseController(w).Flush()
				<-r.Context().Done()
			}))
			hu, err := url.Parse(hung.URL)
			require.NoError(t, err)
			head := make(chan struct{}) // closed once the gateway has the hung engine's head
			var headOnce sync.Once
			tr := roundTripFunc(func(r *http.Request) (*http.Response, error) {
				resp, err := http.DefaultTransport.RoundTrip(r)
				if err == nil && r.URL.Host == hu.Host {
					headOnce.Do(func() { close(head) })
				}
				return resp, err
			})
			e := enginetest.New(enginetest.Options{Name: "ok", Model: testModel})
			t.Cleanup(e.Close)
			f := &fixture{t: t, reg: prometheus.NewRegistry()}
			// The clock jumps by the timer when it fires, as the time
			// lost on the hung engine: the retry's replica is not charged
			// with it.
			var jumped atomic.Int64
			t0 := time.Now()
			clock := func() time.Time { return t0.Add(time.Since(t0) + time.Duration(jumped.Load())) }
			s, err := New(Options{Registerer: f.reg, Gatherer: f.reg, Logger: quietLogger(), Transport: tr, Clock: clock,
				Fleet:            fleet.Options{EjectAfter: 1, MaxEjectionPercent: 100},
				FirstByteTimeout: firstByte, ResponseTimeout: response, UpstreamStream: tc.mode})
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			var fireOnce sync.Once
			s.afterFunc = func(d time.Duration, fn func()) func() bool {
				stopped := make(chan struct{})
				var once sync.Once
				if d == tc.timer {
					go func() {
						select {
						case <-head:
							fireOnce.Do(func() { jumped.Store(int64(d)); fn() })
						case <-stopped:
						}
					}()
				}
				return func() bool { once.Do(func() { close(stopped) }); return true }
			}
			require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {Mode: gateway.ModeRoundRobin,
				Replicas: []config.Replica{{Name: "hung", Address: hung.URL}, {Name: "ok", Address: e.URL()}}}}}))
			f.srv, f.http = s, newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				f.handlers.Add(1)
				defer f.handlers.Done()
				s.ServeHTTP(w, r)
			}))
			// Round robin: one of the two requests goes to the hung engine first.
			for i := range 2 {
				resp := f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "q"+strconv.Itoa(i)))
				b := readAll(t, resp)
				require.Equal(t, http.StatusOK, resp.StatusCode, "request %d: %s", i, b)
				assert.Equal(t, "ok", resp.Header.Get(HeaderReplica))
				assert.Contains(t, string(b), `"choices"`)
			}
			assert.Equal(t, 1.0, f.counter("exa_gateway_retries_total", nil), "the timed-out request is retried once")
			assert.Equal(t, 1.0, f.counter("exa_gateway_ejections_total", map[string]string{"address": hung.URL}), "the timeout counts against the engine's health")
			for _, r := range s.Snapshot().Models[testModel].Gateway.Replicas() {
				if r.Name == "ok" {
					assert.Less(t, r.Load.Latency, tc.timer/10, "the retry's replica's latency leaves out the time lost on the hung one")
				}
			}
		})
	}
}

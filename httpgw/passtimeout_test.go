package httpgw

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/internal/front"
)

// TestPassThroughResponseTimeout: ResponseTimeout bounds the answer of a
// pass-through request (embeddings, tokenize, a stored response's) as it
// bounds a non-streamed inference answer: an engine that sends no head
// within it counts as failed, the request is retried on another replica
// when there is one, else the client gets 504 upstream_timeout; before,
// such a request waited for the engine without end. The response timer is
// a fake, fired once the hung engine has the request; an engine asked
// without the timer armed answers at once (so the test fails, not hangs).
func TestPassThroughResponseTimeout(t *testing.T) {
	const response = 7 * time.Second
	for _, tc := range []struct {
		name    string
		engines int
		want    int
	}{
		{"alone", 1, http.StatusGatewayTimeout},
		{"retried", 2, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var armed atomic.Int32
			var hits atomic.Int64
			fire := make(chan struct{}, 32) // the hung engine has a request
			hung := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if r.URL.Path == "/health" || r.URL.Path == "/metrics" || r.URL.Path == "/v1/models" {
					return
				}
				if armed.Load() == 0 {
					w.Header().Set("Content-Type", "application/json")
					_, _ = io.WriteString(w, `{"object":"list","data":[]}`)
					return
				}
				hits.Add(1)
				fire <- struct{}{}
				<-r.Context().Done()
			}))
			addrs := []string{hung.URL}
			if tc.engines == 2 {
				ok := enginetest.New(enginetest.Options{Model: testModel})
				t.Cleanup(ok.Close)
				addrs = append(addrs, ok.URL())
			}
			f := rawFixture(t, Options{ResponseTimeout: response}, addrs...)
			var mu sync.Mutex
			f.srv.afterFunc = func(d time.Duration, fn func()) func() bool {
				stop := make(chan struct{})
				var once sync.Once
				if d == response {
					armed.Add(1)
					go func() {
						select {
						case <-fire:
							mu.Lock()
							fn()
							mu.Unlock()
						case <-stop:
						}
					}()
				}
				return func() bool {
					once.Do(func() {
						if d == response {
							armed.Add(-1)
						}
						close(stop)
					})
					return true
				}
			}
			// Two engines of equal load draw lots: of 20 requests some
			// go to the hung one first (all 20 elsewhere: 2^-20).
			n := 1
			if tc.engines == 2 {
				n = 20
			}
			for i := range n {
				resp := f.post("/v1/embeddings", `{"model":"m1","input":"x`+strings.Repeat("y", i)+`"}`)
				b := readAll(t, resp)
				require.Equal(t, tc.want, resp.StatusCode, "request %d: %s", i, b)
				if tc.want == http.StatusGatewayTimeout {
					e := decodeError(t, b)
					require.NotNil(t, e.Code, string(b))
					assert.Equal(t, "upstream_timeout", *e.Code)
					assert.Contains(t, e.Message, response.String())
				}
			}
			assert.Positive(t, hits.Load(), "the hung engine was asked")
		})
	}
}

// goneWriter is a client that went away: its writes fail, though its
// request's context has not ended (yet).
type goneWriter struct{ h http.Header }

func (g *goneWriter) Header() http.Header       { return g.h }
func (g *goneWriter) WriteHeader(int)           {}
func (g *goneWriter) Write([]byte) (int, error) { return 0, errors.New("write: broken pipe") }

// A pass-through answer the client is gone for (a write to it fails
// before its context ends) is counted as client_canceled and ends the
// handler; it is not an engine's failure (no abort, no health failure).
func TestPassThroughClientGoneOnWrite(t *testing.T) {
	f := newFixture(t, 1, gateway.ModeRoundRobin, enginetest.Options{})
	req := httptest.NewRequest(http.MethodPost, "/v1/embeddings", strings.NewReader(`{"model":"m1","input":"x"}`))
	var panicked any
	func() {
		defer func() { panicked = recover() }()
		f.srv.ServeHTTP(&goneWriter{h: http.Header{}}, req)
	}()
	require.Nil(t, panicked, "the handler returns: nothing to abort")
	assert.Equal(t, 1.0, f.counter("exa_gateway_requests_total", map[string]string{"endpoint": "embeddings", "code": "499", "reason": front.CodeClientCanceled}))
	for _, ep := range f.srv.Snapshot().Models[testModel].ByName {
		assert.True(t, ep.Health.Healthy(), "the engine is not blamed")
	}
}

// The caller's request is restored after ServeHTTP (its X-Forwarded-For
// as it came) also when the answer is aborted: a plain answer the engine
// cut mid-body panics with http.ErrAbortHandler, which reaches the caller.
func TestForwardedForRestoredOnAbort(t *testing.T) {
	f := newFixtureOpts(t, 1, gateway.ModeRoundRobin, enginetest.Options{Chunks: 4}, Options{UpstreamStream: UpstreamStreamOff})
	f.engines[0].BreakStreams(2)
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(chatBody(testModel, false, "sys", "hi")))
	req.Header.Set("X-Forwarded-For", "203.0.113.7")
	var panicked any
	func() {
		defer func() { panicked = recover() }()
		f.srv.ServeHTTP(httptest.NewRecorder(), req)
	}()
	require.Equal(t, http.ErrAbortHandler, panicked, "the cut answer is aborted")
	assert.Equal(t, []string{"203.0.113.7"}, req.Header.Values("X-Forwarded-For"))
}

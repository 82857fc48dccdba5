package httpgw

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestResponseTimeoutStalledAnswer (issue 29, N3): an engine that sends
// part of a non-streamed answer, then nothing, holds the client only for
// ResponseTimeout, which bounds the whole answer: assembled from the
// engine's stream (two chunks, then silence) the client gets 504 with an
// OpenAI error naming the timeout; relayed as it is (head and part of the
// body, then silence) the answer already begun is cut short of its
// declared length. The response timer is a fake fired once the gateway
// has read the engine's first body bytes and waits for more; the
// first-byte timer never fires.
func TestResponseTimeoutStalledAnswer(t *testing.T) {
	const response, firstByte = 3 * time.Second, time.Hour
	for _, tc := range []struct {
		name string
		mode UpstreamStreamMode
	}{
		{"assembled", UpstreamStreamOn},
		{"relayed", UpstreamStreamOff},
	} {
		t.Run(tc.name, func(t *testing.T) {
			read := make(chan struct{}) // closed once the gateway has the first body bytes
			engine := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if tc.mode == UpstreamStreamOn {
					w.Header().Set("Content-Type", "text/event-stream")
					for _, c := range []string{"Hel", "lo"} {
						_, _ = io.WriteString(w, `data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"`+c+`"}}]}`+"\n\n")
					}
				} else {
					w.Header().Set("Content-Type", "application/json")
					w.Header().Set("Content-Length", "1000")
					_, _ = io.WriteString(w, `{"id":"x","choices":[`)
				}
				_ = http.NewResponseController(w).Flush()
				<-r.Context().Done() // silence until the gateway gives up
			}))
			tr := roundTripFunc(func(r *http.Request) (*http.Response, error) {
				resp, err := http.DefaultTransport.RoundTrip(r)
				if err == nil {
					resp.Body = &firstRead{ReadCloser: resp.Body, read: read}
				}
				return resp, err
			})
			f := rawFixture(t, Options{UpstreamStream: tc.mode, ResponseTimeout: response, FirstByteTimeout: firstByte, Transport: tr}, engine.URL)
			var mu sync.Mutex
			var timers []time.Duration
			f.srv.afterFunc = func(d time.Duration, fire func()) func() bool {
				mu.Lock()
				timers = append(timers, d)
				mu.Unlock()
				stop := make(chan struct{})
				var once sync.Once
				if d == response {
					go func() {
						select {
						case <-read:
							fire()
						case <-stop:
						}
					}()
				}
				return func() bool { once.Do(func() { close(stop) }); return true }
			}
			// The deadline only ends the test on a gateway that never
			// answers (10f3da2 held the client without end).
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.http.URL+"/v1/chat/completions", strings.NewReader(chatBody(testModel, false, "sys", "hi")))
			require.NoError(t, err)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.False(t, errors.Is(rerr, context.DeadlineExceeded), "the stalled answer was not ended by the response timeout")
			mu.Lock()
			assert.Contains(t, timers, response, "the response timer bounds the whole answer")
			mu.Unlock()
			if tc.mode == UpstreamStreamOff {
				assert.Equal(t, http.StatusOK, resp.StatusCode)
				assert.ErrorIs(t, rerr, io.ErrUnexpectedEOF, "the begun answer is cut short: %s", b)
				return
			}
			require.NoError(t, rerr)
			require.Equal(t, http.StatusGatewayTimeout, resp.StatusCode, "%s", b)
			e := decodeError(t, b)
			require.NotNil(t, e.Code)
			assert.Equal(t, "upstream_timeout", *e.Code)
			assert.Contains(t, e.Message, "the answer was not complete within the response timeout ("+response.String()+")")
			f.settle()
			assert.Equal(t, 1.0, f.counter("exa_gateway_requests_total", map[string]string{"code": strconv.Itoa(http.StatusGatewayTimeout)}))
		})
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// firstRead closes read when the gateway reads again after a read that
// returned bytes: it has taken in the engine's first bytes and waits for
// more.
type firstRead struct {
	io.ReadCloser
	read chan struct{}
	got  bool
	once sync.Once
}

func (b *firstRead) Read(p []byte) (int, error) {
	if b.got {
		b.once.Do(func() { close(b.read) })
	}
	n, err := b.ReadCloser.Read(p)
	b.got = b.got || n > 0
	return n, err
}

// TestResponseTimeoutMeasure measures when a stalled non-streamed answer
// (two chunks, then silence) ends with a real ResponseTimeout of 3s, as
// issue 29's probe had it. Run:
//
//	EXA_MEASURE=1 go test ./httpgw -run TestResponseTimeoutMeasure -v
func TestResponseTimeoutMeasure(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("measurement: set EXA_MEASURE=1")
	}
	const response = 3 * time.Second
	engine := newHTTPTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, c := range []string{"Hel", "lo"} {
			_, _ = io.WriteString(w, `data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"`+c+`"}}]}`+"\n\n")
			_ = http.NewResponseController(w).Flush()
		}
		<-r.Context().Done()
	}))
	f := rawFixture(t, Options{ResponseTimeout: response}, engine.URL)
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.http.URL+"/v1/chat/completions", strings.NewReader(chatBody(testModel, false, "sys", "hi")))
	require.NoError(t, err)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	b := readAll(t, resp)
	t.Logf("--response-timeout %v: status %d after %v: %s", response, resp.StatusCode, time.Since(start).Round(time.Millisecond), b)
}

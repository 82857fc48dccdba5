package httpgw

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/examlops/gateway/config"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// holdDecode makes decode engine e hold each request before its first
// byte until release is closed (or its client goes), sending a value on
// entered as each one starts waiting; it then answers with one streamed
// word.
func holdDecode(e *pdEngine) (entered, release chan struct{}) {
	entered, release = make(chan struct{}, 4), make(chan struct{})
	e.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		entered <- struct{}{}
		holdThenAnswer(w, r, release)
	})
	return entered, release
}

// holdThenAnswer holds a request until release is closed (or its client
// goes), then answers it with one streamed word.
func holdThenAnswer(w http.ResponseWriter, r *http.Request, release chan struct{}) {
	select {
	case <-release:
	case <-r.Context().Done():
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n")
}

// A split request whose prefill failed is decoded co-located: its decode
// replica prefills it after all, so until its first token the request's
// uncached blocks are pending prefill there, as for a request the plan did
// not split. Before, the plan's hand-off stayed: the decode replica's
// pending prefill read 0 while it prefilled the prompt (a prefill pool
// failing hid all its fallbacks' prefill from the decode pool's routing
// and from the plan's queue rule).
func TestPDPrefillFailedPendsOnDecode(t *testing.T) {
	f := newPDFixture(t, 1, 1, nil)
	f.prefill[0].status.Store(http.StatusServiceUnavailable)
	entered, release := holdDecode(f.decode[0])
	done := make(chan *http.Response, 1)
	go func() {
		done <- f.post("/v1/chat/completions", pdBody(true, "tell me a long story about pending prefill"))
	}()
	<-entered
	dec := f.srv.Snapshot().Models[testModel].Gateway.Replicas()[0]
	assert.Equal(t, 1, dec.InFlight)
	assert.Positive(t, dec.PendingPrefill, "the decode replica prefills the fallback")
	close(release)
	resp := <-done
	readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Regexp(t, `^prefill_failed; `, resp.Header.Get(HeaderDisagg))
	f.settle()
	dec = f.srv.Snapshot().Models[testModel].Gateway.Replicas()[0]
	assert.Zero(t, dec.PendingPrefill)
	assert.Zero(t, dec.InFlight)
}

// A split request whose decode replica failed before its first byte is
// retried on another decode replica with the same decode request (its
// KV cache still handed over from the prefill replica; in sidecar mode
// the sidecar reruns the prefill on the prefill replica): the retry's
// replica does not prefill it either, so the request's blocks are not
// pending prefill there. Before, the retry was routed as a co-located
// request: its blocks were pending on the retry's replica until its first
// token, and its Done taught that replica's prefill speed from a first
// token that followed a KV transfer.
func TestPDDecodeRetryHandsOff(t *testing.T) {
	for _, sidecar := range []bool{false, true} {
		t.Run(fmt.Sprintf("sidecar=%v", sidecar), func(t *testing.T) {
			f := newPDFixture(t, 1, 2, func(m *config.Model) {
				if sidecar {
					m.PDMode = config.PDModeSidecar
				}
			})
			// Whichever decode replica the plan picks fails at once; the
			// retry's holds.
			var n atomic.Int32
			entered, release := make(chan string, 1), make(chan struct{})
			for _, e := range f.decode {
				e.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.URL.Path == "/health" {
						return
					}
					if n.Add(1) == 1 {
						http.Error(w, "injected", http.StatusInternalServerError)
						return
					}
					entered <- "decode/" + e.name
					holdThenAnswer(w, r, release)
				})
			}
			done := make(chan *http.Response, 1)
			go func() {
				done <- f.post("/v1/chat/completions", pdBody(true, "tell me a long story about decode retries"))
			}()
			retry := <-entered
			gw := f.srv.Snapshot().Models[testModel].Gateway
			for _, st := range gw.Replicas() {
				if st.Name == retry {
					assert.Equal(t, 1, st.InFlight)
					assert.Zero(t, st.PendingPrefill, "the retry's replica does not prefill a split request")
				}
			}
			pre := f.srv.Snapshot().Models[testModel].PD.Plan.Prefill.Replicas()[0]
			if sidecar {
				// The retry's sidecar reruns the prefill: the failed
				// sidecar's 5xx does not end it.
				assert.Positive(t, pre.PendingPrefill, "the retry's sidecar prefills on the prefill replica")
			} else {
				assert.Zero(t, pre.PendingPrefill, "the prefill ran before the decode")
			}
			close(release)
			resp := <-done
			readAll(t, resp)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Regexp(t, `^split; `, resp.Header.Get(HeaderDisagg))
			assert.Equal(t, retry, resp.Header.Get(HeaderReplica))
			pre = f.srv.Snapshot().Models[testModel].PD.Plan.Prefill.Replicas()[0]
			assert.Zero(t, pre.PendingPrefill)
			assert.Equal(t, 1.0, f.fallbacks("decode_retry"))
			f.settle()
			for _, st := range gw.Replicas() {
				assert.Zero(t, st.PendingPrefill)
				assert.Zero(t, st.InFlight)
			}
			assert.Zero(t, f.srv.Snapshot().Models[testModel].PD.Plan.Prefill.Replicas()[0].InFlight)
		})
	}
}

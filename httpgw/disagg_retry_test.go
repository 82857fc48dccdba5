package httpgw

import (
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pdFaults fails the first prefill requests by kinds, whichever prefill
// engine gets them (prefillFault).
func (f *pdFixture) pdFaults(kinds ...string) *prefillFault {
	pf := &prefillFault{kinds: kinds}
	for _, e := range f.prefill {
		e.fault = pf
	}
	return pf
}

// prefillsSeen returns, per prefill engine, the prefill requests it got.
func (f *pdFixture) prefillsSeen() [][]pdSeen {
	var out [][]pdSeen
	for _, e := range f.prefill {
		out = append(out, e.requests())
	}
	return out
}

func (f *pdFixture) fallbacks(reason string) float64 {
	return f.counter("exa_gateway_disagg_fallbacks_total", map[string]string{"reason": reason})
}

// A prefill that fails other than with a 4xx (a 5xx, a cut connection, an
// answer without kv_transfer_params) is retried once on the other prefill
// replica, whose kv_transfer_params reach the decode request, under a
// request ID of its own; the answer is the split one.
func TestPDPrefillRetry(t *testing.T) {
	for _, kind := range []string{"503", "close", "nokv"} {
		for _, stream := range []bool{false, true} {
			t.Run(kind, func(t *testing.T) {
				f := newPDFixture(t, 2, 1, nil)
				f.pdFaults(kind)
				resp := f.post("/v1/chat/completions", pdBody(stream, "tell me a long story"))
				b := readAll(t, resp)
				require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
				assert.Equal(t, "tell me a long story", answerText(t, b))
				assert.Regexp(t, `^split; uncached=\d+$`, resp.Header.Get(HeaderDisagg))

				seen := f.prefillsSeen()
				require.Len(t, seen[0], 1, "each prefill replica got one prefill")
				require.Len(t, seen[1], 1)
				// The engine that got the second prefill ID served it.
				served := 1
				if seen[0][0].hdr.Get(headerRequestID) == "id-2" {
					served = 0
				}
				failed := seen[1-served][0]
				assert.Equal(t, "id-1", failed.hdr.Get(headerRequestID))
				assert.Equal(t, failed.body, seen[served][0].body, "the retry sends the same prefill request")
				assert.Equal(t, "prefill/"+f.prefill[served].name, resp.Header.Get(HeaderPrefillReplica))
				dec := f.decode[0].requests()
				require.Len(t, dec, 1)
				assert.Equal(t, f.prefill[served].kvParams(), dec[0].body[fieldKVTransferParams])
				assert.Equal(t, "id-2", dec[0].hdr.Get(headerRequestID), "the decode request carries the served prefill's ID")

				assert.Equal(t, 1.0, f.fallbacks("prefill_retry"))
				assert.Zero(t, f.fallbacks("prefill_failed"))
				assert.Zero(t, f.fallbacks("prefill_no_kv_params"))
				assert.Equal(t, 1.0, f.counter("exa_gateway_retries_total", nil))
				for _, e := range f.prefill {
					assert.Equal(t, 1.0, f.counter("exa_gateway_replica_requests_total", map[string]string{"replica": "prefill/" + e.name}))
				}
				assert.Equal(t, uint64(1), f.histCount("exa_gateway_disagg_phase_seconds", map[string]string{"phase": "prefill"}))
				st := f.stats().Models[testModel]
				assert.Equal(t, uint64(1), st.Disaggregation.Fallbacks["prefill_retry"])
				assert.Zero(t, st.Disaggregation.Prefill.Replicas[0].InFlight+st.Disaggregation.Prefill.Replicas[1].InFlight,
					"both prefill decisions are released")
				ms := f.srv.Snapshot().Models[testModel]
				wantFails := 1 // a 5xx or a cut connection counts against the failed replica
				if kind == "nokv" {
					wantFails = 0 // it answered
				}
				assert.Equal(t, wantFails, ms.ByName["prefill/"+f.prefill[1-served].name].Health.Failures())
				assert.Zero(t, ms.ByName["prefill/"+f.prefill[served].name].Health.Failures())
			})
		}
	}
}

// Both prefill replicas fail: the request is decoded co-located after the
// one retry, with the client's body, counted as a retry and a fallback.
func TestPDPrefillRetryBothFail(t *testing.T) {
	f := newPDFixture(t, 2, 1, nil)
	for _, e := range f.prefill {
		e.status.Store(http.StatusInternalServerError)
	}
	resp := f.post("/v1/chat/completions", pdBody(true, "hello there"))
	b := readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	assert.Equal(t, "hello there", answerText(t, b))
	assert.Regexp(t, `^prefill_failed; `, resp.Header.Get(HeaderDisagg))
	assert.Empty(t, resp.Header.Get(HeaderPrefillReplica))
	seen := f.prefillsSeen()
	assert.Len(t, seen[0], 1)
	assert.Len(t, seen[1], 1)
	dec := f.decode[0].requests()
	require.Len(t, dec, 1)
	assert.Equal(t, map[string]any{"forged": true}, dec[0].body[fieldKVTransferParams], "co-located: the client's body as it was")
	assert.Empty(t, dec[0].hdr.Get(headerRequestID))
	assert.Equal(t, 1.0, f.fallbacks("prefill_retry"))
	assert.Equal(t, 1.0, f.fallbacks("prefill_failed"))
	assert.Zero(t, f.histCount("exa_gateway_disagg_phase_seconds", map[string]string{"phase": "prefill"}))
}

// With one prefill replica there is none to retry on: a failed prefill
// decodes co-located at once.
func TestPDPrefillRetryOneReplica(t *testing.T) {
	f := newPDFixture(t, 1, 1, nil)
	f.pdFaults("503")
	resp := f.post("/v1/chat/completions", pdBody(false, "hello"))
	b := readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	assert.Regexp(t, `^prefill_failed; `, resp.Header.Get(HeaderDisagg))
	assert.Len(t, f.prefill[0].requests(), 1)
	assert.Zero(t, f.fallbacks("prefill_retry"))
	assert.Equal(t, 1.0, f.fallbacks("prefill_failed"))
	assert.Zero(t, f.counter("exa_gateway_retries_total", nil))
}

// A prefill answered with a 4xx is the request's fault: relayed, not
// retried; a retry answered with one is relayed too.
func TestPDPrefillRetry4xx(t *testing.T) {
	for _, tc := range []struct {
		kinds     []string
		wantTried int
		wantRetry float64
	}{
		{[]string{"400"}, 1, 0},
		{[]string{"503", "429"}, 2, 1},
	} {
		f := newPDFixture(t, 2, 1, nil)
		f.pdFaults(tc.kinds...)
		resp := f.post("/v1/chat/completions", pdBody(false, "hello"))
		b := readAll(t, resp)
		last := tc.kinds[len(tc.kinds)-1]
		assert.Equal(t, last, strconv.Itoa(resp.StatusCode), "%v: %s", tc.kinds, b)
		assert.JSONEq(t, `{"error":{"message":"injected","code":`+last+`}}`, string(b))
		assert.Regexp(t, `^split; `, resp.Header.Get(HeaderDisagg))
		seen := f.prefillsSeen()
		assert.Equal(t, tc.wantTried, len(seen[0])+len(seen[1]), "%v", tc.kinds)
		assert.Equal(t, tc.wantRetry, f.fallbacks("prefill_retry"))
		assert.Empty(t, f.decode[0].requests())
		ms := f.srv.Snapshot().Models[testModel]
		assert.Zero(t, ms.Gateway.Replicas()[0].InFlight, "the decode decision is released")
	}
}

// The prefill phase, its retry included, waits no longer than one
// first-byte timeout: a timed-out prefill is not retried, and a retry
// that hangs ends when the one timer fires.
func TestPDPrefillRetryTimeout(t *testing.T) {
	for _, tc := range []struct {
		name      string
		faults    []string // prefill failures before one hangs
		wantTried int      // prefill requests sent
		wantRetry float64
	}{
		{"first hangs", nil, 1, 0},
		{"retry hangs", []string{"503"}, 2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// No timer for the decode's whole answer: the one timer is the
			// prefill phase's.
			f := newPDFixtureOpts(t, 2, 1, nil, Options{UpstreamStream: UpstreamStreamOff, ResponseTimeout: -1})
			f.pdFaults(tc.faults...)
			entered := make(chan struct{}, 2)
			hold := make(chan struct{})
			t.Cleanup(func() { close(hold) })
			for _, e := range f.prefill {
				e.hold, e.entered = hold, entered
			}
			var timers atomic.Int32
			real := f.srv.afterFunc
			f.srv.afterFunc = func(d time.Duration, fire func()) func() bool {
				if timers.Add(1) == 1 { // the prefill phase's timer fires once an engine holds a prefill
					go func() { <-entered; fire() }()
					return func() bool { return true }
				}
				return real(d, fire)
			}
			resp := f.post("/v1/chat/completions", pdBody(false, "hello"))
			b := readAll(t, resp)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
			assert.Regexp(t, `^prefill_failed; `, resp.Header.Get(HeaderDisagg))
			seen := f.prefillsSeen()
			assert.Equal(t, tc.wantTried, len(seen[0])+len(seen[1]))
			assert.Equal(t, tc.wantRetry, f.fallbacks("prefill_retry"))
			assert.Equal(t, 1.0, f.fallbacks("prefill_failed"))
			assert.Len(t, f.decode[0].requests(), 1, "decoded co-located")
			assert.Equal(t, int32(1), timers.Load(), "one timer bounds the prefill and its retry")
		})
	}
}

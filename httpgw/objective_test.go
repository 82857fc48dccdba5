package httpgw

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/flow"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/internal/fronttest"
)

// stepClock is a clock that moves 10 ms on every reading: every interval
// the gateway measures is a positive number of steps, however fast the
// fake engines answer.
type stepClock struct{ n atomic.Int64 }

func (c *stepClock) Now() time.Time {
	return time.Unix(1e9, 0).Add(time.Duration(c.n.Add(1)) * 10 * time.Millisecond)
}

// Every answered inference request tells the library what the gateway
// saw of it: the first token (streamed, or streamed from the engine for a
// client that did not stream), the end, and the output tokens (the
// usage, or a stream's content chunks); a whole answer relayed as it is
// shows no first token.
func TestDoneInfoReachesLibrary(t *testing.T) {
	const chunks = 5
	for _, tc := range []struct {
		name      string
		upstream  UpstreamStreamMode
		stream    bool
		wantTTFT  bool
		wantToken int
	}{
		{"streamed, counted by chunks", UpstreamStreamOn, true, true, chunks},
		{"not streamed, streamed from the engine: its usage", UpstreamStreamOn, false, true, chunks},
		{"not streamed, relayed whole: its usage, no first token", UpstreamStreamOff, false, false, chunks},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &fronttest.DoneRecorder{}
			f := newFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{Chunks: chunks}, func(o *Options) {
				o.Clock = (&stepClock{}).Now
				o.UpstreamStream = tc.upstream
				o.GatewayOptions = []gateway.Option{gateway.WithPolicy(rec)}
			})
			// Prompts of different lengths: a fit of whole answers alone
			// separates prefill from decode only over requests of
			// different shapes (speed.go).
			// 40 of them: the time per block is published after about
			// 30 first tokens (speedMinTTFT).
			for i := range 40 {
				resp := f.post("/v1/chat/completions", chatBody(testModel, tc.stream, "sys", strings.Repeat("word ", 1+40*(i%8))))
				readAll(t, resp)
				require.Equal(t, http.StatusOK, resp.StatusCode)
			}
			f.settle()
			info := rec.Last(t)
			require.NoError(t, info.Err)
			assert.Equal(t, tc.wantToken, info.OutputTokens)
			assert.Positive(t, info.Elapsed)
			if tc.wantTTFT {
				assert.Positive(t, info.TTFT)
				assert.GreaterOrEqual(t, info.Elapsed, info.TTFT)
			} else {
				assert.Zero(t, info.TTFT)
			}
			predictsSomething(t, f, tc.wantTTFT)
			if tc.upstream != UpstreamStreamOn || !tc.stream {
				return
			}
			// A Responses API stream: its usage, and no first token (its
			// first event comes before it).
			resp := f.post("/v1/responses", `{"model":"`+testModel+`","input":"hi","stream":true}`)
			readAll(t, resp)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			f.settle()
			ri := rec.Last(t)
			assert.Equal(t, 1, ri.OutputTokens, "the fake engine's output_tokens")
			assert.Zero(t, ri.TTFT)
			assert.Positive(t, ri.Elapsed)
		})
	}
}

// predictsSomething checks that the library has learned the replica's
// speed from the requests f served: both times where the first token
// shows them apart (wantTTFT); from whole answers, whose time on the
// step clock does not grow with the prompt, the fit puts it all on the
// output tokens.
func predictsSomething(t *testing.T, f *fixture, wantTTFT bool) {
	t.Helper()
	d, err := f.srv.Snapshot().Models[testModel].Gateway.RouteWith(gateway.Key{1, 2, 3}, gateway.Target{})
	require.NoError(t, err)
	defer d.Done(gateway.DoneInfo{})
	assert.Positive(t, d.PredictedTPOT)
	if wantTTFT {
		assert.Positive(t, d.PredictedTTFT)
	}
}

// A bad objective header is the client's 400, naming the header and its
// value; no engine sees the request.
func TestObjectiveHeaderBadValues(t *testing.T) {
	f := newFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{})
	for _, tc := range []struct{ header, value, want string }{
		{"x-slo-ttft-ms", "fast", `header X-Slo-Ttft-Ms "fast" is not an integer`},
		{"x-slo-ttft-ms", "-1", `"-1" is not an integer`},
		{"x-slo-tpot-ms", "1.5", `header X-Slo-Tpot-Ms "1.5" is not an integer`},
		{"x-slo-tpot-ms", "3600001", `"3600001" is too large`},
		{"x-slo-tpot-ms", "", "is empty"},
	} {
		resp := f.post("/v1/chat/completions", chatBody(testModel, false, "sys", "hi"), tc.header, tc.value)
		body := readAll(t, resp)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s: %s", tc.header, tc.value)
		e := decodeError(t, body)
		require.NotNil(t, e.Param)
		assert.Equal(t, http.CanonicalHeaderKey(tc.header), *e.Param)
		assert.Contains(t, e.Message, tc.want)
	}
	assert.Zero(t, f.engines[0].Requests())
	assert.Equal(t, 5.0, f.counter("exa_gateway_requests_total", map[string]string{"code": "400"}))
}

// sloFixture is a gateway over one engine that has learned, on its step
// clock, that the engine takes tens of milliseconds to a first token
// (from requests that set no objective).
func sloFixture(t *testing.T, obj front.Objectives, set ...func(*Options)) *fixture {
	t.Helper()
	f := newFixture(t, 1, gateway.ModeCacheAware, enginetest.Options{}, append(set, func(o *Options) {
		o.Clock = (&stepClock{}).Now
		o.Objectives = obj
	})...)
	for range 40 { // about 30 first tokens publish the time per block
		resp := f.post("/v1/chat/completions", chatBody(testModel, true, "sys", "hi"), "x-slo-ttft-ms", "0", "x-slo-tpot-ms", "0")
		readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	f.settle()
	require.Zero(t, f.counter("exa_gateway_slo_requests_total", nil))
	return f
}

// With Unattainable Reject, a request whose 1 ms objective the slow
// replica is predicted to miss gets 429 slo_unattainable: its decision is
// released and the engine never sees it. An objective it can meet goes
// through.
func TestObjectiveRejectSlowReplica(t *testing.T) {
	f := sloFixture(t, front.Objectives{Unattainable: front.Reject})
	e := f.engines[0]
	before := e.Requests()
	resp := f.post("/v1/chat/completions", chatBody(testModel, true, "sys", "hi"), "x-slo-ttft-ms", "1")
	body := readAll(t, resp)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s", body)
	ae := decodeError(t, body)
	require.NotNil(t, ae.Code)
	assert.Equal(t, "slo_unattainable", *ae.Code)
	assert.Equal(t, front.TypeRateLimit, ae.Type)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"), "one scrape interval, as a shed request's")
	assert.Equal(t, before, e.Requests())
	f.settle()
	for _, r := range f.srv.Snapshot().Models[testModel].Gateway.Replicas() {
		assert.Zero(t, r.InFlight, "the refused decision is released")
	}
	assert.Equal(t, 1.0, f.counter("exa_gateway_slo_unattainable_total", map[string]string{"action": "rejected"}))
	assert.Equal(t, 1.0, f.counter("exa_gateway_requests_total", map[string]string{"code": "429", "reason": "slo_unattainable"}))

	// One it can meet: routed, and counted as met.
	resp = f.post("/v1/chat/completions", chatBody(testModel, true, "sys", "hi"), "x-slo-ttft-ms", "3600000", "x-slo-tpot-ms", "3600000")
	readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, 1.0, f.counter("exa_gateway_slo_requests_total", map[string]string{"objective": "ttft", "outcome": "met"}))
	assert.Equal(t, 1.0, f.counter("exa_gateway_slo_requests_total", map[string]string{"objective": "tpot", "outcome": "met"}))
	st := f.srv.Stats().Models[testModel]
	require.NotNil(t, st.Objectives)
	assert.Equal(t, uint64(2), st.Objectives.Requests)
	assert.Equal(t, uint64(1), st.Objectives.BestEffort)
	assert.Equal(t, uint64(1), st.Objectives.TTFTMet)
}

// Best effort (the default) routes it anyway, counts it, and counts the
// objective missed; a model's default objective applies without headers,
// and a header of 0 removes it.
func TestObjectiveBestEffortAndDefaults(t *testing.T) {
	f := sloFixture(t, front.Objectives{Defaults: map[string]front.SLO{testModel: {TTFT: time.Millisecond}}})
	resp := f.post("/v1/chat/completions", chatBody(testModel, true, "sys", "hi"))
	readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, 1.0, f.counter("exa_gateway_slo_unattainable_total", map[string]string{"action": "best_effort"}))
	assert.Equal(t, 1.0, f.counter("exa_gateway_slo_requests_total", map[string]string{"objective": "ttft", "outcome": "missed"}))

	resp = f.post("/v1/chat/completions", chatBody(testModel, true, "sys", "hi"), "x-slo-ttft-ms", "0")
	readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, 1.0, f.counter("exa_gateway_slo_unattainable_total", nil), "no objective, nothing counted")

	// /stats: the library's counts.
	resp, err := http.Get(f.http.URL + "/stats")
	require.NoError(t, err)
	var doc config.StatsDocument
	require.NoError(t, json.Unmarshal(readAll(t, resp), &doc))
	o := doc.Models[testModel].Objectives
	require.NotNil(t, o)
	assert.Equal(t, config.ObjectiveStats{Requests: 1, BestEffort: 1, TTFTMissed: 1}, *o)

	// The metrics page with the new series passes the linter.
	resp, err = http.Get(f.http.URL + "/metrics")
	require.NoError(t, err)
	page := readAll(t, resp)
	problems, err := promlint.New(bytes.NewReader(page)).Lint()
	require.NoError(t, err)
	assert.Empty(t, problems)
	assert.Contains(t, string(page), `exa_gateway_slo_requests_total{model="m1",objective="ttft",outcome="missed"} 1`)
}

func TestObjectivesOptionsChecked(t *testing.T) {
	_, err := New(Options{Objectives: front.Objectives{Defaults: map[string]front.SLO{"m": {TTFT: -1}}}})
	require.ErrorIs(t, err, ErrInvalidOptions)
	require.ErrorContains(t, err, `Objectives.Defaults["m"]`)
	_, err = New(Options{Objectives: front.Objectives{Unattainable: 7}})
	require.ErrorContains(t, err, "Objectives.Unattainable 7")
}

// A disaggregated model in gateway mode: the prefill request's round
// trip teaches the prefill replica its time to first token, the decode
// (streamed, so its first token is seen) the decode replica its time per
// token; with Reject, a split plan whose prefill no replica is predicted
// to meet within 1 ms is refused before any engine sees it.
func TestObjectivePDGatewayMode(t *testing.T) {
	f := newPDFixtureOpts(t, 1, 1, nil, Options{Clock: (&stepClock{}).Now, Objectives: front.Objectives{Unattainable: front.Reject}})
	for i := range 40 { // about 30 first tokens publish the time per block
		// Without stream_options: the fake engine's usage always says 1
		// token; its chunks are counted instead.
		resp := f.post("/v1/chat/completions", chatBody(testModel, true, "sys", strings.Repeat("many words here ", 1+i)))
		b := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		require.Regexp(t, `^split`, resp.Header.Get(HeaderDisagg))
	}
	f.settle()
	plan := f.srv.Snapshot().Models[testModel].PD.Plan
	pre, err := plan.Prefill.RouteWith(gateway.Key{7, 8, 9}, gateway.Target{})
	require.NoError(t, err)
	pre.Done(gateway.DoneInfo{})
	assert.Positive(t, pre.PredictedTTFT, "the prefill replica's time to first token is learned")
	dec, err := plan.Decode.RouteWith(gateway.Key{7, 8, 9}, gateway.Target{})
	require.NoError(t, err)
	dec.Done(gateway.DoneInfo{})
	assert.Positive(t, dec.PredictedTPOT, "the decode replica's time per token is learned")

	seen := len(f.prefill[0].requests()) + len(f.decode[0].requests())
	resp := f.post("/v1/chat/completions", pdBody(true, "one more question"), "x-slo-ttft-ms", "1")
	b := readAll(t, resp)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s", b)
	assert.Contains(t, string(b), "slo_unattainable")
	assert.Equal(t, seen, len(f.prefill[0].requests())+len(f.decode[0].requests()), "no engine saw it")
	f.settle()
	for _, g := range []*gateway.Gateway{plan.Prefill, plan.Decode} {
		for _, r := range g.Replicas() {
			assert.Zero(t, r.InFlight, "both decisions are released")
		}
	}
}

// With flow control (one request at a time), the rule applies to the
// decision made when the request leaves the queue; the refused request's
// decision is released, so the next one gets the slot.
func TestObjectiveRejectWithFlowControl(t *testing.T) {
	f := sloFixture(t, front.Objectives{Unattainable: front.Reject}, flowOn(flow.Config{}))
	for range 2 {
		resp := f.post("/v1/chat/completions", chatBody(testModel, true, "sys", "hi"), "x-slo-ttft-ms", "1")
		readAll(t, resp)
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	}
	resp := f.post("/v1/chat/completions", chatBody(testModel, true, "sys", "hi"))
	readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, 2.0, f.counter("exa_gateway_slo_unattainable_total", map[string]string{"action": "rejected"}))
}

// A whole answer (relayed as the engine sends it) shows no first token:
// once the library predicts one, the gateway releases the replica's
// pending prefill at the predicted time, while the answer is still being
// generated, rather than at its end.
func TestWholeAnswerReleasesPrefillWhenPredicted(t *testing.T) {
	gate := make(chan struct{})
	waiting := make(chan struct{}, 1)
	engine := rawEngine(t, func(c net.Conn, req *http.Request) bool {
		if req.URL.Path != "/v1/chat/completions" {
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
			return true
		}
		if req.Header.Get("X-Test-Whole") == "" {
			body := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\ndata: [DONE]\n\n"
			_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			return true
		}
		waiting <- struct{}{}
		<-gate
		body := `{"choices":[{"message":{"content":"ab"}}],"usage":{"completion_tokens":2}}`
		_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		return true
	})
	f := rawFixture(t, Options{Clock: (&stepClock{}).Now, UpstreamStream: UpstreamStreamOff}, engine)
	// Streams teach the library the replica's time to first token.
	for i := range 40 { // about 30 first tokens publish the time per block
		resp := f.post("/v1/chat/completions", chatBody(testModel, true, "sys", strings.Repeat("words ", 1+10*(i%6))))
		readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	f.settle()
	// The predicted release fires at once here; the response timer never.
	var released atomic.Int32
	f.srv.afterFunc = func(d time.Duration, fire func()) func() bool {
		if d == DefaultResponseTimeout {
			return func() bool { return true }
		}
		released.Add(1)
		fire()
		return func() bool { return false }
	}
	g := f.srv.Snapshot().Models[testModel].Gateway
	done := make(chan *http.Response)
	go func() {
		done <- fronttest.Post(t, f.http.URL, "/v1/chat/completions", chatBody(testModel, false, "sys", "a new prompt of its own here"), "X-Test-Whole", "1")
	}()
	<-waiting
	assert.Equal(t, int32(1), released.Load())
	for _, r := range g.Replicas() {
		assert.Zero(t, r.PendingPrefill, "released while the answer is generated")
		assert.Equal(t, 1, r.InFlight)
	}
	close(gate)
	resp := <-done
	readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

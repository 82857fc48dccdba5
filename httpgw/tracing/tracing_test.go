package tracing

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/httpgw"
	"github.com/examlops/gateway/httpgw/enginetest"
)

const clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"

func gatewayOver(t *testing.T, engines ...*enginetest.Engine) *httpgw.Server {
	t.Helper()
	var reps []config.Replica
	for i, e := range engines {
		reps = append(reps, config.Replica{Name: "e" + string(rune('0'+i)), Address: e.URL()})
	}
	s, err := httpgw.New(httpgw.Options{})
	require.NoError(t, err)
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{"m1": {Mode: gateway.ModeCacheAware, Replicas: reps}}}))
	return s
}

func attrs(s sdktrace.ReadOnlySpan) map[string]attribute.Value {
	out := map[string]attribute.Value{}
	for _, kv := range s.Attributes() {
		out[string(kv.Key)] = kv.Value
	}
	return out
}

// A request with a traceparent gets a server span in the client's trace,
// with the routing decision as attributes; the engine receives the
// gateway span's context; the caller's request keeps the client's.
func TestHandlerSpan(t *testing.T) {
	eng := enginetest.New(enginetest.Options{Model: "m1"})
	defer eng.Close()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	h := Handler(gatewayOver(t, eng), tp)

	parent := "00-" + clientTrace + "-00f067aa0ba902b7-01"
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"m1","messages":[{"role":"user","content":"hello there"}]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Traceparent", parent)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	assert.Equal(t, parent, req.Header.Get("Traceparent"), "the caller's request is restored")

	spans := exp.GetSpans().Snapshots()
	require.Len(t, spans, 1)
	s := spans[0]
	assert.Equal(t, clientTrace, s.SpanContext().TraceID().String())
	assert.Equal(t, "00f067aa0ba902b7", s.Parent().SpanID().String())
	a := attrs(s)
	assert.Equal(t, "e0", a["exa.replica"].AsString())
	assert.Equal(t, "load_aware", a["exa.decision.kind"].AsString(), "a cold cache-aware model routes by load")
	assert.Equal(t, int64(0), a["exa.decision.matched_blocks"].AsInt64())
	assert.Positive(t, a["exa.decision.blocks"].AsInt64())
	assert.Equal(t, int64(200), a["http.response.status_code"].AsInt64())

	hdr, _ := eng.LastRequest()
	tpEngine := hdr.Get("Traceparent")
	assert.True(t, strings.HasPrefix(tpEngine, "00-"+clientTrace+"-"+s.SpanContext().SpanID().String()), tpEngine)
}

// A 5xx answer marks the span as an error; a request without a
// traceparent starts a trace of its own.
func TestHandlerErrorSpan(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	h := Handler(gatewayOver(t), tp) // m1 has no replicas: 503
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"m1","messages":[{"role":"user","content":"x"}]}`))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	spans := exp.GetSpans().Snapshots()
	require.Len(t, spans, 1)
	assert.False(t, spans[0].Parent().IsValid())
	assert.Equal(t, codes.Error, spans[0].Status().Code)
	assert.Empty(t, req.Header.Values("Traceparent"))
}

// Off by default: no endpoint, no wrapping.
func TestSetupOff(t *testing.T) {
	tp, shutdown, err := Setup(context.Background(), Options{})
	require.NoError(t, err)
	require.NoError(t, shutdown(context.Background()))
	mux := http.NewServeMux()
	assert.Same(t, mux, Handler(mux, tp), "the handler is returned as is")

	_, _, err = Setup(context.Background(), Options{Endpoint: "127.0.0.1:4317", SampleRatio: 2})
	require.ErrorIs(t, err, ErrOptions)
	for _, bad := range []float64{-0.5, math.NaN(), math.Inf(1)} {
		_, _, err = Setup(context.Background(), Options{Endpoint: "127.0.0.1:4317", SampleRatio: bad})
		require.ErrorIs(t, err, ErrOptions, "SampleRatio %v", bad)
		assert.Contains(t, err.Error(), "SampleRatio", "the error names the field")
	}
	tp, shutdown, err = Setup(context.Background(), Options{Endpoint: "127.0.0.1:4317", Insecure: true})
	require.NoError(t, err, "the exporter connects lazily")
	assert.NotNil(t, tp)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = shutdown(ctx)
}

func TestDecisionAttributes(t *testing.T) {
	got := map[string]attribute.Value{}
	for _, kv := range decisionAttributes("affinity; matched=12/14; index=exact") {
		got[string(kv.Key)] = kv.Value
	}
	assert.Equal(t, "affinity", got["exa.decision.kind"].AsString())
	assert.Equal(t, int64(12), got["exa.decision.matched_blocks"].AsInt64())
	assert.Equal(t, int64(14), got["exa.decision.blocks"].AsInt64())
	got = map[string]attribute.Value{}
	for _, kv := range decisionAttributes("weird; matched=x/y") {
		got[string(kv.Key)] = kv.Value
	}
	assert.NotContains(t, got, "exa.decision.blocks")
}

// W3C trace context (§4.3, processing model): a tracestate that comes
// without a valid traceparent (none, version ff, all-zero ids, uppercase
// hex) is discarded; the engine gets the gateway's new trace and no
// tracestate, and the caller's request keeps what the client sent.
func TestHandlerDropsOrphanTracestate(t *testing.T) {
	eng := enginetest.New(enginetest.Options{Model: "m1"})
	defer eng.Close()
	exp := tracetest.NewInMemoryExporter()
	h := Handler(gatewayOver(t, eng), sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)))
	for _, parent := range []string{
		"",
		"ff-" + clientTrace + "-00f067aa0ba902b7-01",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"00-" + clientTrace + "-0000000000000000-01",
		"00-" + strings.ToUpper(clientTrace) + "-00f067aa0ba902b7-01",
	} {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
			strings.NewReader(`{"model":"m1","messages":[{"role":"user","content":"hello there"}]}`))
		req.Header.Set("Content-Type", "application/json")
		if parent != "" {
			req.Header.Set("Traceparent", parent)
		}
		req.Header.Set("Tracestate", "congo=t61rcWkgMzE")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		hdr, _ := eng.LastRequest()
		assert.NotContains(t, hdr.Get("Traceparent"), clientTrace, "traceparent %q", parent)
		assert.Empty(t, hdr.Values("Tracestate"), "traceparent %q: the engine got the client's tracestate without its traceparent", parent)
		assert.Equal(t, "congo=t61rcWkgMzE", req.Header.Get("Tracestate"), "the caller's request is restored")
	}
}

// An answer the gateway aborts (http.ErrAbortHandler: an engine that
// failed mid-answer, its connection cut) still gets its span's attributes,
// and an Error status; the panic goes on to the server, which cuts the
// connection.
func TestHandlerAbortedSpan(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	h := Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(httpgw.HeaderReplica, "e0")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(`{"id":`))
		panic(http.ErrAbortHandler)
	}), tp)
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{}`))
	req.Header.Set("Traceparent", "00-"+clientTrace+"-00f067aa0ba902b7-01")
	func() {
		defer func() { assert.Equal(t, http.ErrAbortHandler, recover(), "the abort goes on to the server") }()
		h.ServeHTTP(httptest.NewRecorder(), req)
	}()
	assert.Equal(t, "00-"+clientTrace+"-00f067aa0ba902b7-01", req.Header.Get("Traceparent"), "the caller's request is restored")
	spans := exp.GetSpans().Snapshots()
	require.Len(t, spans, 1)
	a := attrs(spans[0])
	assert.Equal(t, "e0", a["exa.replica"].AsString())
	assert.Equal(t, int64(200), a["http.response.status_code"].AsInt64())
	assert.Equal(t, codes.Error, spans[0].Status().Code, "a cut answer is an error")
}

// W3C trace context 3.3.1.1: a tracestate sent as several header lines is
// one list, its lines combined; the engine gets every member.
func TestHandlerCombinesTracestateLines(t *testing.T) {
	eng := enginetest.New(enginetest.Options{Model: "m1"})
	defer eng.Close()
	h := Handler(gatewayOver(t, eng), sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewInMemoryExporter())))
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"m1","messages":[{"role":"user","content":"hello there"}]}`))
	req.Header.Set("Traceparent", "00-"+clientTrace+"-00f067aa0ba902b7-01")
	req.Header.Add("Tracestate", "congo=t61rcWkgMzE")
	req.Header.Add("Tracestate", "rojo=00f067aa0ba902b7")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	hdr, _ := eng.LastRequest()
	ts := strings.Join(hdr.Values("Tracestate"), ",")
	assert.Contains(t, ts, "congo=t61rcWkgMzE")
	assert.Contains(t, ts, "rojo=00f067aa0ba902b7")
	assert.Equal(t, []string{"congo=t61rcWkgMzE", "rojo=00f067aa0ba902b7"}, req.Header.Values("Tracestate"), "the caller's request is restored")
}

// FuzzHandlerTraceHeaders: whatever trace-context headers a client sends,
// Handler does not panic, the next handler sees one valid W3C traceparent
// of the gateway's span (version 00, lowercase hex, ids not all zero) and
// a tracestate only alongside a valid client traceparent, and the
// caller's headers are restored as they came.
func FuzzHandlerTraceHeaders(f *testing.F) {
	f.Add("00-"+clientTrace+"-00f067aa0ba902b7-01", "congo=t61rcWkgMzE", "rojo=1", "k=v")
	f.Add("ff-"+clientTrace+"-00f067aa0ba902b7-01", "congo=t61rcWkgMzE", "", "")
	f.Add("00-00000000000000000000000000000000-00f067aa0ba902b7-01", "a=b", "", "")
	f.Add("00-"+strings.ToUpper(clientTrace)+"-00f067aa0ba902b7-01", "", "", "")
	f.Add("cc-"+clientTrace+"-00f067aa0ba902b7-09-future", "x@y=z", ",,", "%%")
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewInMemoryExporter()))
	valid := func(v string) bool {
		if len(v) != 55 || !strings.HasPrefix(v, "00-") || v[35] != '-' || v[52] != '-' {
			return false
		}
		for i, c := range v {
			if i == 2 || i == 35 || i == 52 {
				continue
			}
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false
			}
		}
		return v[3:35] != strings.Repeat("0", 32) && v[36:52] != strings.Repeat("0", 16)
	}
	f.Fuzz(func(t *testing.T, parent, state1, state2, baggage string) {
		in := http.Header{}
		for k, v := range map[string]string{"Traceparent": parent, "Baggage": baggage} {
			if v != "" {
				in[k] = []string{v}
			}
		}
		for _, v := range []string{state1, state2} {
			if v != "" {
				in["Tracestate"] = append(in["Tracestate"], v)
			}
		}
		var seen http.Header
		h := Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			seen = r.Header.Clone()
		}), tp)
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		req.Header = in.Clone()
		h.ServeHTTP(httptest.NewRecorder(), req)
		require.Len(t, seen.Values("Traceparent"), 1)
		require.True(t, valid(seen.Get("Traceparent")), "sent %q", seen.Get("Traceparent"))
		h2 := http.Header{}
		h2.Set("Traceparent", parent)
		clientCtx := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(h2)))
		if !clientCtx.IsValid() {
			require.Empty(t, seen.Values("Tracestate"), "a tracestate without a valid traceparent")
		} else {
			require.Equal(t, clientCtx.TraceID(), trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(seen))).TraceID())
		}
		require.Equal(t, in, req.Header, "the caller's headers are restored")
	})
}

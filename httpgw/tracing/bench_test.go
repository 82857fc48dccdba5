package tracing

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/examlops/gateway/httpgw"
)

// discardExporter drops spans.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// BenchmarkHandler measures the tracing wrapper's own cost per request
// (extract, span, inject, attributes, batch export to a discarding
// exporter) around a handler that only sets the gateway's answer headers.
func BenchmarkHandler(b *testing.B) {
	next := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set(httpgw.HeaderReplica, "r0")
		w.Header().Set(httpgw.HeaderDecision, "affinity; matched=12/14")
		w.WriteHeader(http.StatusOK)
	})
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardExporter{}))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	for _, bc := range []struct {
		name string
		h    http.Handler
	}{{"off", next}, {"traced", Handler(next, tp)}} {
		b.Run(bc.name, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
			req.Header.Set("Traceparent", "00-"+clientTrace+"-00f067aa0ba902b7-01")
			w := httptest.NewRecorder()
			b.ReportAllocs()
			for b.Loop() {
				clear(w.Header())
				bc.h.ServeHTTP(w, req)
			}
		})
	}
}

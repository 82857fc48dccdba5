package main

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// logRequests wraps h to log one line per request at debug (method, path,
// status, bytes written, duration); h itself when debug is off, so the
// request path costs nothing then.
func logRequests(h http.Handler, logger *slog.Logger) http.Handler {
	if !logger.Enabled(context.Background(), slog.LevelDebug) {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(rw, r)
		logger.Debug("request", "method", r.Method, "path", r.URL.Path, "status", rw.status, "bytes", rw.n,
			"duration", time.Since(start), "remote", r.RemoteAddr)
	})
}

// statusWriter records the status and byte count of a response. Flush
// and Unwrap keep streaming (http.ResponseController) working.
type statusWriter struct {
	http.ResponseWriter
	status int
	n      int64
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	w.wrote = true
	n, err := w.ResponseWriter.Write(p)
	w.n += int64(n)
	return n, err
}

// Flush flushes the wrapped writer when it can.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap returns the wrapped writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// logStreams is a gRPC stream interceptor logging one line per stream at
// debug (an ext_proc stream is one request): method, gRPC code, duration.
// Nil when debug is off.
func logStreams(logger *slog.Logger) grpc.StreamServerInterceptor {
	if !logger.Enabled(context.Background(), slog.LevelDebug) {
		return nil
	}
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		err := handler(srv, ss)
		logger.Debug("request", "method", info.FullMethod, "code", status.Code(err).String(), "duration", time.Since(start))
		return err
	}
}

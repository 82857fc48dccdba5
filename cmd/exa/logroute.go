package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel"
	"google.golang.org/grpc/grpclog"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// routeLogs sends what the libraries log through logger, so that with
// --log-format json every line on stderr is one JSON object: the log
// package's default logger (OpenTelemetry's error handler, "traces
// export: …", at Warn), klog (client-go's informers), controller-runtime's
// logger (its cache), OpenTelemetry's own logger
// and gRPC's (whose Info and Warning lines, hidden by default, are Debug
// here). It sets process-wide loggers: the serve commands call it once,
// before they start anything that logs.
func routeLogs(logger *slog.Logger) {
	slog.SetDefault(logger)
	log.SetOutput(slog.NewLogLogger(logger.Handler(), slog.LevelWarn).Writer()) // after SetDefault, which sets it at Info
	log.SetFlags(0)
	klog.SetSlogLogger(logger)
	lr := logr.FromSlogHandler(logger.Handler())
	ctrllog.SetLogger(lr) // else it prints a plain-text warning after 30 s
	otel.SetLogger(lr)
	grpclog.SetLoggerV2(grpcLogger{logger})
}

// grpcLogger is gRPC's LoggerV2 over slog.
type grpcLogger struct{ l *slog.Logger }

func (g grpcLogger) log(level slog.Level, msg string) {
	g.l.Log(context.Background(), level, "grpc: "+msg)
}

func (g grpcLogger) Info(args ...any)   { g.log(slog.LevelDebug, fmt.Sprint(args...)) }
func (g grpcLogger) Infoln(args ...any) { g.log(slog.LevelDebug, sprintln(args...)) }
func (g grpcLogger) Infof(format string, args ...any) {
	g.log(slog.LevelDebug, fmt.Sprintf(format, args...))
}
func (g grpcLogger) Warning(args ...any)   { g.log(slog.LevelDebug, fmt.Sprint(args...)) }
func (g grpcLogger) Warningln(args ...any) { g.log(slog.LevelDebug, sprintln(args...)) }
func (g grpcLogger) Warningf(format string, args ...any) {
	g.log(slog.LevelDebug, fmt.Sprintf(format, args...))
}
func (g grpcLogger) Error(args ...any)   { g.log(slog.LevelError, fmt.Sprint(args...)) }
func (g grpcLogger) Errorln(args ...any) { g.log(slog.LevelError, sprintln(args...)) }
func (g grpcLogger) Errorf(format string, args ...any) {
	g.log(slog.LevelError, fmt.Sprintf(format, args...))
}
func (g grpcLogger) Fatal(args ...any)   { g.log(slog.LevelError, fmt.Sprint(args...)); os.Exit(1) }
func (g grpcLogger) Fatalln(args ...any) { g.log(slog.LevelError, sprintln(args...)); os.Exit(1) }
func (g grpcLogger) Fatalf(format string, args ...any) {
	g.log(slog.LevelError, fmt.Sprintf(format, args...))
	os.Exit(1)
}

// V reports whether gRPC's verbosity level l is logged: 0 only, at
// Debug (gRPC's default verbosity is 0).
func (g grpcLogger) V(l int) bool {
	return l <= 0 && g.l.Enabled(context.Background(), slog.LevelDebug)
}

func sprintln(args ...any) string {
	s := fmt.Sprintln(args...)
	return s[:len(s)-1]
}

// jsonLogs reports whether cmd runs with JSON logs: --log-format json, or
// GIE's --zap-encoder json without --log-format.
func jsonLogs(cmd *cobra.Command) bool {
	if cmd == nil {
		return false
	}
	for _, name := range []string{"log-format", "zap-encoder"} {
		if f := cmd.Flags().Lookup(name); f != nil && f.Changed {
			return f.Value.String() == "json"
		}
	}
	return false
}

// announce writes a serve command's start line to w (stdout): as text,
// or with JSON logs as a JSON log record whose msg is the same text and
// whose attributes are attrs.
func announce(w io.Writer, json bool, msg string, attrs ...any) {
	if json {
		slog.New(slog.NewJSONHandler(w, nil)).Info(msg, attrs...)
		return
	}
	fmt.Fprintln(w, msg)
}

// errorLine writes run's closing error message to w: as text, or with
// JSON logs as a JSON log record at level ERROR.
func errorLine(w io.Writer, json bool, msg string) {
	if json {
		slog.New(slog.NewJSONHandler(w, nil)).Error(msg)
		return
	}
	fmt.Fprintln(w, msg)
}

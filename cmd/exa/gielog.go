package main

import (
	"strconv"
	"strings"

	"github.com/spf13/pflag"
)

// gieLogFlags are the zap logging flags GIE's endpoint picker binds
// (v1.5.0 pkg/common/observability/logging/options.go, from
// controller-runtime v0.23 pkg/log/zap: --zap-devel, --zap-log-level,
// --zap-stacktrace-level, --zap-time-encoding; --zap-encoder and -v are
// in gieFlags). Their values are checked as zap checks them; the level
// maps onto --log-level, the others change nothing here (logs are slog's,
// with RFC 3339 times and no stack traces).
type gieLogFlags struct {
	devel                         bool
	level, stacktrace, timeFormat string
}

// register declares the flags on f.
func (z *gieLogFlags) register(f *pflag.FlagSet) {
	f.BoolVar(&z.devel, "zap-devel", true, "GIE: accepted; the log format and level come from --zap-encoder and --zap-log-level or -v")
	f.StringVar(&z.level, "zap-log-level", "", "GIE: log level, debug, info, error, panic or a verbosity N > 0 (as -v N); same as --log-level debug, info, error, error, and debug for N ≥ 4, else info")
	f.StringVar(&z.stacktrace, "zap-stacktrace-level", "", "GIE: accepted (info, error or panic); no stack traces are logged")
	f.StringVar(&z.timeFormat, "zap-time-encoding", "", "GIE: accepted (epoch, millis, nano, iso8601, rfc3339 or rfc3339nano); log times are RFC 3339")
}

// logLevel returns the --log-level that --zap-log-level names ("" when it
// is not set), or a usage error. A set --log-level conflicts with it; -v
// is overridden by it, as in GIE.
func (z *gieLogFlags) apply(f *pflag.FlagSet) (string, error) {
	if f.Changed("zap-stacktrace-level") {
		switch strings.ToLower(z.stacktrace) {
		case "info", "error", "panic":
		default:
			return "", usagef("invalid --zap-stacktrace-level %q: want info, error or panic", z.stacktrace)
		}
	}
	if f.Changed("zap-time-encoding") {
		switch strings.ToLower(z.timeFormat) {
		case "epoch", "millis", "nano", "iso8601", "rfc3339", "rfc3339nano":
		default:
			return "", usagef("invalid --zap-time-encoding %q: want epoch, millis, nano, iso8601, rfc3339 or rfc3339nano", z.timeFormat)
		}
	}
	if !f.Changed("zap-log-level") {
		return "", nil
	}
	if f.Changed("log-level") {
		return "", usagef("invalid --zap-log-level %q: --log-level is set too; use one", z.level)
	}
	switch strings.ToLower(z.level) {
	case "debug":
		return "debug", nil
	case "info":
		return "info", nil
	case "error", "panic":
		return "error", nil
	}
	n, err := strconv.Atoi(z.level)
	switch {
	case err != nil || n <= 0:
		return "", usagef("invalid --zap-log-level %q: want debug, info, error, panic or an integer > 0", z.level)
	case n >= 4: // GIE's DEBUG verbosity
		return "debug", nil
	}
	return "info", nil
}

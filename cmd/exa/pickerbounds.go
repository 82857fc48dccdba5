package main

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/examlops/gateway/picker"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
)

// pickerConnFlags bound the connections of the picker's gRPC port: how
// many may be open, how long one may take to handshake, how long one may
// stay without streams.
type pickerConnFlags struct {
	maxConns                  int
	handshakeTimeout, maxIdle time.Duration
}

func (c *pickerConnFlags) register(f *pflag.FlagSet) {
	f.IntVar(&c.maxConns, "max-connections", picker.DefaultMaxConnections,
		"gRPC connections the picker keeps open at once; one past it is closed as it is accepted")
	f.DurationVar(&c.handshakeTimeout, "handshake-timeout", picker.DefaultHandshakeTimeout,
		"how long a new gRPC connection may take to send its TLS handshake (with TLS), HTTP/2 preface and first SETTINGS frame before it is closed")
	f.DurationVar(&c.maxIdle, "max-connection-idle", picker.DefaultMaxConnectionIdle,
		"send GOAWAY to a gRPC connection that has had no stream this long, and close it (0 = never)")
}

func (c *pickerConnFlags) validate() error {
	if c.maxConns < 1 {
		return usagef("invalid --max-connections %q: must be at least 1", fmt.Sprint(c.maxConns))
	}
	if c.handshakeTimeout <= 0 {
		return usagef("invalid --handshake-timeout %q: must be positive", c.handshakeTimeout.String())
	}
	if c.maxIdle < 0 {
		return usagef("invalid --max-connection-idle %q: must not be negative", c.maxIdle.String())
	}
	return nil
}

// limits sets the flags' bounds on l.
func (c *pickerConnFlags) limits(l picker.GRPCLimits) picker.GRPCLimits {
	l.HandshakeTimeout, l.MaxConnectionIdle = c.handshakeTimeout, c.maxIdle
	if c.maxIdle == 0 {
		l.MaxConnectionIdle = -1
	}
	return l
}

// listen wraps ln in the connection bound and registers its metrics.
func (c *pickerConnFlags) listen(ln net.Listener, reg prometheus.Registerer) *picker.ConnLimiter {
	lim := picker.LimitListener(ln, c.maxConns)
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "exa_picker_connections",
			Help: "gRPC connections open (at most --max-connections)."}, func() float64 { return float64(lim.Open()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "exa_picker_connections_refused_total",
			Help: "gRPC connections closed as they were accepted because --max-connections were open."}, func() float64 { return float64(lim.Refused()) }))
	return lim
}

// startMemoryGovernor runs a memoryGovernor of pk, whose streams hold at
// most budget bytes, until ctx ends.
func startMemoryGovernor(ctx context.Context, budget int64, pk *picker.Server) {
	g := newMemoryGovernor(budget, func() int64 { return pk.Stats().ReservedBytes })
	tick := time.NewTicker(governorTick)
	go func() {
		defer tick.Stop()
		g.run(ctx, tick.C)
	}()
}

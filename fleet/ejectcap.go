package fleet

import (
	"context"
	"errors"
	"net"
	"strconv"

	"github.com/examlops/gateway"
)

// DefaultMaxEjectionPercent is Options.MaxEjectionPercent's default: at
// most half of a model's engines are ejected at once. Envoy's
// max_ejection_percent defaults to 10%, for clusters of many hosts; an
// LLM pool has a few engines, where 10% ejects none of fewer than ten,
// and a gateway whose own probes time out (CPU starvation, a partition of
// the gateway) would otherwise eject them all at once. Half lets a
// minority of failed engines out of a pool of two or more and keeps the
// rest serving.
const DefaultMaxEjectionPercent = 50

// EjectionAllowed reports whether one more engine of a pool of total may
// be ejected while ejected of them already are, under maxPercent: the
// ejected share after it stays at most maxPercent% (rounded down, so that
// with maxPercent < 100 at least one engine always stays in; with 100,
// all may go). Unlike Envoy, which ejects one host whatever the share,
// a pool too small for the share to count one engine ejects none: at 50%,
// a pool of one.
func EjectionAllowed(ejected, total, maxPercent int) bool {
	return (ejected+1)*100 <= total*maxPercent
}

// EjectSource is what observed the failures that eject an engine.
type EjectSource uint8

const (
	// SourceTraffic: the answers to served requests (passive, outlier
	// detection).
	SourceTraffic EjectSource = iota
	// SourceProbe: the active /health probes.
	SourceProbe
)

func (s EjectSource) String() string {
	if s == SourceProbe {
		return "probe"
	}
	return "traffic"
}

// EjectReason is why an engine was ejected; with EjectSource it is the
// bounded label set of the ejections metric.
type EjectReason uint8

const (
	// ReasonError: consecutive failed answers (5xx or transport errors)
	// or probes failing with another transport error.
	ReasonError EjectReason = iota
	// ReasonTimeout: a probe or a request did not answer in time.
	ReasonTimeout
	// ReasonRefused: the connection was refused (nothing listening).
	ReasonRefused
	// ReasonStatus: /health answered a status other than 2xx.
	ReasonStatus
)

func (r EjectReason) String() string {
	switch r {
	case ReasonTimeout:
		return "timeout"
	case ReasonRefused:
		return "refused"
	case ReasonStatus:
		return "status"
	}
	return "error"
}

// Cause is why one observation failed: what saw it, the reason and a
// detail for the log ("status 503", the error's text).
type Cause struct {
	Source EjectSource
	Reason EjectReason
	Detail string
}

// probeCause classifies a failed probe: its error, else its status.
func probeCause(err error, status int) Cause {
	c := Cause{Source: SourceProbe}
	switch {
	case err == nil:
		c.Reason, c.Detail = ReasonStatus, "status "+strconv.Itoa(status)
		return c
	case isTimeout(err):
		c.Reason = ReasonTimeout
	case IsDialError(err):
		c.Reason = ReasonRefused
	default:
		c.Reason = ReasonError
	}
	c.Detail = err.Error()
	return c
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// allowEjection decides, under s.mu, whether ep's ejection stands: for
// every model that uses ep, the engines of that model already ejected
// (counted ones) plus ep stay within MaxEjectionPercent, and so do those
// of a disaggregated model's decode pool when ep decodes there: an empty
// decode pool leaves the model nothing to serve on (an empty prefill pool
// decodes co-located, docs/disaggregation.md).
func (s *Fleet) allowEjection(ep *Endpoint) (ok bool, ejected, total int) {
	for _, m := range s.state.Load().Models {
		pools := []*gateway.Gateway{nil} // nil: all the model's engines
		if m.PD != nil {
			pools = append(pools, m.Gateway) // its decode pool's
		}
		for _, pool := range pools {
			seen := map[*Endpoint]bool{}
			uses := false
			n := 0
			for name, e := range m.ByName {
				if seen[e] || pool != nil && m.gatewayOf(name) != pool {
					continue
				}
				seen[e] = true
				uses = uses || e == ep
				if e != ep && e.Health.counted() {
					n++
				}
			}
			if uses && !EjectionAllowed(n, len(seen), s.opts.MaxEjectionPercent) {
				return false, n, len(seen)
			}
		}
	}
	return true, 0, 0
}

package fleet

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/examlops/gateway"
)

// HealthEvent is what a health observation did to an endpoint.
type HealthEvent int

const (
	healthNoChange HealthEvent = iota
	healthEjected
	healthReadmitted
)

// Health tracks one endpoint's health, as Envoy's active health
// checking and outlier detection do together:
//
//   - Active probes: ejectAfter consecutive failed probes eject the
//     endpoint; readmitAfter consecutive successful probes readmit it.
//   - Passive (outlier) detection on served traffic: ejectAfter consecutive
//     failures (5xx answers, gateway errors: a reset, a timeout) eject it
//     for a back-off of backoff × the number of times it was ejected so
//     (at most maxBackoff; Envoy's base_ejection_time and
//     max_ejection_time, 30s and 300s by default), during which no probe
//     readmits it; after it, readmitAfter successful probes do. A
//     successful probe does not reset the passive count: an engine whose
//     /health passes while its answers fail stays ejected.
//   - A refused connection (fatal) ejects at once; probes readmit it, as
//     they would after probe failures: the engine is down, not misbehaving.
//   - A request that timed out ejects at once with the back-off (timeout:
//     a hanging engine costs one timeout, not ejectAfter of them).
//
// An ejection the Fleet refuses (Options.MaxEjectionPercent; Observe) is
// undone at once; the failure counts stay, so the next failure asks
// again.
//
// Only active probes readmit: no traffic goes to an ejected endpoint to
// prove otherwise. A successful answer resets the passive count and
// lowers the back-off multiplier by one. It is safe for concurrent use;
// the zero value is a healthy endpoint with thresholds of 1 and no
// back-off (clock nil).
type Health struct {
	mu           sync.Mutex
	ejected      bool
	probeFails   int // consecutive failed probes
	fails        int // consecutive passive failures
	oks          int // consecutive successful probes while ejected
	ejectAfter   int
	readmitAfter int

	clock               func() time.Time // nil: no back-off
	backoff, maxBackoff time.Duration
	until               time.Time // end of the current outlier back-off
	outliers            int       // the back-off multiplier
	prevOutliers        int       // outliers before the current ejection

	cause  Cause // why the current (or last) ejection
	held   bool  // the current ejection stands (Fleet.Observe allowed it)
	capped bool  // an ejection was refused since the last success
}

func (h *Health) Healthy() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.ejected
}

// Failure records a failed answer or exchange (passive); fatal (a refused
// connection) ejects at once, without back-off.
func (h *Health) Failure(fatal bool) HealthEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.oks = 0
	h.fails++
	if h.ejected {
		return healthNoChange
	}
	if fatal {
		h.ejected, h.prevOutliers = true, h.outliers
		h.cause = Cause{SourceTraffic, ReasonRefused, "connection refused"}
		return healthEjected
	}
	if h.fails >= max(h.ejectAfter, 1) {
		h.eject()
		h.cause = Cause{SourceTraffic, ReasonError, strconv.Itoa(h.fails) + " consecutive failed answers (5xx or transport errors)"}
		return healthEjected
	}
	return healthNoChange
}

// Timeout records a request the endpoint did not answer in time: it is
// ejected at once, with the back-off.
func (h *Health) Timeout() HealthEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.oks = 0
	h.fails++
	if h.ejected {
		return healthNoChange
	}
	h.eject()
	h.cause = Cause{SourceTraffic, ReasonTimeout, "request timed out"}
	return healthEjected
}

// FailedWith records a failed exchange whose error was err: a refused
// connection ejects at once (failure(true)), a timeout (timedOut) ejects at
// once with the back-off (timeout), another error counts (failure(false)).
func (h *Health) FailedWith(err error, timedOut bool) HealthEvent {
	if timedOut {
		return h.Timeout()
	}
	return h.Failure(IsDialError(err))
}

// eject ejects the endpoint as an outlier, with the back-off; h.mu held.
func (h *Health) eject() {
	h.ejected, h.prevOutliers = true, h.outliers
	h.outliers++
	if h.clock == nil || h.backoff <= 0 {
		return
	}
	d := h.backoff * time.Duration(min(h.outliers, 1<<16))
	if h.maxBackoff > 0 {
		d = min(d, h.maxBackoff)
	}
	h.until = h.clock().Add(d)
}

// probeFailure records a failed active probe, failed for c.
func (h *Health) probeFailure(c Cause) HealthEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.oks = 0
	h.probeFails++
	if !h.ejected && h.probeFails >= max(h.ejectAfter, 1) {
		h.ejected, h.prevOutliers = true, h.outliers
		if h.probeFails > 1 {
			c.Detail = strconv.Itoa(h.probeFails) + " consecutive probes failed, the last: " + c.Detail
		}
		h.cause = c
		return healthEjected
	}
	return healthNoChange
}

// Cause returns why the endpoint was last ejected (the zero Cause if it
// never was).
func (h *Health) Cause() Cause {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cause
}

// counted reports whether the endpoint is ejected and its ejection
// stands: what the ejection cap counts.
func (h *Health) counted() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ejected && h.held
}

// hold records that the current ejection stands.
func (h *Health) hold() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held, h.capped = h.ejected, false
}

// refuse undoes the current ejection (the cap refused it), keeping the
// failure counts; it reports whether this is the first refusal since the
// endpoint last succeeded (the one worth a log line).
func (h *Health) refuse() (first bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.ejected || h.held {
		return false
	}
	h.ejected, h.until, h.outliers = false, time.Time{}, h.prevOutliers
	first, h.capped = !h.capped, true
	return first
}

// Success records a successful observation; probe says whether it came
// from an active probe (which may readmit) or from served traffic.
func (h *Health) Success(probe bool) HealthEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.capped = false
	if !probe {
		h.fails = 0
		h.outliers = max(h.outliers-1, 0)
		return healthNoChange
	}
	h.probeFails = 0
	if !h.ejected {
		return healthNoChange
	}
	if h.clock != nil && h.clock().Before(h.until) {
		// In an outlier back-off: the probe passing says nothing of
		// the answers.
		h.oks = 0
		return healthNoChange
	}
	h.oks++
	if h.oks >= max(h.readmitAfter, 1) {
		h.ejected, h.held = false, false
		h.oks, h.fails = 0, 0
		h.until = time.Time{}
		return healthReadmitted
	}
	return healthNoChange
}

// probe sends one GET /health to base and reports whether it answered
// 2xx, and if not, why.
func probe(ctx context.Context, client *http.Client, base string) (bool, Cause) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/health", nil)
	if err != nil {
		return false, probeCause(err, 0)
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, probeCause(err, 0)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return true, Cause{}
	}
	return false, probeCause(nil, resp.StatusCode)
}

// Endpoint is one engine address, shared by every replica entry (of any
// model) that names it: health and load are properties of the engine.
type Endpoint struct {
	Base string // normalised base URL, no trailing slash
	// HostOnly is base parsed, when it is plain http with a host and
	// nothing else (no path, query, user or fragment): the usual case,
	// for which requests are built without parsing a URL. Else nil.
	HostOnly *url.URL
	Health   Health

	lora endpointLoRA // LoRA adapters (lora.go)

	// feed serialises feeding this engine's load to the gateways: the
	// engines' scrapes and the peers' pushes run in loops of their own,
	// and a push must not overwrite a newer scrape with an older one.
	feed sync.Mutex

	// kvTokens is the KV-cache size, in tokens, the engine's last
	// scrape reported (vllm:cache_config_info), 0 until one does: the
	// capacity of its replicas whose configuration leaves cache_blocks
	// unset (tableOf).
	kvTokens atomic.Int64

	mu       sync.Mutex
	load     gateway.Load
	hasLoad  bool
	lastErr  string
	scrapeOK bool
}

func (e *Endpoint) setLoad(l gateway.Load, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		e.lastErr = err.Error()
		e.scrapeOK = false
		return
	}
	e.load, e.hasLoad, e.scrapeOK, e.lastErr = l, true, true, ""
}

func (e *Endpoint) SnapshotLoad() (gateway.Load, bool, bool, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.load, e.hasLoad, e.scrapeOK, e.lastErr
}

// NewEndpoint returns the endpoint of a normalised engine address.
func NewEndpoint(base string) *Endpoint {
	ep := &Endpoint{Base: base}
	u, err := url.Parse(base)
	if err == nil && u.Scheme == "http" && u.Host != "" && !strings.HasSuffix(u.Host, ":") && u.Path == "" &&
		u.RawQuery == "" && u.Fragment == "" && u.User == nil && u.Opaque == "" && !u.ForceQuery {
		ep.HostOnly = u
	}
	return ep
}

// IsDialError reports whether err is a failure to connect (the engine is
// not listening), which ejects the engine at once.
func IsDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// Failures returns the consecutive failed answers counted (the passive
// count that EjectAfter is compared with).
func (h *Health) Failures() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fails
}

// SetClock sets the time source of the outlier back-off (nil: no
// back-off); Apply sets it to Options.Clock.
func (h *Health) SetClock(clock func() time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.clock = clock
}

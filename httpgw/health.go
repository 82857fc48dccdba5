package httpgw

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/examlops/gateway"
)

// healthEvent is what a health observation did to an endpoint.
type healthEvent int

const (
	healthNoChange healthEvent = iota
	healthEjected
	healthReadmitted
)

// healthState tracks one endpoint's health: it is ejected after
// ejectAfter consecutive failures (active probe failures, 5xx responses,
// connection errors; a refused connection ejects at once) and readmitted
// after readmitAfter consecutive successful probes. Only active probes
// readmit an ejected endpoint: no traffic goes to it to prove otherwise.
// It is safe for concurrent use; the zero value is a healthy endpoint with
// thresholds of 1.
type healthState struct {
	mu           sync.Mutex
	ejected      bool
	fails, oks   int
	ejectAfter   int
	readmitAfter int
}

func (h *healthState) healthy() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.ejected
}

// failure records a failed observation; fatal ejects at once.
func (h *healthState) failure(fatal bool) healthEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.oks = 0
	h.fails++
	if !h.ejected && (fatal || h.fails >= max(h.ejectAfter, 1)) {
		h.ejected = true
		return healthEjected
	}
	return healthNoChange
}

// success records a successful observation; probe says whether it came
// from an active probe (which may readmit) or from served traffic.
func (h *healthState) success(probe bool) healthEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.fails = 0
	if !h.ejected {
		return healthNoChange
	}
	if !probe {
		return healthNoChange
	}
	h.oks++
	if h.oks >= max(h.readmitAfter, 1) {
		h.ejected = false
		h.oks = 0
		return healthReadmitted
	}
	return healthNoChange
}

// probe sends one GET /health to base and reports whether it answered
// 2xx.
func probe(ctx context.Context, client *http.Client, base string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/health", nil)
	if err != nil {
		return false
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode < 300
}

// endpoint is one engine address, shared by every replica entry (of any
// model) that names it: health and load are properties of the engine.
type endpoint struct {
	base string // normalised base URL, no trailing slash
	// hostOnly is base parsed, when it is plain http with a host and
	// nothing else (no path, query, user or fragment): the usual case,
	// for which requests are built without parsing a URL. Else nil.
	hostOnly *url.URL
	health   healthState

	lora endpointLoRA // LoRA adapters (lora.go)

	mu       sync.Mutex
	load     gateway.Load
	hasLoad  bool
	lastErr  string
	scrapeOK bool
}

func (e *endpoint) setLoad(l gateway.Load, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		e.lastErr = err.Error()
		e.scrapeOK = false
		return
	}
	e.load, e.hasLoad, e.scrapeOK, e.lastErr = l, true, true, ""
}

func (e *endpoint) snapshotLoad() (gateway.Load, bool, bool, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.load, e.hasLoad, e.scrapeOK, e.lastErr
}

// newEndpoint returns the endpoint of a normalised engine address.
func newEndpoint(base string) *endpoint {
	ep := &endpoint{base: base}
	u, err := url.Parse(base)
	if err == nil && u.Scheme == "http" && u.Host != "" && !strings.HasSuffix(u.Host, ":") && u.Path == "" &&
		u.RawQuery == "" && u.Fragment == "" && u.User == nil && u.Opaque == "" && !u.ForceQuery {
		ep.hostOnly = u
	}
	return ep
}

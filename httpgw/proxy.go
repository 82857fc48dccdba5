package httpgw

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/examlops/gateway"
)

// Response headers the gateway adds to proxied responses.
const (
	// HeaderReplica names the replica that served the request.
	HeaderReplica = "X-Exa-Replica"
	// HeaderDecision gives the routing decision's kind and prefix match,
	// e.g. "affinity; matched=12/14".
	HeaderDecision = "X-Exa-Decision"
)

// Outcome codes of exa_gateway_requests_total besides HTTP statuses.
const (
	codeClientCanceled = "client_canceled"
	codeStreamError    = "stream_error"
	codeAborted        = "aborted"
)

// outcome is what one request came to, for the request counter.
type outcome struct {
	model string
	kind  endpointKind
	mm    *modelMetrics // the model's cached series, once known
	code  string
}

// errFirstByteTimeout marks an engine that sent no response byte within
// Options.FirstByteTimeout. Like the other causes of an upstream failure it
// is wrapped in a message that starts with ErrUpstream's "gateway:".
var errFirstByteTimeout = errors.New("no response byte within the first-byte timeout")

// errUpstreamStatus marks a 5xx answer from an engine; like
// errFirstByteTimeout it is a cause inside an ErrUpstream message.
var errUpstreamStatus = errors.New("engine answered with a server error")

// fail answers the client with an error response and records its status
// as the request's outcome.
func (oc *outcome) fail(w http.ResponseWriter, status int, typ, code, param, msg string) {
	oc.code = strconv.Itoa(status)
	writeError(w, status, typ, code, param, msg)
}

// serveInference handles /v1/chat/completions and /v1/completions.
func (s *Server) serveInference(w http.ResponseWriter, r *http.Request, kind endpointKind) {
	start := s.opts.Clock()
	s.metrics.inFlight.Inc()
	oc := outcome{kind: kind}
	defer func() {
		s.metrics.inFlight.Dec()
		// Before the model is known oc.mm is nil and requestsC looks the
		// series up; only requests for a known model are timed.
		oc.mm.requestsC(s.metrics, oc.model, oc.kind, oc.code).Inc()
		if oc.model != "" {
			oc.mm.durationO(s.metrics, oc.model, oc.kind).Observe(s.opts.Clock().Sub(start).Seconds())
		}
	}()
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		oc.fail(w, http.StatusMethodNotAllowed, typeInvalidRequest, "method_not_allowed", "", "gateway: "+r.URL.Path+" accepts POST only, not "+r.Method)
		return
	}
	body, err := readBody(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes), r.ContentLength, s.opts.MaxBodyBytes)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			oc.fail(w, http.StatusRequestEntityTooLarge, typeInvalidRequest, "request_too_large", "",
				fmt.Sprintf("%v: the body exceeds %d bytes", ErrBodyTooLarge, mbe.Limit))
			return
		}
		oc.fail(w, http.StatusBadRequest, typeInvalidRequest, "invalid_body", "", fmt.Sprintf("%v: reading the body: %v", ErrBadRequest, err))
		return
	}
	req, err := parseRequest(kind, body)
	if err != nil {
		var re *requestError
		param := ""
		if errors.As(err, &re) {
			param = re.field
		}
		oc.fail(w, http.StatusBadRequest, typeInvalidRequest, "invalid_request", param, err.Error())
		return
	}
	st := s.state.Load()
	ms, ok := st.models[req.Model]
	if !ok {
		oc.fail(w, http.StatusNotFound, typeNotFound, "model_not_found", "model",
			fmt.Sprintf("%v: %q is not served by this gateway (GET /v1/models lists the models)", ErrModelNotFound, req.Model))
		return
	}
	oc.model, oc.mm = ms.name, ms.mm
	if ms.noReps && len(ms.missing) > 0 {
		oc.fail(w, http.StatusServiceUnavailable, typeUnavailable, "no_replicas", "model",
			fmt.Sprintf("%v: model %q is disaggregated but its pools %q are not defined", ErrNoReplicas, ms.name, ms.missing))
		return
	}
	if ms.noReps {
		oc.fail(w, http.StatusServiceUnavailable, typeUnavailable, "no_replicas", "model",
			fmt.Sprintf("%v: model %q has no replicas configured", ErrNoReplicas, ms.name))
		return
	}
	kp := s.keyPool.Get().(*gateway.Key)
	key := appendKey(s.hasher, (*kp)[:0], req, r.Header)
	defer func() { *kp = key[:0]; s.keyPool.Put(kp) }()

	s.proxy(w, r, ms, key, body, start, &oc)
}

// proxy routes and forwards one parsed request, retrying once on another
// replica when the first fails before sending any response byte.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, ms *modelState, key gateway.Key, body []byte, start time.Time, oc *outcome) {
	var lastErr error
	var failed string
	for try := 0; try < 2; try++ {
		// A retry leaves out the replica that just failed, which the
		// health checks may not have ejected yet.
		d, err := ms.gw.RouteExcept(key, failed)
		if err != nil {
			switch {
			case !errors.Is(err, gateway.ErrNoHealthyReplica):
				oc.fail(w, http.StatusInternalServerError, typeServer, "routing_error", "", err.Error())
			case try > 0:
				oc.fail(w, http.StatusBadGateway, typeServer, "upstream_error", "",
					fmt.Sprintf("%v: model %q: %v; no other healthy replica to retry on", ErrUpstream, ms.name, lastErr))
			default:
				oc.fail(w, http.StatusServiceUnavailable, typeUnavailable, "no_healthy_replica", "",
					fmt.Sprintf("gateway: no healthy replica for model %q", ms.name))
			}
			return
		}
		name := d.Replica
		if try > 0 {
			s.metrics.retries.WithLabelValues(ms.name).Inc()
		}
		s.countDecision(ms, &d)
		ms.mm.replicaReqsC(s.metrics, ms.name, name).Inc()
		ep := s.endpointOf(ms, &d)
		if ep == nil {
			// The shared gateway chose a replica that a reload added or
			// moved after this request took its snapshot, and no snapshot
			// knows the engine: release the decision and try another.
			err := fmt.Errorf("replica %q (%s) is no longer configured", name, d.Address)
			d.Done(gateway.DoneInfo{Err: err})
			if try == 0 {
				lastErr, failed = err, name
				continue
			}
			oc.fail(w, http.StatusBadGateway, typeServer, "upstream_error", "", fmt.Sprintf("%v: %v", ErrUpstream, err))
			return
		}
		retry, err := s.forward(w, r, ms, name, ep, &d, body, start, try == 0, oc)
		if !retry {
			return
		}
		lastErr, failed = err, name
	}
	// Not reached: the second try is made with canRetry false, so it
	// always answers. Kept so that a change there cannot leave the client
	// with an empty 200.
	oc.fail(w, http.StatusBadGateway, typeServer, "upstream_error", "",
		fmt.Sprintf("%v: model %q: %v (after one retry)", ErrUpstream, ms.name, lastErr))
}

// endpointOf returns the engine a decision is to be sent to. A model's
// gateway is shared by every snapshot that keeps it, so the decision may
// name a replica that the request's own snapshot (ms) does not have, or
// that a reload moved to another address. The decision's Address is the
// engine's base URL as the gateway holds it now: it is looked up in the
// current snapshot first, then in the request's. nil means neither has it.
func (s *Server) endpointOf(ms *modelState, d *gateway.Decision) *endpoint {
	if ep := s.state.Load().endpoints[d.Address]; ep != nil {
		return ep
	}
	if ep := ms.byName[d.Replica]; ep != nil && ep.base == d.Address {
		return ep
	}
	return nil
}

func (s *Server) countDecision(ms *modelState, d *gateway.Decision) {
	m, mm := s.metrics, ms.mm
	mm.routedC(m, ms.name).Inc()
	mm.decisionsC(m, ms.name, d.Kind).Inc()
	if d.Hit {
		mm.hitsC(m, ms.name).Inc()
	}
	mm.blocksC(m, ms.name).Add(float64(d.Blocks))
	mm.matchedC(m, ms.name).Add(float64(d.Matched))
}

// forward sends the request to one replica and relays the answer. It
// returns retry=true, with the cause, when the replica failed before any
// byte was sent to the client and canRetry allowed it; otherwise it has
// answered the client (or the client is gone) and set oc.code. Either way
// it has called d.Done; d must not be nil.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, ms *modelState, name string, ep *endpoint,
	d *gateway.Decision, body []byte, start time.Time, canRetry bool, oc *outcome) (retry bool, cause error) {
	done := func(lat time.Duration, err error) {
		d.Done(gateway.DoneInfo{Latency: lat, Err: err})
	}
	// The upstream request runs on its own context so that the first-byte
	// timer can cancel it without the client having gone.
	ctx := r.Context()
	upCtx, cancelUp := context.WithCancel(ctx)
	defer cancelUp()
	var timedOut atomic.Bool
	stopTimer := func() bool { return false }
	if s.opts.FirstByteTimeout > 0 {
		stopTimer = s.afterFunc(s.opts.FirstByteTimeout, func() {
			timedOut.Store(true)
			cancelUp()
		})
	}
	defer stopTimer()
	// upstreamErr says what made the upstream fail: the first-byte timer
	// (a failure of the engine) or else err.
	upstreamErr := func(err error) error {
		if timedOut.Load() {
			return fmt.Errorf("%w (%v)", errFirstByteTimeout, s.opts.FirstByteTimeout)
		}
		return err
	}
	out, err := upstreamRequest(upCtx, ep, r.URL, body)
	if err != nil {
		done(0, err)
		oc.fail(w, http.StatusBadGateway, typeServer, "bad_upstream_address", "", fmt.Sprintf("%v: replica %q: %v", ErrUpstream, name, err))
		return false, nil
	}
	copyHeaders(out.Header, r.Header)
	// The gateway has read the whole body: the engine must not be asked
	// to confirm it first (a 100 Continue would be relayed as the answer).
	out.Header.Del("Expect")
	resp, err := s.opts.Transport.RoundTrip(out)
	if err != nil {
		if ctx.Err() != nil {
			done(0, ctx.Err())
			oc.code = codeClientCanceled
			return false, nil
		}
		s.observe(ep, ep.health.failure(isDialError(err)))
		err = fmt.Errorf("replica %q (%s): %w", name, ep.base, upstreamErr(err))
		done(0, err)
		if canRetry {
			return true, err
		}
		oc.fail(w, http.StatusBadGateway, typeServer, "upstream_error", "", fmt.Sprintf("%v: %v", ErrUpstream, err))
		return false, nil
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 500 {
		s.observe(ep, ep.health.failure(false))
		if canRetry {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			err := fmt.Errorf("replica %q (%s): %w: status %d", name, ep.base, errUpstreamStatus, resp.StatusCode)
			done(0, err)
			return true, err
		}
	} else {
		s.observe(ep, ep.health.success(false))
	}

	h := w.Header()
	copyHeaders(h, resp.Header)
	h.Set(HeaderReplica, name)
	h.Set(HeaderDecision, d.Kind.String()+"; matched="+strconv.Itoa(d.Matched)+"/"+strconv.Itoa(d.Blocks))
	w.WriteHeader(resp.StatusCode)
	status := strconv.Itoa(resp.StatusCode)
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	rc := http.NewResponseController(w)
	if sse {
		_ = rc.Flush()
	}

	bp := s.bufPool.Get().(*[]byte)
	defer s.bufPool.Put(bp)
	buf := *bp
	var ttfb time.Duration
	first := true
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 || rerr == io.EOF {
			stopTimer()
		}
		// A complete answer whose length the engine gave goes to the
		// client as soon as it is here, before the bookkeeping (routing
		// feedback, metrics, timers, here and in the deferred calls),
		// rather than when the handler returns; net/http frames it with
		// the copied Content-Length, as it would have. Streams are sent
		// event by event.
		complete := rerr == io.EOF && !sse && resp.ContentLength >= 0
		if n > 0 {
			firstChunk := first
			if first {
				first = false
				ttfb = s.opts.Clock().Sub(start)
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				// The client is gone; returning cancels the upstream request.
				done(0, werr)
				oc.code = codeClientCanceled
				return false, nil
			}
			if sse || complete {
				_ = rc.Flush()
			}
			if firstChunk {
				d.FirstToken()
				ms.mm.ttfbO(s.metrics, ms.name, oc.kind).Observe(ttfb.Seconds())
			}
		}
		if rerr == io.EOF {
			if complete && n == 0 {
				_ = rc.Flush() // the end came on a read of its own
			}
			if resp.StatusCode >= 500 {
				done(0, fmt.Errorf("%w: status %d", errUpstreamStatus, resp.StatusCode))
			} else {
				done(ttfb, nil)
			}
			oc.code = status
			return false, nil
		}
		if rerr != nil {
			if ctx.Err() != nil {
				done(0, ctx.Err())
				oc.code = codeClientCanceled
				return false, nil
			}
			s.observe(ep, ep.health.failure(false))
			err := fmt.Errorf("%w: replica %q (%s) failed mid-response: %w", ErrUpstream, name, ep.base, upstreamErr(rerr))
			done(0, err)
			if sse {
				_, _ = w.Write(streamErrorEvent(err.Error()))
				_ = rc.Flush()
				oc.code = codeStreamError
				return false, nil
			}
			// A plain JSON body cannot carry an error once begun: cut the
			// connection so the client sees a failure, not a short body.
			// http.ErrAbortHandler is net/http's documented way to abort a
			// response; the server recovers it silently, so this is the
			// exception to the no-panic rule, not a crash.
			oc.code = codeAborted
			panic(http.ErrAbortHandler)
		}
	}
}

// readBody reads r to its end, like io.ReadAll, into a buffer sized for
// the declared length (when it is known and within limit), so that a long
// prompt is not copied through a series of growing buffers.
func readBody(r io.Reader, size, limit int64) ([]byte, error) {
	if size <= 0 || size > limit {
		return io.ReadAll(r)
	}
	// One byte more than declared: reading to the end then needs no
	// growth even if the reader reports io.EOF on a call of its own.
	b := make([]byte, 0, size+1)
	for {
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
	}
}

// upstreamRequest returns the request that forwards an inference request
// (path and query u, the body already read) to the engine ep, with no
// headers yet. Its body is an in-memory reader that GetBody can recreate
// for a resend, so that net/http writes the head and the body together
// (one TCP segment for a small request) rather than flushing the head
// first. For the usual engine address (scheme and host only) and a path
// without a query it is built without parsing a URL.
func upstreamRequest(ctx context.Context, ep *endpoint, u *url.URL, body []byte) (*http.Request, error) {
	newBody := func() io.ReadCloser { return io.NopCloser(bytes.NewReader(body)) }
	if ep.hostOnly != nil && u.RawQuery == "" && u.Path != "" {
		out := &http.Request{
			Method:        http.MethodPost,
			URL:           &url.URL{Scheme: ep.hostOnly.Scheme, Host: ep.hostOnly.Host, Path: u.Path, RawPath: u.RawPath},
			Proto:         "HTTP/1.1",
			ProtoMajor:    1,
			ProtoMinor:    1,
			Header:        make(http.Header, 8),
			Body:          newBody(),
			GetBody:       func() (io.ReadCloser, error) { return newBody(), nil },
			ContentLength: int64(len(body)),
			Host:          ep.hostOnly.Host,
		}
		return out.WithContext(ctx), nil
	}
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.base+u.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	out.ContentLength = int64(len(body))
	out.GetBody = func() (io.ReadCloser, error) { return newBody(), nil }
	return out, nil
}

// isHopHeader reports whether the header key k, in any case, is a
// connection-level header a proxy must not forward.
func isHopHeader(k string) bool {
	// CanonicalHeaderKey returns an already canonical key (as parsed
	// headers have) as it is, without allocating.
	switch http.CanonicalHeaderKey(k) {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
		"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// copyHeaders copies end-to-end headers from src to dst. The copied values
// share one new backing array.
func copyHeaders(dst, src http.Header) {
	var conn []string
	if c := src.Get("Connection"); c != "" {
		conn = strings.Split(c, ",")
	}
	n := 0
	for _, vv := range src {
		n += len(vv)
	}
	vals := make([]string, 0, n)
next:
	for k, vv := range src {
		if isHopHeader(k) {
			continue
		}
		for _, c := range conn {
			if strings.EqualFold(k, strings.TrimSpace(c)) {
				continue next
			}
		}
		i := len(vals)
		vals = append(vals, vv...)
		dst[k] = vals[i:len(vals):len(vals)]
	}
}

// isDialError reports whether err is a failure to connect (the engine is
// not listening), which ejects the engine at once.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

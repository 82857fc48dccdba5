package httpgw

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/keys"
)

// attempt is one try of a call on one replica: the decision that chose it
// and the state of the exchange with its engine. (It is part of the call,
// not a struct of its own pointing to it, so that neither has to leave
// the stack.)
type attempt struct {
	d        gateway.Decision
	ep       *fleet.Endpoint
	canRetry bool // whether a failure before any byte sent may be retried

	timeout  time.Duration // the first-byte timeout that applies
	timedOut *atomic.Bool  // set when it fired; nil without a timer
	stop     func() bool   // stops the first-byte timer
	ttfb     time.Duration // from the call's arrival to the first byte
	// routed is when the decision was taken up (the try began), firstAt
	// when the answer's first token came, zero while not seen (a whole
	// answer's first byte is its end).
	routed, firstAt time.Time

	// A non-streamed answer's whole time on this replica, from sending
	// the request to the answer's last byte (relayed) or its assembly
	// (upstream streamed), is bounded by Options.ResponseTimeout.
	wholeTimeout  time.Duration
	wholeTimedOut *atomic.Bool // set when it fired; nil without a timer
	stopWhole     func() bool  // stops the response timer
}

// forward sends the call to the attempt's replica and relays the answer.
// It returns retry=true, with the cause, when the replica failed before any
// byte was sent to the client and canRetry allowed it; otherwise it has
// answered the client (or the client is gone) and set the call's outcome
// code. Either way it has called d.Done.
func (s *Server) forward(c *call) (retry bool, cause error) {
	a := &c.attempt
	// The upstream request runs on its own context so that the first-byte
	// timer can cancel it without the client having gone.
	ctx, cancel := context.WithCancel(c.r.Context())
	defer cancel()
	a.stop, a.stopWhole = noTimer, noTimer
	if a.timeout = s.firstByteTimeout(c.req.Stream || c.aggregate); a.timeout > 0 {
		a.timedOut, a.stop = s.startTimer(a.timeout, cancel)
	}
	if a.wholeTimeout = max(s.opts.ResponseTimeout, 0); !c.req.Stream && a.wholeTimeout > 0 {
		a.wholeTimedOut, a.stopWhole = s.startTimer(a.wholeTimeout, cancel)
	}
	defer a.stop()
	defer a.stopWhole()
	// A whole answer shows no first token: the replica's pending prefill
	// is released when the library predicts it over, rather than at the
	// answer's end.
	if stop := front.ReleaseAtPrediction(a.d, c.req.Stream || c.aggregate, s.afterFunc); stop != nil {
		defer stop()
	}
	resp, retry, cause := s.send(ctx, c)
	if resp == nil {
		return retry, cause
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 500 {
		s.Observe(a.ep, a.ep.Health.Failure(false))
		if a.canRetry {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			err := fmt.Errorf("%s: %w: status %d", a.replica(), errUpstreamStatus, resp.StatusCode)
			a.done(0, err)
			return true, err
		}
	} else {
		s.Observe(a.ep, a.ep.Health.Success(false))
	}
	if c.sidecarPrefill != nil {
		// pd-sidecar answers with the decode request's answer, sent once
		// the prefill's came: the prefill replica's pending prefill is
		// released now, the decision when the request ends. Not on an
		// answer retried on another decode replica, whose sidecar runs
		// the prefill again.
		c.sidecarPrefill.FirstToken()
	}
	if c.aggregate && resp.StatusCode/100 == 2 && isEventStream(resp) {
		return s.relayAggregated(c, resp)
	}
	return s.relay(c, resp)
}

// firstByteTimeout is the first-byte timeout: FirstByteTimeout for a
// streamed answer (from the engine), whose first byte is its first token;
// 0 (none) for a whole one, which the response timer bounds as a whole.
func (s *Server) firstByteTimeout(streamed bool) time.Duration {
	if !streamed {
		return 0
	}
	return max(s.opts.FirstByteTimeout, 0)
}

// noTimer is the stop function of a timer not started.
func noTimer() bool { return false }

// startTimer starts a timer of d that sets the flag it returns and calls
// cancel. Its function shares only the flag with the attempt, so that the
// attempt can stay on the stack.
func (s *Server) startTimer(d time.Duration, cancel func()) (*atomic.Bool, func() bool) {
	fired := new(atomic.Bool)
	return fired, s.afterFunc(d, func() {
		fired.Store(true)
		cancel()
	})
}

// retryTimedOut reports whether a failure err of the attempt, read after
// the engine's head but before anything was sent to the client, is to be
// retried on another replica: when the first-byte or the response timer
// ran out (the engine failed, as one that sent no head within it) and
// canRetry allows it. It then reports the engine's failure and the
// attempt's end, as forward's caller expects of a retry.
func (s *Server) retryTimedOut(c *call, err error) bool {
	a := &c.attempt
	fired := (a.timedOut != nil && a.timedOut.Load()) || (a.wholeTimedOut != nil && a.wholeTimedOut.Load())
	if !a.canRetry || !fired || c.r.Context().Err() != nil {
		return false
	}
	s.Observe(a.ep, a.ep.Health.Failure(false))
	a.done(0, err)
	return true
}

// replica names the attempt's replica in errors.
func (a *attempt) replica() string {
	return fmt.Sprintf("replica %q (%s)", a.d.Replica, a.ep.Base)
}

// done reports the attempt's end to the routing decision.
func (a *attempt) done(lat time.Duration, err error) {
	a.d.Done(gateway.DoneInfo{Latency: lat, Err: err})
}

// finish reports the end of a relayed answer of the given status to the
// attempt's decision. A 2xx answer's measures teach the library the
// replica's speed (gateway.DoneInfo): TTFT from the try's start to its
// first token, when it was seen (a stream, or a non-streamed request
// streamed from the engine); Elapsed from the try's start to the end;
// OutputTokens as the meter counted them (the usage, else the stream's
// content chunks). A request with an objective is counted in
// exa_gateway_slo_requests_total as its client saw it: from its arrival
// at the gateway (flow control's queue and a P/D prefill included).
// The latency sample is the client's time to the first byte, less the
// time earlier tries took on other replicas (a retry's replica is not
// charged with a hung engine's timeout).
func (s *Server) finish(c *call, status int) {
	a := &c.attempt
	info := gateway.DoneInfo{}
	if a.ttfb > 0 {
		info.Latency = max(a.ttfb-c.retried, 1)
	}
	ok := status/100 == 2
	var now time.Time
	if ok {
		now = s.opts.Clock()
		info.Elapsed = max(now.Sub(a.routed), 1)
		if !a.firstAt.IsZero() {
			info.TTFT = max(a.firstAt.Sub(a.routed), 1)
		}
		info.OutputTokens, _ = c.meter.Tokens()
	}
	a.d.Done(info)
	if ok && c.slo.Set() {
		s.metrics.CountSeen(c.ms.Name, c.slo, a.firstAt.Sub(c.start), !a.firstAt.IsZero(), now.Sub(c.start), info.OutputTokens)
	}
}

// cause says what made the upstream fail: the response timer (for a
// non-streamed request), the first-byte timer (both failures of the
// engine) or else err.
func (c *call) cause(err error) error {
	a := &c.attempt
	if a.wholeTimedOut != nil && a.wholeTimedOut.Load() {
		return fmt.Errorf("%w (%v)", errResponseTimeout, a.wholeTimeout)
	}
	if a.timedOut != nil && a.timedOut.Load() {
		return fmt.Errorf("%w (%v)", errFirstByteTimeout, a.timeout)
	}
	return err
}

// failStatus is the status and error code of an upstream failure before
// any byte went to the client: 504 upstream_timeout when the response
// timeout ran out, else 502 upstream_error.
func failStatus(err error) (int, string) {
	if errors.Is(err, errResponseTimeout) {
		return http.StatusGatewayTimeout, "upstream_timeout"
	}
	return http.StatusBadGateway, "upstream_error"
}

// send sends the call's request to the engine and returns its answer,
// whose status is final (not 1xx). When there is none it has handled the
// failure (see forward) and returns nil.
func (s *Server) send(ctx context.Context, c *call) (resp *http.Response, retry bool, cause error) {
	a := &c.attempt
	out, err := upstreamRequest(ctx, a.ep, c.r.URL, c.body)
	if err != nil {
		a.done(0, err)
		c.oc.fail(c.w, http.StatusBadGateway, front.TypeServer, "bad_upstream_address", "",
			fmt.Sprintf("%v: replica %q: %v", ErrUpstream, a.d.Replica, err))
		return nil, false, nil
	}
	copyHeaders(out.Header, c.r.Header)
	// The gateway has read the whole body: the engine must not be asked
	// to confirm it first.
	out.Header.Del("Expect")
	// The gateway reads the answer (its first token, its usage, a
	// non-streaming client's assembly): it must come as it is.
	out.Header.Del("Accept-Encoding")
	if c.upHeader != nil {
		c.upHeader(out.Header)
	}
	resp, err = s.opts.Transport.RoundTrip(out)
	if err == nil && resp.StatusCode < 200 {
		// Interim answers are the transport's to skip; a final 1xx (a 101:
		// the gateway never asks to switch protocols) is not an answer.
		resp.Body.Close()
		err = fmt.Errorf("%w: status %d", errUpstreamInterim, resp.StatusCode)
	}
	if err == nil {
		return resp, false, nil
	}
	if c.clientGone() {
		return nil, false, nil
	}
	s.Observe(a.ep, a.ep.Health.Failure(isDialError(err)))
	err = fmt.Errorf("%s: %w", a.replica(), c.cause(err))
	a.done(0, err)
	if a.canRetry {
		return nil, true, err
	}
	status, code := failStatus(err)
	c.oc.fail(c.w, status, front.TypeServer, code, "", fmt.Sprintf("%v: %v", ErrUpstream, err))
	return nil, false, nil
}

// relay sends the engine's answer to the client as it arrives, then
// reports the attempt's end. Like forward it returns retry=true, with the
// cause, for a whole answer whose timer ran out before its first byte
// (retryTimedOut).
func (s *Server) relay(c *call, resp *http.Response) (retry bool, cause error) {
	a := &c.attempt
	sse := isEventStream(resp)
	rc := http.NewResponseController(c.w)
	// A stream's head goes at once; a whole answer's waits for its first
	// byte (or its end), so that an engine cutting it before any byte
	// still leaves room for a 502.
	began := sse
	if sse {
		s.beginAnswer(c, resp)
		_ = rc.Flush()
	}
	bp := s.bufPool.Get().(*[]byte)
	defer s.bufPool.Put(bp)
	buf := *bp
	first := true
	c.meter.Reset(sse)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 || rerr == io.EOF {
			a.stop()
		}
		// A complete answer whose length the engine gave goes to the
		// client as soon as it is here, before the bookkeeping (routing
		// feedback, metrics, timers, here and in the deferred calls),
		// rather than when the handler returns; net/http frames it with
		// the copied Content-Length, as it would have. Streams are sent
		// event by event.
		complete := rerr == io.EOF && !sse && resp.ContentLength >= 0
		if !began && (n > 0 || rerr == io.EOF) {
			began = true
			s.beginAnswer(c, resp)
		}
		if n > 0 {
			if first {
				now := s.opts.Clock()
				a.ttfb = now.Sub(c.start)
				// A stream's first bytes come with its first token, but for
				// a Responses API stream, which opens with events sent
				// before it (response.created): that one's stays unseen.
				if sse && c.oc.kind != keys.Responses {
					a.firstAt = now
				}
			}
			c.meter.Feed(buf[:n])
			if c.oc.kind == keys.Responses && !c.learned && resp.StatusCode == http.StatusOK {
				c.learned = s.learnResponse(c, buf[:n])
			}
			if _, werr := c.w.Write(buf[:n]); werr != nil {
				// The client is gone; returning cancels the upstream request.
				a.done(0, werr)
				c.oc.code = front.CodeClientCanceled
				return false, nil
			}
			if sse || complete {
				_ = rc.Flush()
			}
			if first {
				first = false
				a.d.FirstToken()
				s.flow.FirstToken(c.ms.Name, s.opts.Admission) // a held request may have room
				front.Of(c.ms).TTFBO(s.metrics, c.ms.Name, c.oc.kind).Observe(a.ttfb.Seconds())
			}
		}
		switch {
		case rerr == io.EOF:
			if complete && n == 0 {
				_ = rc.Flush() // the end came on a read of its own
			}
			if resp.StatusCode >= 500 {
				a.done(0, fmt.Errorf("%w: status %d", errUpstreamStatus, resp.StatusCode))
			} else {
				s.finish(c, resp.StatusCode)
			}
			c.oc.code = strconv.Itoa(resp.StatusCode)
			return false, nil
		case rerr != nil && !began:
			if cause = fmt.Errorf("%s: %w", a.replica(), c.cause(rerr)); s.retryTimedOut(c, cause) {
				return true, cause
			}
			s.failBeforeAnswer(c, rerr)
			return false, nil
		case rerr != nil:
			s.failMidAnswer(c, rerr, sse, rc)
			return false, nil
		}
	}
}

// beginAnswer writes the head of the engine's answer to the client.
func (s *Server) beginAnswer(c *call, resp *http.Response) {
	h := c.w.Header()
	s.copyAnswerHeaders(h, resp.Header)
	h.Set(HeaderReplica, c.attempt.d.Replica)
	h.Set(HeaderDecision, front.DescribeDecision(c.ms, c.fallback, &c.attempt.d))
	c.w.WriteHeader(resp.StatusCode)
}

// failBeforeAnswer ends a whole (not streamed) answer that the engine cut
// before its first byte: nothing has gone to the client, which gets a 502
// with an OpenAI error object.
func (s *Server) failBeforeAnswer(c *call, rerr error) {
	a := &c.attempt
	if c.clientGone() {
		return
	}
	s.Observe(a.ep, a.ep.Health.Failure(false))
	err := fmt.Errorf("%s cut its answer before its first byte: %w", a.replica(), c.cause(rerr))
	a.done(0, err)
	status, code := failStatus(err)
	c.oc.fail(c.w, status, front.TypeServer, code, "", fmt.Sprintf("%v: %v", ErrUpstream, err))
}

// failMidAnswer ends an answer whose engine failed after its first bytes
// were relayed: a stream gets a final error event, a plain answer's
// connection is cut.
func (s *Server) failMidAnswer(c *call, rerr error, sse bool, rc *http.ResponseController) {
	a := &c.attempt
	if c.clientGone() {
		return
	}
	s.Observe(a.ep, a.ep.Health.Failure(false))
	err := fmt.Errorf("%w: %s failed mid-response: %w", ErrUpstream, a.replica(), c.cause(rerr))
	a.done(0, err)
	if sse {
		_, _ = c.w.Write(front.StreamErrorEvent(err.Error()))
		_ = rc.Flush()
		c.oc.code = front.CodeStreamError
		return
	}
	// A plain JSON body cannot carry an error once begun: cut the
	// connection so the client sees a failure, not a short body. What was
	// written goes first (a front server drops a response it holds
	// unsent when the handler aborts), so the client gets the status and
	// a body short of its declared length (or a chunked body without its
	// last chunk), never nothing at all.
	_ = rc.Flush()
	// http.ErrAbortHandler is net/http's documented way to abort a
	// response; the server recovers it silently, so this is the exception
	// to the no-panic rule, not a crash.
	c.oc.code = front.CodeAborted
	panic(http.ErrAbortHandler)
}

// clientGone reports whether the client went away; if so it ends the
// current attempt with that cause and counts the request as canceled.
func (c *call) clientGone() bool {
	err := c.r.Context().Err()
	if err == nil {
		return false
	}
	c.attempt.done(0, err)
	c.oc.code = front.CodeClientCanceled
	return true
}

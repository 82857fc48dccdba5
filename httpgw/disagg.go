package httpgw

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/budget"
	"github.com/examlops/gateway/internal/front"
)

// This file serves a disaggregated model: the decode replica is chosen
// first, load-aware over the decode pool; the decider then splits the
// request only when enough of its prompt is not cached there; a split
// request gets a prefill replica, cache-aware over the prefill pool. In
// gateway mode the gateway runs the two requests of vLLM's NixlConnector
// protocol itself (pdbody.go), as llm-d's pd-sidecar v0.7.1 does
// (pkg/sidecar/proxy/connector_nixlv2.go), but for one thing: a failed
// prefill is retried once on another prefill replica, chosen by the
// prefill pool's gateway with the failed one excluded, before the request
// decodes co-located, where the sidecar decodes at once; in sidecar mode it sends
// the request to the decode replica with the prefill replica in
// x-prefiller-host-port, for the sidecar in front of it to run them.

// Response headers the gateway adds to the answers of a disaggregated
// model (the picker adds the same ones, defined in internal/front).
const (
	// HeaderDisagg says what the P/D path did, then the decider's estimate
	// of the prompt tokens not cached on the decode replica: "split;
	// uncached=N", "colocated; uncached=N", or a fallback reason
	// (prefill_unavailable, prefill_failed, prefill_no_kv_params) in place
	// of split.
	HeaderDisagg = front.HeaderDisagg
	// HeaderPrefillReplica names the prefill replica of a split request
	// (in sidecar mode: the one named to the sidecar).
	HeaderPrefillReplica = front.HeaderPrefillReplica
	// HeaderPrefillDecision gives the prefill replica's routing decision
	// as HeaderDecision gives the decode replica's.
	HeaderPrefillDecision = front.HeaderPrefillDecision
)

// Request headers of the P/D protocol.
const (
	// headerPrefillerHostPort is the header llm-d's pd-sidecar reads for
	// the prefill replica (pkg/common/common.go, PrefillEndpointHeader).
	headerPrefillerHostPort = "X-Prefiller-Host-Port"
	// headerRequestID names both requests of a split request, as the
	// sidecar does.
	headerRequestID = "X-Request-Id"
)

// setPrefillHeaders names the prefill replica of a split request and its
// decision in the answer's headers.
func setPrefillHeaders(c *call, pre *gateway.Decision) {
	h := c.w.Header()
	h.Set(HeaderPrefillReplica, pre.Replica)
	h.Set(HeaderPrefillDecision, front.DescribeDecision(c.ms, c.fallback, pre))
}

// proxyPD serves an admitted request of a disaggregated model.
func (s *Server) proxyPD(c *call) {
	ms, pd, oc := c.ms, c.ms.PD, &c.oc
	t := c.target("")
	pt := front.PrefillTarget(t) // the objective's TTFT only
	plan, err := s.metrics.DecidePD(ms, c.key, c.fallback, t, pt)
	if err != nil {
		if errors.Is(err, gateway.ErrNoHealthyReplica) {
			oc.fail(c.w, http.StatusServiceUnavailable, front.TypeUnavailable, "no_healthy_replica", "",
				fmt.Sprintf("gateway: no healthy decode replica for model %q", ms.Name))
			return
		}
		oc.fail(c.w, http.StatusInternalServerError, front.TypeServer, "routing_error", "", err.Error())
		return
	}
	// The objective's rule applies to the decision that yields the first
	// token: a split plan's prefill (proxy applies it to a co-located
	// plan's decode).
	if plan.Split && s.refuse(c, &plan.Prefill) {
		plan.Decode.Done(gateway.DoneInfo{Err: front.ErrSLOUnattainable})
		return
	}
	// A client's own prefill header never reaches a sidecar.
	c.upHeader = func(h http.Header) { h.Del(headerPrefillerHostPort) }
	c.first = &plan.Decode
	note := "; uncached=" + strconv.Itoa(plan.Uncached)
	h := c.w.Header()
	if !plan.Split {
		what := "colocated"
		if plan.Reason != "cached" {
			what = plan.Reason // counted by DecidePD
		}
		h.Set(HeaderDisagg, what+note)
		s.proxy(c)
		return
	}
	pre := plan.Prefill
	if pd.Sidecar {
		hp := pd.PrefillHostPort(&pre)
		c.upHeader = func(h http.Header) { h.Set(headerPrefillerHostPort, hp) }
		h.Set(HeaderDisagg, "split"+note)
		setPrefillHeaders(c, &pre)
		// The sidecar runs the prefill; the gateway cannot see it end,
		// but the sidecar's answer comes after it: the prefill's pending
		// blocks are released then (forward), the decision when the
		// request ends.
		c.sidecarPrefill, c.handed = &pre, true
		defer pre.Done(gateway.DoneInfo{})
		s.proxy(c)
		return
	}
	proceed, handed := s.prefill(c, &plan, pt, note)
	if !proceed {
		return
	}
	decodeStart := s.opts.Clock()
	s.proxy(c)
	if handed && c.attempt.ttfb > 0 {
		first := c.start.Add(c.attempt.ttfb).Sub(decodeStart)
		s.metrics.PDPhase.WithLabelValues(ms.Name, "decode_first_byte").Observe(max(first, 0).Seconds())
		s.metrics.PDPhase.WithLabelValues(ms.Name, "decode").Observe(s.opts.Clock().Sub(decodeStart).Seconds())
	}
}

// pdFallback counts a prefill fallback and marks the answer with it; the
// request goes on co-located, with its own body, on its decode replica.
func (s *Server) pdFallback(c *call, r fleet.PDReason, note string, err error) {
	s.metrics.PDCount(c.ms, r)
	c.w.Header().Set(HeaderDisagg, r.String()+note)
	c.w.Header().Del(HeaderPrefillReplica)
	c.w.Header().Del(HeaderPrefillDecision)
	if err != nil {
		s.log.Warn("gateway: prefill fallback; decoding co-located", "model", c.ms.Name, "reason", r.String(), "err", err)
	}
}

// maxPrefillAnswer bounds a prefill answer the gateway reads: the prefill
// generates one token, but an engine may echo the prompt.
func (s *Server) maxPrefillAnswer() int64 { return 2*s.opts.MaxBodyBytes + 1<<20 }

// prefill runs the prefill request of a split request on plan's prefill
// replica. On success it sets the call's body to the decode request and
// reports proceed and handed (the KV cache is handed over). A failure
// other than a 4xx answer (a transport error, another non-2xx, no
// kv_transfer_params) is retried once on another prefill replica, the
// prefill pool's choice with the failed one left out (Target.Exclude),
// within the same first-byte timeout: the two attempts together wait no
// longer than one did before, and a timed-out attempt is not retried. A request whose
// prefill still failed falls back: the call keeps its body (co-located
// decode) and prefill reports proceed only. A 4xx answer is relayed to the
// client, as the sidecar does, and prefill reports neither; nor for a
// client that went away. Every prefill decision is released with Done, and
// when prefill does not report proceed the call's decode decision is too;
// a fallback makes plan co-located (PDDecision.Colocate), its decode
// replica prefilling the request.
func (s *Server) prefill(c *call, plan *gateway.PDDecision, t gateway.Target, note string) (proceed, handed bool) {
	ms := c.ms
	body, err := makeBody(&c.in, len(c.body)+len(prefillTail)+2, func() ([]byte, error) { return prefillBody(c.body) })
	if errors.Is(err, budget.ErrSpent) {
		err = fmt.Errorf("%w: %w", errBodiesOverBudget, err)
	}
	if err != nil { // not reached but past MaxRequestBytes: admit parsed the body as an object
		plan.Prefill.Done(gateway.DoneInfo{Err: err})
		plan.Colocate()
		s.pdFallback(c, fleet.PDPrefillFailed, note, err)
		return true, false
	}
	// One first-byte timeout bounds the whole prefill phase, its retry
	// included.
	ctx, cancel := context.WithCancel(c.r.Context())
	defer cancel()
	var timedOut atomic.Bool
	if d := s.opts.FirstByteTimeout; d > 0 {
		stop := s.afterFunc(d, func() { timedOut.Store(true); cancel() })
		defer stop()
	}
	for try := 0; ; try++ {
		pre := plan.Prefill
		res := s.prefillOnce(ctx, c, &pre, body, note, &timedOut)
		switch res.outcome {
		case prefillHanded:
			s.metrics.PDPhase.WithLabelValues(ms.Name, "prefill").Observe(res.elapsed.Seconds())
			c.body = res.decode
			id := res.id
			c.upHeader = func(h http.Header) {
				h.Del(headerPrefillerHostPort)
				h.Set(headerRequestID, id)
			}
			c.w.Header().Set(HeaderDisagg, "split"+note)
			setPrefillHeaders(c, &pre)
			c.handed = true
			return true, true
		case prefillGone:
			c.first.Done(gateway.DoneInfo{Err: res.err})
			c.oc.code = front.CodeClientCanceled
			return false, false
		case prefillRelayed:
			c.first.Done(gateway.DoneInfo{})
			return false, false
		}
		// prefillFailed: pre is released and its replica's health told.
		// An answer over the MaxAssembledBytes budget, or a decode body
		// over MaxRequestBytes, is not retried: the budget is the
		// gateway's, not the replica's.
		if try == 0 && ctx.Err() == nil && !errors.Is(res.err, errOverBudget) && !errors.Is(res.err, errBodiesOverBudget) {
			// The prefill pool's own choice, the failed replica left out
			// (as a decode retry leaves out its failed replica).
			rt := t
			rt.Exclude = pre.Replica
			next, err := ms.PD.Plan.Prefill.RouteWith(c.key, rt)
			if err == nil {
				s.metrics.Retries.WithLabelValues(ms.Name).Inc()
				s.metrics.PDCount(ms, fleet.PDPrefillRetry)
				s.metrics.ReplicaRequests(ms, next.Replica).Inc()
				s.log.Info("gateway: prefill failed; retrying on another prefill replica", "model", ms.Name,
					"failed", pre.Replica, "retry", next.Replica, "err", res.err)
				plan.Prefill = next
				continue
			}
			res.err = fmt.Errorf("%w; not retried: %w", res.err, err)
		}
		plan.Colocate()
		s.pdFallback(c, res.reason, note, res.err)
		return true, false
	}
}

// prefillOutcome is what one prefill request came to.
type prefillOutcome int

const (
	prefillHanded  prefillOutcome = iota // the KV cache is ready: decode request built
	prefillFailed                        // failed other than with a 4xx: retry or co-located
	prefillRelayed                       // a 4xx answer, relayed to the client
	prefillGone                          // the client went away
)

// prefillResult is the result of one prefill request.
type prefillResult struct {
	outcome prefillOutcome
	reason  fleet.PDReason // prefillFailed: why
	err     error          // prefillFailed, prefillGone: the cause
	decode  []byte         // prefillHanded: the decode request's body
	id      string         // prefillHanded: its x-request-id
	elapsed time.Duration  // prefillHanded: the prefill's round trip
}

// prefillOnce sends the prefill request body to pre's replica, with a
// fresh x-request-id, and releases pre. A failure counts against the
// replica's health as a forwarded request's does; a relayed 4xx answer is
// written to the client (note: the uncached estimate for HeaderDisagg).
// timedOut says ctx ended with the timeout.
func (s *Server) prefillOnce(ctx context.Context, c *call, pre *gateway.Decision, body []byte, note string, timedOut *atomic.Bool) prefillResult {
	failed := func(r fleet.PDReason, err error) prefillResult {
		pre.Done(gateway.DoneInfo{Err: err})
		return prefillResult{outcome: prefillFailed, reason: r, err: err}
	}
	ep := front.EndpointOf(s.Snapshot(), c.ms, pre)
	if ep == nil {
		return failed(fleet.PDPrefillFailed, fmt.Errorf("prefill replica %q (%s) is no longer configured", pre.Replica, pre.Address))
	}
	id := s.newRequestID()
	start := s.opts.Clock()
	// The answer, read whole, holds its share of the MaxAssembledBytes
	// budget until the decode request is built from it.
	hold := budget.Hold{B: s.assembled}
	defer hold.Release()
	answer, status, hdr, err := s.exchange(ctx, c, ep, body, id, &hold)
	elapsed := s.opts.Clock().Sub(start)
	if err != nil && timedOut.Load() {
		err = fmt.Errorf("%w (%v, for the prefill and its retry together)", errFirstByteTimeout, s.opts.FirstByteTimeout)
	}
	where := fmt.Sprintf("prefill replica %q (%s)", pre.Replica, ep.Base)
	switch {
	case err != nil && c.r.Context().Err() != nil:
		pre.Done(gateway.DoneInfo{Err: err})
		return prefillResult{outcome: prefillGone, err: err}
	case errors.Is(err, errOverBudget):
		// Not the replica's failure: its health is not told.
		return failed(fleet.PDPrefillFailed, fmt.Errorf("%s: %w", where, err))
	case err != nil:
		s.Observe(ep, ep.Health.FailedWith(err, timedOut.Load()))
		return failed(fleet.PDPrefillFailed, fmt.Errorf("%s: %w", where, err))
	case status >= 400 && status <= 451:
		// The request itself is at fault: decoding it elsewhere would
		// fail alike (pd-sidecar's shouldFallbackToDecode).
		s.Observe(ep, ep.Health.Success(false))
		pre.Done(gateway.DoneInfo{})
		h := c.w.Header()
		h.Set(HeaderDisagg, "split"+note)
		setPrefillHeaders(c, pre)
		if ct := hdr.Get("Content-Type"); ct != "" {
			h.Set("Content-Type", ct)
		}
		h.Set("Content-Length", strconv.Itoa(len(answer)))
		c.w.WriteHeader(status)
		_, _ = c.w.Write(answer)
		c.oc.code = strconv.Itoa(status)
		return prefillResult{outcome: prefillRelayed}
	case status < 200 || status > 299:
		if status >= 500 {
			s.Observe(ep, ep.Health.Failure(false))
		}
		return failed(fleet.PDPrefillFailed, fmt.Errorf("%s: %w: status %d", where, errUpstreamStatus, status))
	}
	s.Observe(ep, ep.Health.Success(false))
	kv, ok := answerKVParams(answer)
	if !ok {
		pre.Done(gateway.DoneInfo{})
		return prefillResult{outcome: prefillFailed, reason: fleet.PDPrefillNoKV, err: fmt.Errorf("%s answered without kv_transfer_params", where)}
	}
	dbody, err := makeBody(&c.in, len(c.body)+len(fieldKVTransferParams)+len(kv)+5, func() ([]byte, error) { return decodeBody(c.body, kv) })
	if errors.Is(err, budget.ErrSpent) {
		// Not the replica's failure either.
		return failed(fleet.PDPrefillFailed, fmt.Errorf("%s: %w: %w", where, errBodiesOverBudget, err))
	}
	if err != nil { // not reached, as above
		return failed(fleet.PDPrefillFailed, err)
	}
	// The prefill's answer is its one token: its round trip is the
	// replica's time to first token for the request.
	pre.Done(gateway.DoneInfo{Latency: elapsed, TTFT: max(elapsed, 1), Elapsed: max(elapsed, 1), OutputTokens: 1})
	return prefillResult{outcome: prefillHanded, decode: dbody, id: id, elapsed: elapsed}
}

// exchange sends a prefill request to ep and reads the whole answer,
// bounded by maxPrefillAnswer, its buffer held in hold (readHeld). It
// returns the answer's body, status and headers, or the error that
// prevented it.
func (s *Server) exchange(ctx context.Context, c *call, ep *fleet.Endpoint, body []byte, id string, hold *budget.Hold) ([]byte, int, http.Header, error) {
	out, err := upstreamRequest(ctx, ep, c.r.URL, body)
	if err != nil {
		return nil, 0, nil, err
	}
	copyHeaders(out.Header, c.r.Header)
	out.Header.Del("Expect")
	// The answer is parsed here, so it must come as it is.
	out.Header.Del("Accept-Encoding")
	out.Header.Del(headerPrefillerHostPort)
	out.Header.Set(headerRequestID, id)
	resp, err := s.opts.Transport.RoundTrip(out)
	if err != nil {
		return nil, 0, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 {
		return nil, 0, nil, fmt.Errorf("%w: status %d", errUpstreamInterim, resp.StatusCode)
	}
	answer, err := readHeld(resp.Body, s.maxPrefillAnswer(), hold)
	if err != nil {
		return nil, 0, nil, err
	}
	return answer, resp.StatusCode, resp.Header, nil
}

// readHeld reads r to its end, at most limit bytes (else an error), into
// a buffer whose capacity, charged assembledCharge times, hold reserves
// before it is allocated: past the budget the error wraps errOverBudget.
func readHeld(r io.Reader, limit int64, hold *budget.Hold) ([]byte, error) {
	b, err := hold.ReadAll(r, limit, assembledCharge)
	switch {
	case errors.Is(err, budget.ErrSpent):
		return nil, fmt.Errorf("%w: the answer: %v", errOverBudget, err)
	case errors.Is(err, budget.ErrTooLong):
		return nil, fmt.Errorf("prefill answer longer than %d bytes", limit)
	}
	return b, err
}

// newUUID returns a random (version 4) UUID for a split request's
// x-request-id (llm-d's sidecar sends a time-based one, uuid.NewUUID).
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	const hex = "0123456789abcdef"
	out := make([]byte, 0, 36)
	for i, x := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out = append(out, '-')
		}
		out = append(out, hex[x>>4], hex[x&15])
	}
	return string(out)
}

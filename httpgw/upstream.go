package httpgw

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/internal/sseagg"
	"github.com/examlops/gateway/keys"
)

// This file streams non-streamed requests from the engine (see
// aggregate.go for why, and for the answer's shape).

// UpstreamStreamMode says whether the gateway asks the engine to stream the
// answer of a chat or completions request whose client did not ask for a
// stream (Options.UpstreamStream).
type UpstreamStreamMode int

const (
	// UpstreamStreamDefault is the zero value: UpstreamStreamOn.
	UpstreamStreamDefault UpstreamStreamMode = iota
	// UpstreamStreamOn streams such answers from the engine and gives the
	// client the non-streamed answer assembled from the stream, so the
	// gateway learns the first token when it comes.
	UpstreamStreamOn
	// UpstreamStreamOff forwards such requests as they are: the gateway
	// learns their first token only once the answer is complete.
	UpstreamStreamOff
)

// An assembled answer's share of Options.MaxAssembledBytes is
// assembledCharge (sseagg.Charge) times the memory its Aggregator holds
// (Held): the collector's headroom at GOGC=100 (see MaxAssembledBytes). It is
// reserved in steps of sseagg.Step, the first before the request is
// sent, so that an exhausted budget refuses a request before an engine
// works on it. The answer is bounded by sseagg.ForBodies of
// Options.MaxBodyBytes (32 MiB by default).
const assembledCharge = sseagg.Charge

// upstreamStream makes the engine stream a non-streamed chat or completions
// call's answer (when Options.UpstreamStream allows and
// keys.StreamUpstream says the call's answer may be assembled): it
// rewrites the body to ask for a stream with usage (keys.StreamBody) and
// marks the call for relayAggregated. A call to be assembled first takes
// its first step of the MaxAssembledBytes budget (c.hold, which the
// caller releases), and the rewritten body is charged to MaxRequestBytes
// (c.in). When MaxRequestBytes cannot hold the rewritten body, the
// request goes as it is; when MaxAssembledBytes cannot give its step, the
// client gets 503 and upstreamStream returns false.
func (s *Server) upstreamStream(c *call) bool {
	if s.opts.UpstreamStream == UpstreamStreamOff || !keys.StreamUpstream(c.oc.kind, c.req, c.body) {
		return true
	}
	out, err := makeBody(&c.in, len(c.body)+len(keys.StreamMembers)+2, func() ([]byte, error) { return keys.StreamBody(c.body) })
	if err != nil {
		// No room in MaxRequestBytes for the rewritten body: the
		// request goes as the client sent it, as the picker's does.
		// (Any other error is not reached: admit parsed the body as one
		// object, with a model.)
		return true
	}
	c.hold.B = s.assembled
	if !c.hold.Grow(sseagg.Step) {
		s.overBudget(c, sseagg.Step)
		return false
	}
	c.body, c.aggregate = out, true
	s.metrics.UpstreamStreamed.WithLabelValues(c.ms.Name, c.oc.kind.String()).Inc()
	return true
}

// releaseAssembled returns a call's share of the MaxAssembledBytes budget
// once its answer is done with.
func (s *Server) releaseAssembled(c *call) {
	held := c.hold.Held()
	c.hold.Release()
	s.mem.ended(held / assembledCharge)
}

// errOverBudget marks an answer the MaxAssembledBytes budget cannot hold.
var errOverBudget = errors.New("the answers being assembled hold the gateway's budget for them (MaxAssembledBytes, --max-assembled-bytes)")

// overBudget answers a call whose assembled answer needs need more bytes
// than the MaxAssembledBytes budget has left with 503 and Retry-After.
func (s *Server) overBudget(c *call, need int64) {
	c.w.Header().Set("Retry-After", "1")
	b := s.assembled
	c.oc.fail(c.w, http.StatusServiceUnavailable, front.TypeUnavailable, "assembly_over_budget", "",
		fmt.Sprintf("gateway: the non-streamed answers being assembled hold %d bytes of the gateway's %d-byte budget for them (MaxAssembledBytes, --max-assembled-bytes), and this one needs %d more; retry later, or stream the answer (\"stream\": true), which is relayed as it comes", b.Used(), b.Limit(), need))
}

// relayAggregated reads the engine's stream for a call marked by
// upstreamStream, reports the first token at its first chunk, and answers
// the client with the assembled answer once the stream ends. A stream that
// is cut, carries an error event or cannot be assembled gets the client a
// 502 (nothing was sent to it yet); one whose first-byte or response timer
// ran out is retried on another replica when the call may be (it returns
// retry=true with the cause, as forward does; retryTimedOut), else gets
// the client a 502 or 504.
func (s *Server) relayAggregated(c *call, resp *http.Response) (retry bool, cause error) {
	a := &c.attempt
	g := sseagg.ForBodies(c.oc.kind == keys.Chat, s.opts.MaxBodyBytes)
	bp := s.bufPool.Get().(*[]byte)
	defer s.bufPool.Put(bp)
	buf := *bp
	c.meter.Reset(true)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			before := g.Chunks()
			err := g.Feed(buf[:n])
			c.meter.Feed(buf[:n])
			if before == 0 && g.Chunks() > 0 {
				a.stop()
				a.firstAt = s.opts.Clock()
				a.ttfb = a.firstAt.Sub(c.start)
				a.d.FirstToken()
				s.flow.FirstToken(c.ms.Name, s.opts.Admission) // a held request may have room
				front.Of(c.ms).TTFBO(s.metrics, c.ms.Name, c.oc.kind).Observe(a.ttfb.Seconds())
			}
			if err != nil {
				s.failAggregated(c, err, !errors.Is(err, sseagg.ErrStreamEvent))
				return false, nil
			}
			if need := assembledCharge * int64(g.Held()); need > c.hold.Held() {
				need = sseagg.RoundStep(need)
				if !c.hold.Grow(need) {
					s.answerOverBudget(c, need-c.hold.Held())
					return false, nil
				}
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			err := fmt.Errorf("%w: reading the stream: %w", sseagg.ErrAggregate, c.cause(rerr))
			if cause = fmt.Errorf("%s: %w", a.replica(), err); s.retryTimedOut(c, cause) {
				return true, cause
			}
			s.failAggregated(c, err, true)
			return false, nil
		}
	}
	parts, n, err := g.Parts()
	if err != nil {
		s.failAggregated(c, err, true)
		return false, nil
	}
	h := c.w.Header()
	s.copyAnswerHeaders(h, resp.Header)
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(n))
	h.Set(HeaderReplica, a.d.Replica)
	h.Set(HeaderDecision, front.DescribeDecision(c.ms, c.fallback, &c.attempt.d))
	c.w.WriteHeader(resp.StatusCode)
	for _, p := range parts {
		if _, werr := c.w.Write(p); werr != nil {
			a.done(0, werr)
			c.oc.code = front.CodeClientCanceled
			return false, nil
		}
	}
	s.finish(c, resp.StatusCode)
	c.oc.code = strconv.Itoa(resp.StatusCode)
	return false, nil
}

// answerOverBudget ends a call whose answer outgrew the MaxAssembledBytes
// budget while being assembled: the engine's stream is dropped (not the
// engine's fault) and the client gets 503 (nothing was sent to it yet).
func (s *Server) answerOverBudget(c *call, need int64) {
	if c.clientGone() {
		return
	}
	c.attempt.done(0, fmt.Errorf("the answer outgrew MaxAssembledBytes"))
	s.overBudget(c, need)
}

// failAggregated answers a call whose streamed-upstream answer failed with
// a 502 (or notes a client gone away); engineFault counts it against the
// engine's health (not for an error event, which the engine sent
// deliberately).
func (s *Server) failAggregated(c *call, err error, engineFault bool) {
	a := &c.attempt
	if c.clientGone() {
		return
	}
	if engineFault {
		s.Observe(a.ep, a.ep.Health.Failure(false))
	}
	err = fmt.Errorf("%s: %w", a.replica(), err)
	a.done(0, err)
	s.metrics.UpstreamStreamFailed.WithLabelValues(c.ms.Name, c.oc.kind.String()).Inc()
	status, code := failStatus(err)
	c.oc.fail(c.w, status, front.TypeServer, code, "", fmt.Sprintf("%v: %v", ErrUpstream, err))
}

// isEventStream reports whether resp is an SSE stream.
func isEventStream(resp *http.Response) bool {
	return strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
}

package httpgw

import (
	"bytes"
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

// aggregateLimitFactor times Options.MaxBodyBytes bounds an assembled
// answer (32 MiB by default); one SSE event is bounded by MaxBodyBytes.
const aggregateLimitFactor = 4

// An assembled answer's share of Options.MaxAssembledBytes is
// assembledCharge times the memory its Aggregator holds (Held): the
// collector's headroom at GOGC=100 (see MaxAssembledBytes). It is
// reserved in steps of assembledStep, the first before the request is
// sent, so that an exhausted budget refuses a request before an engine
// works on it.
const (
	assembledCharge = 2
	assembledStep   = 16 << 10
)

// streamMembers are the members a streamed-upstream request body ends
// with.
const streamMembers = `"stream":true,"stream_options":{"include_usage":true}`

// upstreamStream makes the engine stream a non-streamed chat or completions
// call's answer (when Options.UpstreamStream allows): it appends
// streamMembers to the body and marks the call for relayAggregated. A body
// that may name "stream" or "stream_options" has them removed first (a
// rewrite of its top-level members, see pdbody.go), so that no member is
// repeated: engines reading JSON with Python's json module (or Go's
// encoding/json) would take the last, but stricter readers (serde's
// derived structs) refuse repeated fields. One spelled with escapes
// ("\u0073tream") stays, and the last member counts. Bodies asking for
// beam search or best_of, which vLLM refuses to stream, are left alone, and
// so are those whose answer is one token (max_tokens or
// max_completion_tokens 1): its first token is its end, so streaming would
// tell the gateway nothing sooner and only cost the stream's overhead.
// Bodies asking for several choices (an integer "n" above 1) are left
// alone too, so that the client gets the engine's own answer to them:
// an engine's support for several choices streamed need not match its
// support for them answered whole, and the first token of a stream of
// several choices is the first of only one of them.
// A call to be assembled first takes its first step of the
// MaxAssembledBytes budget (c.hold, which the caller releases); when the
// budget cannot give it, the client gets 503 and upstreamStream returns
// false.
func (s *Server) upstreamStream(c *call) bool {
	if s.opts.UpstreamStream == UpstreamStreamOff || c.req.Stream || c.req.MaxTokens == 1 || c.req.N > 1 ||
		(c.oc.kind != keys.Chat && c.oc.kind != keys.Completions) ||
		bytes.Contains(c.body, []byte(`"use_beam_search"`)) || bytes.Contains(c.body, []byte(`"best_of"`)) {
		return true
	}
	b := bytes.TrimRight(c.body, " \t\r\n")
	if len(b) < 2 || b[len(b)-1] != '}' {
		return true // not reached: admit parsed it as one object, with a model
	}
	c.hold.B = s.assembled
	if !c.hold.Grow(assembledStep) {
		s.overBudget(c, assembledStep)
		return false
	}
	var out []byte
	if bytes.Contains(b, []byte(`"stream`)) {
		var err error
		out, err = rewrite(b, func(name string) bool { return name == fieldStreamName || name == fieldStreamOptions }, streamMembers)
		if err != nil {
			return true // not reached, as above
		}
	} else {
		out = make([]byte, 0, len(b)+len(streamMembers)+1)
		out = append(out, b[:len(b)-1]...)
		out = append(out, ',')
		out = append(out, streamMembers...)
		out = append(out, '}')
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
// 502 (nothing was sent to it yet).
func (s *Server) relayAggregated(c *call, resp *http.Response) {
	a := &c.attempt
	limit := s.opts.MaxBodyBytes
	g := sseagg.New(c.oc.kind == keys.Chat, int(min(limit*aggregateLimitFactor, 1<<40)), int(min(limit, 1<<40)))
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
				front.Of(c.ms).TTFBO(s.metrics, c.ms.Name, c.oc.kind).Observe(a.ttfb.Seconds())
			}
			if err != nil {
				s.failAggregated(c, err, !errors.Is(err, sseagg.ErrStreamEvent))
				return
			}
			if need := assembledCharge * int64(g.Held()); need > c.hold.Held() {
				need = (need + assembledStep - 1) / assembledStep * assembledStep
				if !c.hold.Grow(need) {
					s.answerOverBudget(c, need-c.hold.Held())
					return
				}
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			s.failAggregated(c, fmt.Errorf("%w: reading the stream: %w", sseagg.ErrAggregate, c.cause(rerr)), true)
			return
		}
	}
	parts, n, err := g.Parts()
	if err != nil {
		s.failAggregated(c, err, true)
		return
	}
	h := c.w.Header()
	copyHeaders(h, resp.Header)
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(n))
	h.Set(HeaderReplica, a.d.Replica)
	h.Set(HeaderDecision, front.DescribeDecision(c.ms, c.fallback, &c.attempt.d))
	c.w.WriteHeader(resp.StatusCode)
	for _, p := range parts {
		if _, werr := c.w.Write(p); werr != nil {
			a.done(0, werr)
			c.oc.code = front.CodeClientCanceled
			return
		}
	}
	s.finish(c, resp.StatusCode)
	c.oc.code = strconv.Itoa(resp.StatusCode)
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

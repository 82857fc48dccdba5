package picker

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/examlops/gateway/internal/sseagg"
	"github.com/examlops/gateway/keys"
)

// This file streams non-streamed answers from the engine, as the HTTP
// gateway does (httpgw/upstream.go). A non-streamed answer reaches the
// picker whole, when it is complete, so the picker would learn the
// request's first token (Tracker.FirstToken, which releases its pending
// prefill) only when the whole answer is generated. For a request whose
// Pick says its answer may be assembled (Pick.Assemble), the picker asks
// the engine to stream instead, by rewriting the request body it streams
// back to Envoy, reads the first token in the stream's first chunk, and
// gives the client the non-streamed JSON answer it asked for, assembled
// from the stream (internal/sseagg, the gateway's aggregator).
//
// It needs Envoy's response body mode FULL_DUPLEX_STREAMED, the only one
// in which the picker replaces the response body: in any other the request
// is forwarded as it is.

// Assembly says whether, and as what, the server may stream a request's
// answer from the engine and assemble it for the client (Pick.Assemble).
// The zero value, AssembleNone, forwards the request as it is.
type Assembly uint8

const (
	// AssembleNone forwards the request as it is.
	AssembleNone Assembly = iota
	// AssembleChat assembles a chat completion ("chat.completion" from
	// "chat.completion.chunk" events).
	AssembleChat
	// AssembleCompletions assembles a completion ("text_completion").
	AssembleCompletions
)

// An assembled answer is bounded as in the HTTP gateway, by
// sseagg.ForBodies of Options.MaxBodyBytes (32 MiB by default). It
// reserves Options.MaxBufferedBytes for sseagg.Charge times the memory
// its Aggregator holds (sseagg.Aggregator.Held: the collector's headroom,
// and the copies sent while it is held), in steps of sseagg.Step, the
// first before the request is sent.

// errAssemble marks an assembled answer that failed: the client gets an
// immediate response with an OpenAI-style error.
var errAssemble = errors.New("picker: the engine's stream could not be assembled into the answer")

// prepareAssembly, before the Router picks, reserves what assembling the
// request's answer would take first from Options.MaxBufferedBytes (the
// rewritten body, and the answer's first step), and tells the Router
// whether the answer would be assembled if its Pick allowed it
// (PickRequest.CanAssemble): not when Options.DisableUpstreamStream is
// set, when Envoy's response body mode is not FULL_DUPLEX_STREAMED (the
// only one in which the picker replaces the response body), when the
// request has no body, or when the budget cannot give the reservation.
func (x *exchange) prepareAssembly() {
	x.req.CanAssemble = false
	if x.s.opts.DisableUpstreamStream || !x.respEcho || len(x.body) == 0 {
		return
	}
	held := int64(len(x.body) + len(keys.StreamMembers) + 2)
	if x.s.reserved.Add(held+sseagg.Step) > x.s.opts.MaxBufferedBytes {
		x.s.reserved.Add(-(held + sseagg.Step))
		x.asmRefused = true
		return
	}
	x.bodyHeld, x.asmHeld = held, sseagg.Step
	x.req.CanAssemble = true
}

// assembleRequest, once the Router has picked, rewrites the body of a
// request whose Pick allows it (a) and that prepareAssembly could reserve
// for, to ask the engine for a stream with usage (keys.StreamBody), and
// returns the body to send. Any other request goes as it is (x.body) and
// its reservation is returned: one that the budget could not reserve for
// is forwarded as it is rather than failed, as forwarding costs only the
// first token's timing.
func (x *exchange) assembleRequest(a Assembly) []byte {
	allowed := a == AssembleChat || a == AssembleCompletions
	if !allowed || !x.req.CanAssemble {
		if allowed && x.asmRefused {
			x.s.asmSkipped.Add(1)
			x.s.ovl.Add(1)
		}
		x.releaseAssembly()
		return x.body
	}
	out, err := keys.StreamBody(x.body)
	if err != nil { // not a JSON object: a Router that did not parse the body
		x.releaseAssembly()
		return x.body
	}
	x.s.reserved.Add(int64(len(out)) - x.bodyHeld) // the body's exact length
	x.bodyHeld = int64(len(out))
	x.s.assembled.Add(x.asmHeld)
	x.asmKind = a
	x.s.asmStreamed.Add(1)
	return out
}

// releaseAssembly returns the reservations of the rewritten body and of
// the answer, once they are done with.
func (x *exchange) releaseAssembly() {
	x.releaseRewritten()
	if x.asmHeld != 0 {
		x.s.reserved.Add(-x.asmHeld)
		if x.asmKind != AssembleNone {
			x.s.assembled.Add(-x.asmHeld)
		}
		x.asmHeld = 0
	}
	x.agg = nil
}

// releaseRewritten returns the reservation of the rewritten body.
func (x *exchange) releaseRewritten() {
	if x.bodyHeld != 0 {
		x.s.reserved.Add(-x.bodyHeld)
		x.bodyHeld = 0
	}
}

// assembleHeaders decides, at the response headers, whether the answer
// of a rewritten request is assembled: a 2xx event stream with a body is;
// any other answer (an error status, a JSON answer from an engine that
// ignored "stream") goes to the client as it is, and the answer's
// reservation is returned. For an assembled answer it returns the
// headers to set on the client's response: Pick.ResponseHeaders,
// content-type application/json, and content-length removed (Envoy frames
// the assembled body itself).
func (x *exchange) assembleHeaders(eos bool) []Header {
	if x.asmKind == AssembleNone {
		return x.respHeaders
	}
	if x.status/100 != 2 || !x.sse || eos {
		x.releaseAssembly()
		x.asmKind = AssembleNone
		return x.respHeaders
	}
	x.agg = sseagg.ForBodies(x.asmKind == AssembleChat, int64(x.s.opts.MaxBodyBytes))
	h := make([]Header, 0, len(x.respHeaders)+2)
	h = append(h, x.respHeaders...)
	return append(h, Header{Name: "content-type", Value: "application/json"}, Header{Name: "content-length"})
}

// assembleBody reads one response body chunk of an assembled answer: it
// reports the first token at the stream's first chunk, answers each chunk
// with an empty one while the answer is assembled, and sends the answer at
// the end of the stream. An answer that cannot be assembled (a malformed
// or cut stream, an error event, an answer past its bound or the budget)
// ends the request with an immediate response (stop is true).
func (x *exchange) assembleBody(chunk []byte, eos bool) (stop bool, err error) {
	g := x.agg
	if len(chunk) > 0 {
		if x.head != nil {
			x.readHead(chunk)
		}
		if x.tracker != nil {
			x.meter.Feed(chunk) // the stream's usage: Outcome.OutputTokens
		}
		before := g.Chunks()
		ferr := g.Feed(chunk)
		if before == 0 && g.Chunks() > 0 {
			x.firstToken()
		}
		if ferr != nil {
			return true, x.assembleFailed(http.StatusBadGateway, "upstream_error", ferr)
		}
		if need := sseagg.Charge * int64(g.Held()); need > x.asmHeld {
			need = sseagg.RoundStep(need)
			if !x.s.reserve(need - x.asmHeld) {
				return true, x.assembleFailed(http.StatusServiceUnavailable, "assembly_over_budget",
					fmt.Errorf("%w: the answer being assembled needs %d bytes, past the picker's budget (MaxBufferedBytes, --max-buffered-bytes %d, of which the streams hold %d); stream the answer (\"stream\": true), which is relayed as it comes",
						ErrOverloaded, need, x.s.opts.MaxBufferedBytes, x.s.reserved.Load()))
			}
			x.s.assembled.Add(need - x.asmHeld)
			x.asmHeld = need
		}
	}
	if !eos {
		return false, x.st.Send(emptyBodyAnswer)
	}
	return x.assembleEnd(true)
}

// assembleEnd sends the assembled answer at the end of the engine's
// stream, end_of_stream on its last chunk when eos (else trailers end the
// body), and reports Done; an answer that cannot be assembled ends the
// request as assembleBody's.
func (x *exchange) assembleEnd(eos bool) (stop bool, err error) {
	parts, n, perr := x.agg.Parts()
	if perr != nil {
		return true, x.assembleFailed(http.StatusBadGateway, "upstream_error", perr)
	}
	x.ph = phaseDone
	x.done()
	err = sendParts(x.st, parts, n, eos)
	x.releaseAssembly()
	return false, err
}

// assembleFailed ends an assembled answer that failed with an immediate
// response carrying status and an OpenAI-style error (the HTTP gateway
// answers 502 or 503 alike), and reports Done with the error. Envoy has
// sent the client the response headers by then, so it cannot send the
// error's status: it resets the client's stream, which then ends without
// a body. The client never gets a partial or wrong answer.
func (x *exchange) assembleFailed(status int, code string, cause error) error {
	x.s.asmFailed.Add(1)
	err := fmt.Errorf("%w: %w", errAssemble, cause)
	if x.tracker != nil && !x.complete {
		x.tracker.Done(Outcome{Err: err, Status: x.status, Served: x.served})
	}
	x.complete = true
	x.ph = phaseDone
	x.releaseAssembly()
	typ := "server_error"
	if status == http.StatusServiceUnavailable {
		typ = "service_unavailable_error"
	}
	return x.immediate(&StatusError{Status: status, Type: typ, Code: code, Err: err})
}

// sendParts sends an assembled answer of n bytes, given in parts, as
// streamed_response chunks of MaxChunkBytes (the last one shorter), the
// last with end_of_stream if eos. Each chunk is a buffer of its own: a stream
// may keep what it is sent (gRPC's does not).
func sendParts(st stream, parts [][]byte, n int, eos bool) error {
	buf := make([]byte, 0, min(n, MaxChunkBytes))
	sent := 0
	for _, p := range parts {
		for len(p) > 0 {
			k := min(len(p), cap(buf)-len(buf))
			buf = append(buf, p[:k]...)
			p = p[k:]
			if len(buf) == cap(buf) {
				sent += len(buf)
				if err := st.Send(responseBodyResponse(buf, eos && sent == n)); err != nil {
					return err
				}
				buf = make([]byte, 0, min(n-sent, MaxChunkBytes))
			}
		}
	}
	if sent < n || n == 0 {
		return st.Send(responseBodyResponse(buf, eos))
	}
	return nil
}

// emptyBodyAnswer answers a response body chunk with an empty streamed
// chunk, while the answer is being assembled.
var emptyBodyAnswer = responseBodyResponse(nil, false)

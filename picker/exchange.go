package picker

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/internal/sseagg"
)

// phase is where an exchange stands in Envoy's message sequence.
type phase uint8

const (
	phaseHeaders  phase = iota // waiting for the request headers
	phaseBody                  // reading the request body
	phaseRouted                // request sent upstream; waiting for response headers
	phaseResponse              // response headers seen; relaying the response body
	phaseDone                  // response complete; only its trailers may follow
)

var phaseNames = [...]string{"before the request headers", "while reading the request body",
	"before the response headers", "while relaying the response body", "after the response ended"}

// retainBodyBytes is the largest body buffer an exchange keeps for reuse.
const retainBodyBytes = 1 << 20

// exchange is the state of one ext_proc stream: one HTTP request and its
// response. The sequence it follows is Envoy's in FULL_DUPLEX_STREAMED
// mode, as GIE v1.5.0's pkg/epp/handlers/server.go serves it: request
// headers, request body chunks up to end_of_stream (or request trailers),
// then — once the picker has answered with the headers response and the
// body — response headers, response body chunks up to end_of_stream, and
// optional response trailers.
type exchange struct {
	s  *Server
	st stream
	ph phase
	// reqPhase is the request phase's context and RequestTimeout's timer
	// (Process), the Router's Pick's context.
	reqPhase reqTimer

	start    time.Time
	req      PickRequest
	body     []byte  // the request body read so far, in *buf's array
	buf      *[]byte // from Server.bodies while the body is read, else nil
	reserved int64   // bytes of Server.buffered this exchange holds
	subset   Subset
	hintErr  error // a subset hint that allows nothing

	// Response-body handling: streamed (echoed as streamed_response) in
	// FULL_DUPLEX_STREAMED mode, acknowledged in other modes, absent in
	// NONE mode, where the response ends with its headers. respTimed:
	// the body's chunks come as the upstream sends them (STREAMED and
	// FULL_DUPLEX_STREAMED modes), so the first is the first token.
	respEcho, respNone, respTimed bool

	tracker     Tracker
	head        HeadTracker   // tracker, if it reads the response's head, until it has enough
	headLeft    int           // bytes head may still be given
	respHeaders []Header      // Pick.ResponseHeaders, set on the response
	first       bool          // FirstToken reported
	latency     time.Duration // request headers to first token
	routed      time.Time     // when the Router's Pick returned
	ttft        time.Duration // routed to the first chunk of an event stream (Outcome.TTFT)
	meter       front.Meter   // the answer's output tokens (Outcome.OutputTokens)
	status      int
	sse         bool
	served      string
	complete    bool  // Done reported
	cause       error // why the stream ended early, if known

	// Upstream streaming (upstream.go): asmKind is the assembly of a
	// request whose body was rewritten to stream, agg its answer's
	// aggregator once the response is an event stream; bodyHeld and
	// asmHeld are the bytes of MaxBufferedBytes the rewritten body and
	// the answer hold (from before the Pick).
	asmKind           Assembly
	agg               *sseagg.Aggregator
	bodyHeld, asmHeld int64
	asmRefused        bool // MaxBufferedBytes could not hold an assembly
}

func (x *exchange) reset(s *Server, st stream) {
	hdr, sub := x.req.Header[:0], x.subset[:0]
	*x = exchange{s: s, st: st, subset: sub, respEcho: true, respTimed: true}
	x.req.Header = hdr
}

// grow makes room for n more body bytes, reserving the buffer's capacity
// from the Server's MaxBufferedBytes budget first; the error wraps
// ErrOverloaded when the budget cannot hold it (nothing is then
// allocated). The caller has checked MaxBodyBytes.
func (x *exchange) grow(n int) error {
	if n == 0 {
		return nil
	}
	if x.buf == nil {
		x.buf = x.s.bodies.Get().(*[]byte)
		x.body = (*x.buf)[:0]
	}
	need, c := len(x.body)+n, cap(x.body)
	if need > c {
		c = min(max(need, 2*c, 4096), max(need, x.s.opts.MaxBodyBytes))
	}
	if d := int64(c) - x.reserved; d > 0 {
		if !x.s.reserve(d) {
			return fmt.Errorf("%w: the streams open hold %d bytes (%d of them request bodies), and this body needs %d more, past MaxBufferedBytes (%d)",
				ErrOverloaded, x.s.reserved.Load(), x.s.buffered.Load(), d, x.s.opts.MaxBufferedBytes)
		}
		x.s.buffered.Add(d)
		x.reserved += d
	}
	if c > cap(x.body) {
		b := make([]byte, len(x.body), c)
		copy(b, x.body)
		x.body = b
	}
	return nil
}

// releaseBody returns the body buffer to the Server's pool (a small one)
// and its reservation to the budget: once routed, the body is not needed.
func (x *exchange) releaseBody() {
	if x.reserved != 0 {
		x.s.buffered.Add(-x.reserved)
		x.s.reserved.Add(-x.reserved)
		x.reserved = 0
	}
	if x.buf == nil {
		return
	}
	if cap(x.body) <= retainBodyBytes {
		*x.buf = x.body[:0]
	} else {
		*x.buf = nil
	}
	x.s.bodies.Put(x.buf)
	x.buf, x.body = nil, nil
}

// release drops references the pooled exchange must not keep.
func (x *exchange) release() {
	x.releaseBody()
	x.releaseAssembly()
	clear(x.req.Header[:cap(x.req.Header)])
	x.req = PickRequest{Header: x.req.Header[:0]}
	x.st, x.tracker, x.head, x.cause, x.hintErr, x.respHeaders, x.reqPhase = nil, nil, nil, nil, nil, nil, reqTimer{}
}

// finish reports Done to the Tracker of a request whose stream ended
// before its response did (err is the stream's error, if any).
func (x *exchange) finish(err error) {
	if x.tracker == nil || x.complete {
		return
	}
	x.complete = true
	cause := errStreamEnded
	if err == nil {
		err = x.cause
	}
	if err != nil {
		cause = fmt.Errorf("%w: %v", errStreamEnded, err)
	}
	x.tracker.Done(Outcome{Err: cause, Status: x.status, Served: x.served})
}

// protocolError is a message out of Envoy's sequence: the stream fails
// with InvalidArgument.
func (x *exchange) protocolError(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, "picker: "+format, args...)
}

// handle processes one message; stop ends the stream without error (after
// an immediate response).
func (x *exchange) handle(m *extprocv3.ProcessingRequest) (stop bool, err error) {
	if m.GetObservabilityMode() {
		return false, status.Error(codes.FailedPrecondition,
			"picker: observability_mode is set, but an endpoint picker must answer every message; turn it off")
	}
	if pc := m.GetProtocolConfig(); pc != nil {
		if err := x.protocol(pc); err != nil {
			return false, err
		}
	}
	switch r := m.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		if x.ph != phaseHeaders {
			return false, x.protocolError("request_headers arrived %s", phaseNames[x.ph])
		}
		x.hint(m.GetMetadataContext())
		x.req.ClientAddress = sourceAddress(m.GetAttributes())
		return x.requestHeaders(r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		if x.ph != phaseBody {
			return false, x.protocolError("request_body arrived %s", phaseNames[x.ph])
		}
		x.hint(m.GetMetadataContext())
		b := r.RequestBody
		if len(x.body)+len(b.GetBody()) > x.s.opts.MaxBodyBytes {
			return true, x.immediate(fmt.Errorf("%w: request body exceeds MaxBodyBytes (%d bytes)", ErrBodyTooLarge, x.s.opts.MaxBodyBytes))
		}
		if err := x.grow(len(b.GetBody())); err != nil {
			return true, x.immediate(err)
		}
		x.body = append(x.body, b.GetBody()...)
		if !b.GetEndOfStream() {
			return false, nil
		}
		return x.route(true, false)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		// In FULL_DUPLEX_STREAMED mode trailers, when present, are what
		// says the body is complete.
		if x.ph != phaseBody {
			return false, x.protocolError("request_trailers arrived %s", phaseNames[x.ph])
		}
		x.hint(m.GetMetadataContext())
		return x.route(true, true)
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		if x.ph != phaseRouted {
			return false, x.protocolError("response_headers arrived %s", phaseNames[x.ph])
		}
		x.servedBy(m.GetMetadataContext())
		return false, x.responseHeaders(r.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		if x.ph != phaseResponse {
			return false, x.protocolError("response_body arrived %s", phaseNames[x.ph])
		}
		x.servedBy(m.GetMetadataContext())
		if x.agg != nil {
			return x.assembleBody(r.ResponseBody.GetBody(), r.ResponseBody.GetEndOfStream())
		}
		return false, x.responseBody(r.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		if x.ph != phaseResponse && x.ph != phaseDone {
			return false, x.protocolError("response_trailers arrived %s", phaseNames[x.ph])
		}
		x.servedBy(m.GetMetadataContext())
		if x.agg != nil {
			// Trailers end an assembled answer's body: the answer goes
			// first, without end_of_stream, as a body ended by trailers.
			if stop, err := x.assembleEnd(false); stop || err != nil {
				return stop, err
			}
		}
		x.ph = phaseDone
		x.done()
		return false, x.st.Send(responseTrailersAnswer)
	case nil:
		return false, x.protocolError("message %s sets none of the request fields", phaseNames[x.ph])
	default:
		return false, x.protocolError("unsupported message %T %s", r, phaseNames[x.ph])
	}
}

// protocol checks the body modes Envoy reports in its first message.
func (x *exchange) protocol(pc *extprocv3.ProtocolConfiguration) error {
	if m := pc.GetRequestBodyMode(); m != extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		return status.Errorf(codes.FailedPrecondition,
			"picker: processing_mode.request_body_mode is %s; the picker needs FULL_DUPLEX_STREAMED to read the whole body before it answers the headers", m)
	}
	switch pc.GetResponseBodyMode() {
	case extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		x.respEcho, x.respNone, x.respTimed = true, false, true
	case extprocfilterv3.ProcessingMode_NONE:
		x.respEcho, x.respNone, x.respTimed = false, true, false
	case extprocfilterv3.ProcessingMode_STREAMED:
		x.respEcho, x.respNone, x.respTimed = false, false, true
	default: // BUFFERED, BUFFERED_PARTIAL: the body comes when buffered
		x.respEcho, x.respNone, x.respTimed = false, false, false
	}
	return nil
}

// hint takes the subset hint from a request-phase message's metadata; the
// latest message that carries the namespace decides, as in GIE, which
// reads the metadata of every message.
func (x *exchange) hint(md *corev3.Metadata) {
	if md.GetFilterMetadata()[SubsetNamespace] == nil {
		return
	}
	s, present, err := parseSubsetHint(md, x.subset)
	if s != nil {
		x.subset = s
	}
	x.hintErr = err
	if present {
		x.req.Subset = x.subset
	} else {
		x.req.Subset = nil
	}
}

func (x *exchange) servedBy(md *corev3.Metadata) {
	if s := servedEndpoint(md); s != "" {
		x.served = s
	}
}

func (x *exchange) requestHeaders(h *extprocv3.HttpHeaders) (bool, error) {
	x.start = x.s.opts.Clock()
	for _, hv := range h.GetHeaders().GetHeaders() {
		name := hv.GetKey()
		value := headerValue(hv)
		switch name {
		case ":method":
			x.req.Method = value
		case ":path":
			x.req.Path = value
		case ":authority":
			x.req.Authority = value
		case ":scheme":
			x.req.Scheme = value
		default:
			if strings.HasPrefix(name, ":") {
				continue
			}
			x.req.Header = append(x.req.Header, Header{Name: name, Value: value})
		}
	}
	if hc, ok := x.s.router.(HeadChecker); ok {
		x.req.Received = x.start
		if err := hc.CheckHead(&x.req); err != nil {
			return true, x.immediate(err)
		}
	}
	if h.GetEndOfStream() {
		return x.route(false, false)
	}
	x.ph = phaseBody
	return false, nil
}

// headerValue returns a header's value: raw_value, which Envoy sends by
// default, else value (GIE's GetHeaderValue in pkg/common/envoy does the
// same).
func headerValue(hv *corev3.HeaderValue) string {
	if raw := hv.GetRawValue(); len(raw) > 0 {
		return string(raw)
	}
	return hv.GetValue()
}

// route asks the Router for an endpoint and answers the request phase:
// the headers response naming it, then the body (if the request has one)
// as streamed_response chunks, then the trailers response (if the request
// ended with trailers).
func (x *exchange) route(hasBody, trailers bool) (bool, error) {
	if x.hintErr != nil {
		return true, x.immediate(x.hintErr)
	}
	if hasBody {
		x.req.Body = x.body
		if x.req.Body == nil {
			x.req.Body = []byte{}
		}
	}
	x.req.Received = x.start
	if hasBody {
		x.prepareAssembly()
	}
	p, err := x.s.router.Pick(x.reqPhase.ctx, &x.req)
	x.req.Body = nil
	if err != nil {
		if x.reqPhase.timedOut() {
			// The Router held the request (flow control's queue) past
			// RequestTimeout, which bounds the request phase up to the
			// answer, and gave up when its context ended.
			return true, x.immediate(x.s.requestTimedOut())
		}
		return true, x.immediate(err)
	}
	if x.reqPhase.stop != nil {
		x.reqPhase.stop() // routed: the context lasts as the stream's
	}
	x.tracker = p.Tracker
	x.routed = x.s.opts.Clock()
	if p.Reply != nil {
		return true, x.reply(p.Reply)
	}
	dest, err := x.destination(&p)
	if err == nil {
		err = checkHeaders(p.Headers)
	}
	if err == nil {
		err = checkHeaders(p.ResponseHeaders)
	}
	if err != nil {
		x.complete = true
		if x.tracker != nil {
			x.tracker.Done(Outcome{Err: err})
		}
		return true, x.immediate(err)
	}
	x.ph = phaseRouted
	x.respHeaders = p.ResponseHeaders
	if h, ok := x.tracker.(HeadTracker); ok {
		x.head, x.headLeft = h, MaxResponseHead
	}
	body := x.body
	if hasBody {
		body = x.assembleRequest(p.Assemble)
	}
	if err := x.st.Send(requestHeadersResponse(dest, hasBody, len(body), p.Headers)); err != nil {
		return false, err
	}
	if hasBody {
		if err := sendChunks(x.st, body, !trailers, requestBodyResponse); err != nil {
			return false, err
		}
	}
	x.releaseBody()
	x.releaseRewritten() // the rewritten body is sent
	if trailers {
		return false, x.st.Send(requestTrailersAnswer)
	}
	return false, nil
}

// destination checks a Pick and returns the value of
// x-gateway-destination-endpoint: the endpoint, then up to MaxFallbacks
// distinct fallbacks that are ip:port and within the subset.
func (x *exchange) destination(p *Pick) (string, error) {
	if _, err := netip.ParseAddrPort(p.Endpoint); err != nil {
		return "", fmt.Errorf("picker: the router chose endpoint %q, which is not ip:port", p.Endpoint)
	}
	if !x.req.Subset.Allows(p.Endpoint) {
		return "", fmt.Errorf("%w: the router chose %s, outside the subset hint %s/%s %v", ErrNoEndpoint, p.Endpoint, SubsetNamespace, SubsetKey, []string(x.req.Subset))
	}
	n := min(x.s.opts.MaxFallbacks, len(p.Fallbacks))
	if n == 0 {
		return p.Endpoint, nil
	}
	var sb strings.Builder
	sb.WriteString(p.Endpoint)
	added := 0
	for i, f := range p.Fallbacks {
		if added == n {
			break
		}
		if f == p.Endpoint || !x.req.Subset.Allows(f) || slices.Contains(p.Fallbacks[:i], f) {
			continue
		}
		if _, err := netip.ParseAddrPort(f); err != nil {
			continue
		}
		sb.WriteByte(',')
		sb.WriteString(f)
		added++
	}
	return sb.String(), nil
}

// reply sends a Router's own answer, ending the request; the Tracker, if
// any, hears of it at once.
func (x *exchange) reply(r *Reply) error {
	x.complete = true
	if !validStatus(r.Status) {
		err := fmt.Errorf("picker: the router replied with status %d, which is not an HTTP status from 200 to 599", r.Status)
		if x.tracker != nil {
			x.tracker.Done(Outcome{Err: err})
		}
		return x.immediate(err)
	}
	if x.tracker != nil {
		x.tracker.Done(Outcome{Status: r.Status})
	}
	return x.st.Send(replyResponse(r))
}

// immediate answers the client with the error's status, ending the
// request (GIE's BuildErrResponse in pkg/common/error does the same with
// a plain-text body).
func (x *exchange) immediate(err error) error {
	return x.st.Send(immediateResponse(err))
}

func (x *exchange) responseHeaders(h *extprocv3.HttpHeaders) error {
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch k := hv.GetKey(); {
		case k == ":status":
			if n, err := strconv.Atoi(headerValue(hv)); err == nil {
				x.status = n
			}
		case equalFold(k, "content-type"):
			x.sse = strings.HasPrefix(strings.TrimSpace(headerValue(hv)), "text/event-stream")
		}
	}
	if !x.sse {
		x.firstToken()
	}
	x.meter.Reset(x.sse)
	x.ph = phaseResponse
	answer := responseHeadersAnswer
	if hs := x.assembleHeaders(h.GetEndOfStream() || x.respNone); len(hs) > 0 {
		answer = responseHeadersResponse(hs)
	}
	if err := x.st.Send(answer); err != nil {
		return err
	}
	if h.GetEndOfStream() || x.respNone {
		x.ph = phaseDone
		x.done()
	}
	return nil
}

func (x *exchange) responseBody(b *extprocv3.HttpBody) error {
	if len(b.GetBody()) > 0 {
		x.firstToken()
		if x.head != nil {
			x.readHead(b.GetBody())
		}
		if x.tracker != nil && x.status/100 == 2 {
			x.meter.Feed(b.GetBody())
		}
	}
	eos := b.GetEndOfStream()
	if eos {
		x.ph = phaseDone
		// Done before the last chunk goes back: the request is over for
		// the engine, and Envoy may close the stream as soon as it has
		// the chunk.
		x.done()
	}
	if !x.respEcho {
		return x.st.Send(responseBodyAckAnswer)
	}
	return sendChunks(x.st, b.GetBody(), eos, responseBodyResponse)
}

// readHead gives the HeadTracker the head of a response body chunk, up
// to MaxResponseHead bytes in all, until it has enough.
func (x *exchange) readHead(chunk []byte) {
	if x.complete {
		x.head = nil
		return
	}
	c := chunk[:min(len(chunk), x.headLeft)]
	x.headLeft -= len(c)
	if x.head.ResponseHead(x.status, c) || x.headLeft == 0 {
		x.head = nil
	}
}

func (x *exchange) firstToken() {
	if x.first {
		return
	}
	x.first = true
	now := x.s.opts.Clock()
	x.latency = now.Sub(x.start)
	if x.sse && x.respTimed {
		x.ttft = now.Sub(x.routed)
	}
	if x.tracker != nil {
		x.tracker.FirstToken()
	}
}

// errUpstreamStatus is the Outcome error of a 5xx response.
var errUpstreamStatus = errors.New("picker: upstream answered with a server error")

// done reports the end of the response to the Tracker, once.
func (x *exchange) done() {
	if x.complete {
		return
	}
	x.complete = true
	if x.tracker == nil {
		return
	}
	o := Outcome{Status: x.status, Served: x.served}
	switch {
	case x.status >= 500:
		o.Err = fmt.Errorf("%w: status %d", errUpstreamStatus, x.status)
	case x.respNone && x.sse, x.status/100 != 2:
		// The end of an event stream is not seen in mode NONE; an
		// answer that is not a success measures no speed.
		o.Latency = x.latency
	default:
		o.Latency, o.TTFT = x.latency, x.ttft
		if !x.respNone {
			o.OutputTokens, _ = x.meter.Tokens()
		}
		o.Elapsed = max(x.s.opts.Clock().Sub(x.routed), 0)
	}
	x.tracker.Done(o)
}

// SourceAttribute is the ext_proc request attribute the picker reads as
// the client's address (PickRequest.ClientAddress): Envoy sends it when
// the filter's request_attributes include it.
const SourceAttribute = "source.address"

// sourceAddress is the string value of SourceAttribute in a request's
// attributes, "" if none: under the ext_proc filter's name, else under
// the first name in byte order that has it (the map is keyed by the
// filter's configured name).
func sourceAddress(attrs map[string]*structpb.Struct) string {
	if len(attrs) == 0 {
		return ""
	}
	of := func(s *structpb.Struct) string { return s.GetFields()[SourceAttribute].GetStringValue() }
	if a := of(attrs[extProcFilter]); a != "" {
		return a
	}
	best, found := "", ""
	for name, s := range attrs {
		if a := of(s); a != "" && (found == "" || name < best) {
			best, found = name, a
		}
	}
	return found
}

// extProcFilter is the ext_proc HTTP filter's name in Envoy.
const extProcFilter = "envoy.filters.http.ext_proc"

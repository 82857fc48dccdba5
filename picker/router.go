package picker

import (
	"context"
	"time"
)

// Router chooses where one request goes. The picker's ext_proc server calls
// Pick once per request, after the whole body has arrived, and reports the
// request's progress to the returned Pick's Tracker.
//
// Pick's errors choose the immediate response Envoy sends the client: an
// error wrapping ErrNoEndpoint gets 503, ErrShed 429 (with Retry-After),
// ErrBadRequest 400, ErrUnknownModel 404; any other error 500. The error's text is the
// response's message, so it should name the field and value at fault.
//
// Pick must be safe for concurrent use. It must not keep req, or anything
// req holds, after it returns. ctx ends with the ext_proc stream, or when
// Options.RequestTimeout passes while Pick runs (context.Cause
// ErrRequestTimeout; the request is then answered 408 if Pick fails): a
// Pick that holds the request must return when it ends.
type Router interface {
	Pick(ctx context.Context, req *PickRequest) (Pick, error)
}

// HeadChecker is a Router that may refuse a request from its headers
// alone, before its body is read (a per-client rate limit): the server
// calls CheckHead once the request headers have arrived, req holding them
// (no Body yet), and an error answers the request at once, as an error
// of Pick does; Pick is then not called. CheckHead must be safe for
// concurrent use and must not keep req.
type HeadChecker interface {
	CheckHead(req *PickRequest) error
}

// PickRequest is what the picker knows of a request when it asks for an
// endpoint. Its slices are reused once Pick returns.
type PickRequest struct {
	// Method, Path, Authority and Scheme are the request's pseudo-headers
	// (":method", ":path", ":authority", ":scheme"); empty when Envoy sent
	// none.
	Method, Path, Authority, Scheme string
	// Header holds the other request headers in the order Envoy sent
	// them (Envoy sends names in lower case).
	Header Headers
	// Body is the whole request body; nil for a request without one (a
	// GET, or headers with end_of_stream).
	Body []byte
	// Received is when the request headers reached the picker
	// (Options.Clock): the start of the request's time to first token.
	Received time.Time
	// ClientAddress is the downstream peer's address as Envoy gives it
	// in the ext_proc request attribute "source.address" ("ip:port"), which
	// it sends with the request headers when the filter's
	// request_attributes list it; "" when it sends none. Unlike
	// X-Forwarded-For, a client cannot set it.
	ClientAddress string
	// CanAssemble says that the server would stream the request's answer
	// from the engine and assemble it if the Pick allowed it
	// (Pick.Assemble): Options.DisableUpstreamStream is off, Envoy's
	// response body mode is FULL_DUPLEX_STREAMED and Options.MaxBufferedBytes
	// holds what it takes. A Router that releases a non-streamed request's
	// pending prefill at a predicted time, since it cannot see its first
	// token, need not for a request it allows to be assembled then: the
	// first token is seen.
	CanAssemble bool
	// Subset, when non-nil, is the set of endpoints the data plane allows
	// for this request (the subset hint); the Router must choose within it
	// or fail with ErrNoEndpoint. nil allows every endpoint. The server
	// never calls Pick with a non-nil empty subset: it answers 503 itself.
	Subset Subset
}

// Headers is a list of request headers. The zero value is empty.
type Headers []Header

// Header is one request header.
type Header struct {
	Name, Value string
}

// Get returns the value of the first header named name, compared without
// regard to ASCII case, or "" if there is none. It has the signature of
// http.Header.Get, so code reading a header through
// interface{ Get(string) string } serves both.
func (h Headers) Get(name string) string {
	for i := range h {
		if equalFold(h[i].Name, name) {
			return h[i].Value
		}
	}
	return ""
}

// equalFold reports whether a and b are equal under ASCII case folding.
func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if x == y {
			continue
		}
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// Pick is a Router's answer.
type Pick struct {
	// Endpoint is where the request goes, as "ip:port" ("[ip6]:port" for
	// IPv6): the form Envoy's ORIGINAL_DST cluster parses. Required.
	Endpoint string
	// Fallbacks are further endpoints, best first, that a data plane
	// implementing the protocol's fallback list may try if Endpoint fails.
	// The server sends at most Options.MaxFallbacks of them.
	Fallbacks []string
	// Headers are request headers, besides x-gateway-destination-endpoint,
	// that the data plane sets on the request it sends to Endpoint,
	// replacing any the client sent; a Header with an empty Value is
	// removed instead (a disaggregated model's x-prefiller-host-port, for
	// one, is set when the request is split and removed when it is not).
	// Names must be HTTP header names (RFC 9110 tokens) other than
	// pseudo-headers and host, values free of CR, LF and NUL; a Pick
	// breaking this is answered with 500.
	Headers []Header
	// ResponseHeaders are headers set on the client's response, as the
	// HTTP gateway sets X-Exa-Replica and X-Exa-Decision: the picker adds
	// them when the data plane sends it the response headers (GIE's default
	// processing mode does; in mode NONE they are not sent). The same rules
	// as for Headers apply.
	ResponseHeaders []Header
	// Reply, when not nil, answers the request from the picker itself: it
	// goes to no endpoint (Endpoint, Fallbacks and Headers are ignored)
	// and the client gets Reply's status and body. It is for requests a
	// Router can answer alone, such as a list of the models it serves.
	Reply *Reply
	// Tracker, if not nil, hears how the request goes. With a Reply, its
	// Done is called at once with the Reply's status.
	Tracker Tracker
	// Assemble, when not AssembleNone, says that the request's client did
	// not ask for a stream and that its answer may be streamed from the
	// engine and assembled into the JSON answer the client asked for
	// (fleetpick sets it where keys.StreamUpstream allows, as the HTTP
	// gateway streams). The server then, unless
	// Options.DisableUpstreamStream is set, rewrites the body it sends on
	// to ask for a stream with usage ("stream": true, "stream_options":
	// {"include_usage": true}), reports FirstToken at the stream's first
	// chunk, and gives the client the answer assembled from the stream,
	// as application/json. It does so only when Envoy's response body
	// mode is FULL_DUPLEX_STREAMED (the only one in which the picker
	// replaces the response body) and Options.MaxBufferedBytes has room;
	// otherwise the request goes as it is. An answer that is not a 2xx
	// event stream goes to the client as it is.
	Assemble Assembly
}

// Reply is an answer the picker sends the client itself (Pick.Reply).
type Reply struct {
	// Status is the HTTP status, 200 to 599 (a status Envoy's
	// envoy.type.v3.StatusCode names). Another is answered with 500.
	Status int
	// ContentType is the Content-Type of Body; "" sends none.
	ContentType string
	// Body is the response body, sent as it is. The Router must not
	// change it once Pick has returned it.
	Body []byte
}

// Tracker follows one picked request. The server calls FirstToken at most
// once and Done exactly once, from the goroutine serving the request's
// stream; Done is called however the stream ends, so the load a Router
// books for a request is always released.
type Tracker interface {
	// FirstToken reports that the request's first token has arrived: the
	// first response body bytes of a streamed (SSE) response, or the
	// response headers of any other.
	FirstToken()
	// Done reports that the request has ended.
	Done(Outcome)
}

// MaxResponseHead is how many leading bytes of a response body the server
// gives a HeadTracker: enough for the head of an OpenAI answer (its "id",
// or the first event of a stream).
const MaxResponseHead = 4 << 10

// HeadTracker is a Tracker that also reads the head of the response body,
// as a Router learning something from each answer needs (fleetpick's
// Router learns a Responses API answer's id). A Tracker that does not
// implement it costs the server nothing: no bytes are copied or kept.
type HeadTracker interface {
	Tracker
	// ResponseHead is called with the response's HTTP status (0 if no
	// status came) and each non-empty response body chunk in order, cut
	// so that the chunks given hold at most MaxResponseHead bytes
	// together, until it returns true. It is called from the goroutine
	// serving the request's stream, always before Done, never after it.
	// chunk is valid only during the call. A response without a body, or
	// whose body does not reach the picker (response body mode NONE),
	// gets no call.
	ResponseHead(status int, chunk []byte) (enough bool)
}

// Outcome reports how a picked request ended.
type Outcome struct {
	// Latency is the time from the request's headers reaching the picker
	// to its first token (see Tracker.FirstToken); zero when there was no
	// first token or the request failed.
	Latency time.Duration
	// TTFT is the time from routing (the Router's Pick returning) to the
	// first body chunk of an event stream (SSE) whose chunks reach the
	// picker as the upstream sends them (response body mode
	// FULL_DUPLEX_STREAMED or STREAMED); zero for any other answer, whose
	// first token the picker does not see: a plain JSON answer comes
	// whole, and a buffered body comes at its end. Elapsed is the time
	// from routing to the end of the answer, zero when the picker did not
	// see it (an event stream in mode NONE) or the answer is not a
	// success (2xx).
	// OutputTokens is the answer's output token count as the HTTP
	// gateway counts it (internal/front's Meter): the usage in its body
	// ("completion_tokens", or the Responses API's "output_tokens"), else
	// for an event stream its chunks with content; zero when the body did
	// not reach the picker (mode NONE), a plain answer held no usage, or
	// the answer is not a success. Together they are gateway.DoneInfo's
	// measures of the replica's speed.
	TTFT, Elapsed time.Duration
	OutputTokens  int
	// Err is why the request failed: an upstream 5xx, or a stream that
	// ended before the response did (a client that went away, an
	// upstream that could not be reached). nil on success.
	Err error
	// Status is the upstream's HTTP status, 0 if no response headers
	// came.
	Status int
	// Served is the endpoint that served the request as the data plane
	// reported it (metadata envoy.lb / x-gateway-destination-endpoint-served),
	// "" if it did not. It differs from the Pick's Endpoint when a fallback
	// served the request.
	Served string
}

// Package pickertest plays Envoy's side of the endpoint picker protocol, for
// tests of an ext_proc endpoint picker (package picker) without an Envoy
// binary. Exchange sends one request's messages in the order Envoy sends
// them in FULL_DUPLEX_STREAMED mode and reads the picker's answers; Envoy is
// an http.Handler that does this for every HTTP request it serves, then
// sends the request to the endpoint the picker named, as Envoy's
// ORIGINAL_DST cluster does, and feeds the response back to the picker.
//
// It follows Envoy's message sequence as GIE v1.5.0's integration tests
// play it (test/integration/util.go) and as Envoy's ext_proc filter sends it
// (source/extensions/filters/http/ext_proc); it is not Envoy. In
// particular, Envoy cuts bodies by its buffers and network reads, which
// Envoy.Chunk and the upstream's reads stand for here.
package pickertest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/examlops/gateway/picker"
)

// DefaultChunk is the size of the request body chunks an Exchange sends
// when Request.Chunk is zero: 16 KiB, the size of Envoy's default read
// buffer slices.
const DefaultChunk = 16 << 10

// Client opens ext_proc streams to a picker. It is safe for concurrent use.
type Client struct {
	c extprocv3.ExternalProcessorClient
}

// NewClient returns a Client over a gRPC connection to the picker.
func NewClient(conn grpc.ClientConnInterface) *Client {
	return &Client{c: extprocv3.NewExternalProcessorClient(conn)}
}

// Open opens one ext_proc stream: one HTTP request. Cancelling ctx
// cancels the stream, as Envoy does when the client goes away.
func (c *Client) Open(ctx context.Context) (*Exchange, error) {
	st, err := c.c.Process(ctx)
	if err != nil {
		return nil, err
	}
	return &Exchange{st: st}, nil
}

// Exchange is one ext_proc stream. Its methods must be called from one
// goroutine, in protocol order.
type Exchange struct {
	st extprocv3.ExternalProcessor_ProcessClient
}

// Send sends one message.
func (x *Exchange) Send(m *extprocv3.ProcessingRequest) error { return x.st.Send(m) }

// Recv reads one answer.
func (x *Exchange) Recv() (*extprocv3.ProcessingResponse, error) { return x.st.Recv() }

// Close half-closes the stream and waits for the picker to end it; it
// returns nil when the picker ends it without error.
func (x *Exchange) Close() error {
	if err := x.st.CloseSend(); err != nil {
		return err
	}
	if m, err := x.st.Recv(); err != io.EOF {
		if err == nil {
			return fmt.Errorf("pickertest: unexpected answer after the exchange: %v", m)
		}
		return err
	}
	return nil
}

// Request is what Exchange.Request sends.
type Request struct {
	// Method and Path are the ":method" and ":path" pseudo-headers;
	// defaults POST and /v1/chat/completions. Authority is ":authority",
	// default "gateway".
	Method, Path, Authority string
	// Header holds the other request headers (Envoy sends names in lower
	// case; so does Request).
	Header []picker.Header
	// Metadata is the filter metadata sent with the headers (a subset
	// hint: SubsetMetadata).
	Metadata *corev3.Metadata
	// Attributes are the request attributes sent with the headers, by
	// filter name (SourceAttributes).
	Attributes map[string]*structpb.Struct
	// Body is the request body; nil sends the headers with end_of_stream.
	Body []byte
	// Chunk is the size of the body chunks; 0 means DefaultChunk.
	Chunk int
}

// Routed is the picker's answer to the request phase.
type Routed struct {
	// Immediate is the picker's immediate response (an error, or a reply
	// of its own); the other fields are then empty.
	Immediate *extprocv3.ImmediateResponse
	// Endpoint is the header x-gateway-destination-endpoint and
	// MetadataEndpoint the same in the dynamic metadata (envoy.lb).
	Endpoint, MetadataEndpoint string
	// ClearRouteCache is the headers response's clear_route_cache.
	ClearRouteCache bool
	// Set holds every header the headers response sets, in its order;
	// Remove the headers it removes.
	Set    []picker.Header
	Remove []string
	// Body is the request body as the picker streamed it back; Chunks the
	// sizes of its chunks.
	Body   []byte
	Chunks []int
}

// Header returns the value the headers response sets for name (compared
// without regard to case), and whether it sets one.
func (r *Routed) Header(name string) (string, bool) {
	for _, h := range r.Set {
		if strings.EqualFold(h.Name, name) {
			return h.Value, true
		}
	}
	return "", false
}

// Request sends the request headers and body, in chunks, and reads the
// picker's answer: the headers response and the body chunks up to
// end_of_stream, or an immediate response.
func (x *Exchange) Request(r Request) (Routed, error) {
	method, path, auth := r.Method, r.Path, r.Authority
	if method == "" {
		method = "POST"
	}
	if path == "" {
		path = "/v1/chat/completions"
	}
	if auth == "" {
		auth = "gateway"
	}
	kv := []string{":method", method, ":path", path, ":authority", auth, ":scheme", "http"}
	for _, h := range r.Header {
		kv = append(kv, strings.ToLower(h.Name), h.Value)
	}
	m := RequestHeaders(r.Body == nil, r.Metadata, kv...)
	m.Attributes = r.Attributes
	if err := x.Send(m); err != nil {
		return Routed{}, err
	}
	if r.Body != nil {
		chunk := r.Chunk
		if chunk <= 0 {
			chunk = DefaultChunk
		}
		for off := 0; ; off += chunk {
			end := min(off+chunk, len(r.Body))
			if err := x.Send(RequestBody(r.Body[off:end], end == len(r.Body))); err != nil {
				if errors.Is(err, io.EOF) {
					// The picker answered before the body was whole
					// (an immediate response at the headers) and ended
					// the stream: its answer is there to read, as Envoy
					// reads it.
					return x.readRouted(false)
				}
				return Routed{}, err
			}
			if end == len(r.Body) {
				break
			}
		}
	}
	return x.readRouted(r.Body != nil)
}

func (x *Exchange) readRouted(hasBody bool) (Routed, error) {
	var r Routed
	m, err := x.Recv()
	if err != nil {
		return r, err
	}
	if im := m.GetImmediateResponse(); im != nil {
		r.Immediate = im
		return r, nil
	}
	hr := m.GetRequestHeaders()
	if hr == nil {
		return r, fmt.Errorf("pickertest: first answer is %T, want a request headers response", m.GetResponse())
	}
	cr := hr.GetResponse()
	r.ClearRouteCache = cr.GetClearRouteCache()
	for _, o := range cr.GetHeaderMutation().GetSetHeaders() {
		h := picker.Header{Name: o.GetHeader().GetKey(), Value: string(o.GetHeader().GetRawValue())}
		if h.Value == "" {
			h.Value = o.GetHeader().GetValue()
		}
		r.Set = append(r.Set, h)
	}
	r.Remove = cr.GetHeaderMutation().GetRemoveHeaders()
	r.Endpoint, _ = r.Header(picker.DestinationKey)
	r.MetadataEndpoint = m.GetDynamicMetadata().GetFields()[picker.DestinationNamespace].GetStructValue().
		GetFields()[picker.DestinationKey].GetStringValue()
	for eos := !hasBody; !eos; {
		m, err := x.Recv()
		if err != nil {
			return r, err
		}
		sr := m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			return r, fmt.Errorf("pickertest: body answer %v is not a streamed_response", m)
		}
		if len(sr.GetBody()) > picker.MaxChunkBytes {
			return r, fmt.Errorf("pickertest: request body chunk of %d bytes, over %d", len(sr.GetBody()), picker.MaxChunkBytes)
		}
		r.Body = append(r.Body, sr.GetBody()...)
		r.Chunks = append(r.Chunks, len(sr.GetBody()))
		eos = sr.GetEndOfStream()
	}
	return r, nil
}

// ResponseHeaders sends the response headers (":status" and header, with
// metadata md, e.g. ServedMetadata) and reads the picker's answer.
func (x *Exchange) ResponseHeaders(status int, header []picker.Header, md *corev3.Metadata, eos bool) error {
	_, _, err := x.ResponseHeadersMutation(status, header, md, eos)
	return err
}

// ResponseHeadersMutation is ResponseHeaders, returning the headers the
// picker sets on the response and those it removes
// (picker.Pick.ResponseHeaders).
func (x *Exchange) ResponseHeadersMutation(status int, header []picker.Header, md *corev3.Metadata, eos bool) (set []picker.Header, remove []string, err error) {
	kv := []string{":status", strconv.Itoa(status)}
	for _, h := range header {
		kv = append(kv, strings.ToLower(h.Name), h.Value)
	}
	m := ResponseHeaders(eos, kv...)
	m.MetadataContext = md
	if err := x.Send(m); err != nil {
		return nil, nil, err
	}
	a, err := x.Recv()
	if err != nil {
		return nil, nil, err
	}
	if a.GetResponseHeaders() == nil {
		return nil, nil, fmt.Errorf("pickertest: answer to the response headers is %T", a.GetResponse())
	}
	mu := a.GetResponseHeaders().GetResponse().GetHeaderMutation()
	for _, o := range mu.GetSetHeaders() {
		h := picker.Header{Name: o.GetHeader().GetKey(), Value: string(o.GetHeader().GetRawValue())}
		if h.Value == "" {
			h.Value = o.GetHeader().GetValue()
		}
		set = append(set, h)
	}
	return set, mu.GetRemoveHeaders(), nil
}

// ResponseBody sends one response body chunk and returns the body the
// picker streams back for it, in chunks of at most picker.MaxChunkBytes.
// A chunk that does not end the body is answered with the chunk itself
// (in one or more messages), or with one empty message while the picker
// holds the body to answer it whole at its end (an answer it assembles,
// picker.Pick.Assemble); the chunk that ends it with any body, the last
// message with end_of_stream. An immediate response from the picker (an
// answer that failed once its headers were sent) is an *ImmediateError.
func (x *Exchange) ResponseBody(chunk []byte, eos bool) ([]byte, error) {
	if err := x.Send(ResponseBody(chunk, eos)); err != nil {
		return nil, err
	}
	var out []byte
	for first := true; ; first = false {
		m, err := x.Recv()
		if err != nil {
			return out, err
		}
		if im := m.GetImmediateResponse(); im != nil {
			return out, &ImmediateError{Response: im}
		}
		sr := m.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			return out, fmt.Errorf("pickertest: response body answer %v is not a streamed_response", m)
		}
		if len(sr.GetBody()) > picker.MaxChunkBytes {
			return out, fmt.Errorf("pickertest: response body chunk of %d bytes, over %d", len(sr.GetBody()), picker.MaxChunkBytes)
		}
		out = append(out, sr.GetBody()...)
		switch {
		case sr.GetEndOfStream() && !eos:
			return out, errors.New("pickertest: end_of_stream on a chunk that did not end the body")
		case eos:
			if sr.GetEndOfStream() {
				return out, nil
			}
		case first && len(sr.GetBody()) == 0:
			return out, nil // held, or an empty chunk echoed
		case len(out) > len(chunk):
			return out, errors.New("pickertest: the picker streamed back more than the chunk")
		case len(out) == len(chunk):
			return out, nil
		}
	}
}

// ImmediateError is the error of an Exchange method the picker answered
// with an immediate response where Envoy expected a body chunk: Envoy,
// which has sent the client the response headers by then, resets the
// client's stream.
type ImmediateError struct {
	Response *extprocv3.ImmediateResponse
}

func (e *ImmediateError) Error() string {
	return fmt.Sprintf("pickertest: the picker answered with an immediate response, status %d: %s",
		e.Response.GetStatus().GetCode(), e.Response.GetBody())
}

// Respond plays a whole response: headers with status and contentType,
// then each chunk, the last with end_of_stream (no chunks: headers with
// end_of_stream). It returns the body the picker streamed back.
func (x *Exchange) Respond(status int, contentType string, chunks ...[]byte) ([]byte, error) {
	if err := x.ResponseHeaders(status, []picker.Header{{Name: "content-type", Value: contentType}}, nil, len(chunks) == 0); err != nil {
		return nil, err
	}
	var out []byte
	for i, c := range chunks {
		b, err := x.ResponseBody(c, i == len(chunks)-1)
		out = append(out, b...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// RequestHeaders builds a request_headers message: name/value pairs,
// values as raw_value, as Envoy sends them by default.
func RequestHeaders(eos bool, md *corev3.Metadata, kv ...string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{
		Request:         &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap(kv), EndOfStream: eos}},
		MetadataContext: md,
	}
}

// RequestBody builds a request_body message.
func RequestBody(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

// ResponseHeaders builds a response_headers message (":status" among kv).
func ResponseHeaders(eos bool, kv ...string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap(kv), EndOfStream: eos}}}
}

// ResponseBody builds a response_body message.
func ResponseBody(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

func headerMap(kv []string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return m
}

// SubsetMetadata is filter metadata carrying a subset hint: endpoints as a
// list of strings, as GIE gateways send it.
func SubsetMetadata(endpoints ...string) *corev3.Metadata {
	vals := make([]*structpb.Value, len(endpoints))
	for i, e := range endpoints {
		vals[i] = structpb.NewStringValue(e)
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{picker.SubsetNamespace: {Fields: map[string]*structpb.Value{
		picker.SubsetKey: structpb.NewListValue(&structpb.ListValue{Values: vals}),
	}}}}
}

// ServedMetadata is response metadata reporting the endpoint that served
// the request (envoy.lb / x-gateway-destination-endpoint-served).
func ServedMetadata(endpoint string) *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{picker.DestinationNamespace: {Fields: map[string]*structpb.Value{
		picker.ServedKey: structpb.NewStringValue(endpoint),
	}}}}
}

// SourceAttributes are the request attributes Envoy's ext_proc filter
// sends with request_attributes: [source.address]: the downstream peer's
// address under the filter's name.
func SourceAttributes(addr string) map[string]*structpb.Struct {
	return map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: map[string]*structpb.Value{
		picker.SourceAttribute: structpb.NewStringValue(addr)}}}
}

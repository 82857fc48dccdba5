package pickertest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/examlops/gateway/picker"
)

// Response headers Envoy adds to the answers it relays, for tests.
const (
	// HeaderEndpoint names the endpoint that served the request.
	HeaderEndpoint = "X-Pickertest-Endpoint"
	// HeaderPicked is the picker's whole x-gateway-destination-endpoint
	// (the endpoint, then any fallbacks).
	HeaderPicked = "X-Pickertest-Picked"
)

// Envoy is an http.Handler that stands in for Envoy with the picker as its
// ext_proc filter and an ORIGINAL_DST cluster: for each request it opens
// an Exchange, sends the request's headers and body, and then either
// relays the picker's immediate response or sends the request, as the
// picker streamed it back and with its header mutations, to the endpoint
// x-gateway-destination-endpoint names. It relays the endpoint's answer to
// the client as it arrives, each read sent through the picker first
// (response headers, then body chunks, end_of_stream at the end), and
// relays what the picker streams back for each: the chunk itself, or
// nothing while the picker holds the body, then the body it gives at the
// end (an answer it assembles, picker.Pick.Assemble).
//
// A client that goes away cancels the ext_proc stream and the upstream
// request, as Envoy does. An endpoint that cannot be reached gets the
// client a 503 that goes through the picker's response phase, as Envoy's
// router sends its local replies through the encoder filters (with
// Fallbacks, the next endpoint of the list is tried first).
//
// The fields must be set before the first request; Envoy is then safe for
// concurrent use.
type Envoy struct {
	// Client reaches the picker. Required.
	Client *Client
	// Upstream sends requests to the endpoints; default
	// http.DefaultTransport.
	Upstream http.RoundTripper
	// Chunk is the size of the request body chunks sent to the picker;
	// 0 means DefaultChunk.
	Chunk int
	// Metadata, if set, gives the filter metadata sent with a request's
	// headers (a subset hint: SubsetMetadata).
	Metadata func(*http.Request) *corev3.Metadata
	// Fallbacks makes Envoy try the endpoints of a list
	// ("ip:port,ip:port", the picker's fallbacks) in order while an
	// endpoint refuses the connection, and report the one that served in
	// the response metadata (ServedMetadata), as a data plane that
	// implements the protocol's fallback list does. Without it the value
	// is used whole, as ORIGINAL_DST uses it (a list fails to connect).
	Fallbacks bool
	// SourceAddress sends each request's remote address as the request
	// attribute source.address (SourceAttributes), as Envoy does when
	// its ext_proc filter's request_attributes list it.
	SourceAddress bool
}

func (e *Envoy) upstream() http.RoundTripper {
	if e.Upstream != nil {
		return e.Upstream
	}
	return http.DefaultTransport
}

// ServeHTTP serves one request through the picker.
func (e *Envoy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	x, err := e.Client.Open(ctx)
	if err != nil {
		http.Error(w, "pickertest: ext_proc stream: "+err.Error(), http.StatusInternalServerError)
		return
	}
	var body []byte
	if r.Body != nil && r.Body != http.NoBody && (r.ContentLength != 0 || len(r.TransferEncoding) > 0) {
		if body, err = io.ReadAll(r.Body); err != nil {
			return
		}
		if body == nil {
			body = []byte{}
		}
	}
	req := Request{Method: r.Method, Path: r.URL.RequestURI(), Authority: r.Host, Body: body, Chunk: e.Chunk}
	for name, vv := range r.Header {
		if hopHeader(name) {
			continue
		}
		for _, v := range vv {
			req.Header = append(req.Header, picker.Header{Name: strings.ToLower(name), Value: v})
		}
	}
	if e.Metadata != nil {
		req.Metadata = e.Metadata(r)
	}
	if e.SourceAddress {
		req.Attributes = SourceAttributes(r.RemoteAddr)
	}
	routed, err := x.Request(req)
	if err != nil {
		if ctx.Err() == nil {
			http.Error(w, "pickertest: ext_proc: "+err.Error(), http.StatusInternalServerError)
		}
		return
	}
	if im := routed.Immediate; im != nil {
		for _, o := range im.GetHeaders().GetSetHeaders() {
			v := string(o.GetHeader().GetRawValue())
			if v == "" {
				v = o.GetHeader().GetValue()
			}
			w.Header().Set(o.GetHeader().GetKey(), v)
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(im.GetBody())))
		w.WriteHeader(int(im.GetStatus().GetCode()))
		_, _ = w.Write(im.GetBody())
		return
	}
	if routed.Endpoint != routed.MetadataEndpoint {
		http.Error(w, "pickertest: the header and the metadata name different endpoints", http.StatusInternalServerError)
		return
	}
	targets := []string{routed.Endpoint}
	if e.Fallbacks {
		targets = strings.Split(routed.Endpoint, ",")
	}
	resp, served, err := e.send(ctx, r, &routed, targets)
	w.Header().Set(HeaderPicked, routed.Endpoint)
	if err != nil {
		if ctx.Err() != nil {
			return // the client went away: the stream's cancellation tells the picker
		}
		e.localReply(w, x, err)
		return
	}
	defer resp.Body.Close()
	var md *corev3.Metadata
	if e.Fallbacks {
		md = ServedMetadata(served)
	}
	var hdr []picker.Header
	for name, vv := range resp.Header {
		for _, v := range vv {
			hdr = append(hdr, picker.Header{Name: name, Value: v})
		}
	}
	set, remove, err := x.ResponseHeadersMutation(resp.StatusCode, hdr, md, false)
	if err != nil {
		return
	}
	for name, vv := range resp.Header {
		if !hopHeader(name) {
			w.Header()[name] = vv
		}
	}
	for _, name := range remove {
		w.Header().Del(name)
	}
	for _, h := range set {
		w.Header().Set(h.Name, h.Value)
	}
	w.Header().Set(HeaderEndpoint, served)
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			echoed, err := x.ResponseBody(buf[:n], false)
			if err != nil {
				abortOnImmediate(err)
				return
			}
			if _, err := w.Write(echoed); err != nil {
				return // the client went away; the deferred cancel ends the stream
			}
			_ = rc.Flush()
		}
		if rerr == io.EOF {
			echoed, err := x.ResponseBody(nil, true)
			abortOnImmediate(err)
			if len(echoed) > 0 {
				if _, err := w.Write(echoed); err != nil {
					return
				}
			}
			if err == nil {
				_ = x.Close()
			}
			return
		}
		if rerr != nil {
			return // the upstream broke mid-answer: Envoy resets the stream
		}
	}
}

// send sends the request to the first target that accepts the
// connection and returns its answer and the endpoint that served.
func (e *Envoy) send(ctx context.Context, r *http.Request, routed *Routed, targets []string) (*http.Response, string, error) {
	var lastErr error
	for _, ep := range targets {
		out, err := http.NewRequestWithContext(ctx, r.Method, "http://"+ep+r.URL.RequestURI(), bytes.NewReader(routed.Body))
		if err != nil {
			return nil, "", err
		}
		for name, vv := range r.Header {
			if !hopHeader(name) && !strings.EqualFold(name, "content-length") {
				out.Header[name] = vv
			}
		}
		for _, h := range routed.Set {
			switch {
			case strings.EqualFold(h.Name, "content-length"):
				n, err := strconv.ParseInt(h.Value, 10, 64)
				if err != nil || n != int64(len(routed.Body)) {
					return nil, "", errors.New("pickertest: the picker's content-length " + h.Value + " is not the body's length")
				}
			default:
				out.Header.Set(h.Name, h.Value)
			}
		}
		for _, name := range routed.Remove {
			out.Header.Del(name)
		}
		out.ContentLength = int64(len(routed.Body))
		resp, err := e.upstream().RoundTrip(out)
		if err == nil {
			return resp, ep, nil
		}
		lastErr = err
		var op *net.OpError
		if !errors.As(err, &op) || op.Op != "dial" {
			break
		}
	}
	return nil, "", lastErr
}

// localReply answers 503 for an endpoint that could not be reached,
// through the picker's response phase.
func (e *Envoy) localReply(w http.ResponseWriter, x *Exchange, cause error) {
	body := []byte("upstream connect error or disconnect/reset before headers. reset reason: " + cause.Error())
	if err := x.ResponseHeaders(http.StatusServiceUnavailable, []picker.Header{{Name: "content-type", Value: "text/plain"}}, nil, false); err == nil {
		if echoed, err := x.ResponseBody(body, true); err == nil {
			body = echoed
			_ = x.Close()
		}
	}
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = w.Write(body)
}

// abortOnImmediate resets the client's stream, as Envoy does, when the
// picker answered a response body chunk with an immediate response: the
// response headers are sent, so its status cannot be.
func abortOnImmediate(err error) {
	var ie *ImmediateError
	if errors.As(err, &ie) {
		panic(http.ErrAbortHandler)
	}
}

// hopHeader reports whether name is a connection-level header a proxy
// does not forward.
func hopHeader(name string) bool {
	switch http.CanonicalHeaderKey(name) {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

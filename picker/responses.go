package picker

import (
	"fmt"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// requestHeadersResponse names the chosen endpoint twice, with identical
// values, as the protocol requires: header x-gateway-destination-endpoint
// and dynamic metadata envoy.lb / x-gateway-destination-endpoint. It clears
// the route cache so that Envoy routes on the new header, and, for a
// request with a body, sets Content-Length to the body's length, as GIE
// v1.5.0 does (pkg/epp/handlers/request.go, generateRequestHeaderResponse
// and generateHeaders). A HeaderValueOption whose append fields are unset
// overwrites: in ext_proc set_headers, append defaults to false.
//
// extra are the Pick's Headers: set, or removed when their value is empty.
func requestHeadersResponse(dest string, hasBody bool, bodyLen int, extra []Header) *extprocv3.ProcessingResponse {
	set := make([]*corev3.HeaderValueOption, 1, 2+len(extra))
	set[0] = &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: DestinationKey, RawValue: []byte(dest)}}
	if hasBody && bodyLen > 0 {
		set = append(set, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{
			Key: "Content-Length", RawValue: strconv.AppendInt(nil, int64(bodyLen), 10)}})
	}
	var remove []string
	for _, h := range extra {
		if h.Value == "" {
			remove = append(remove, h.Name)
			continue
		}
		set = append(set, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: h.Name, RawValue: []byte(h.Value)}})
	}
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{
				Response: &extprocv3.CommonResponse{
					ClearRouteCache: true,
					HeaderMutation:  &extprocv3.HeaderMutation{SetHeaders: set, RemoveHeaders: remove},
				},
			},
		},
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			DestinationNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				DestinationKey: structpb.NewStringValue(dest),
			}}),
		}},
	}
}

// responseHeadersResponse answers the response headers, setting h on the
// client's response (a Header with an empty Value removes it).
func responseHeadersResponse(h []Header) *extprocv3.ProcessingResponse {
	var set []*corev3.HeaderValueOption
	var remove []string
	for _, x := range h {
		if x.Value == "" {
			remove = append(remove, x.Name)
			continue
		}
		set = append(set, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: x.Name, RawValue: []byte(x.Value)}})
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
		Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: set, RemoveHeaders: remove}},
	}}}
}

func streamed(chunk []byte, eos bool) *extprocv3.BodyResponse {
	return &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
		BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: chunk, EndOfStream: eos},
		}},
	}}
}

func requestBodyResponse(chunk []byte, eos bool) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: streamed(chunk, eos)}}
}

func responseBodyResponse(chunk []byte, eos bool) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: streamed(chunk, eos)}}
}

// The answers that never vary are built once and never modified, so every
// stream may send them: protobuf messages are safe to marshal concurrently
// while nothing mutates them.
var (
	responseHeadersAnswer  = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
	requestTrailersAnswer  = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
	responseTrailersAnswer = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
	// responseBodyAckAnswer lets a response body chunk through unchanged,
	// in body modes other than FULL_DUPLEX_STREAMED.
	responseBodyAckAnswer = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}
)

// sendChunks sends body back to Envoy as streamed_response messages of at
// most MaxChunkBytes, end_of_stream on the last one if eos; an empty body
// is one empty message (GIE v1.5.0's BuildChunkedBodyResponses in
// pkg/common/envoy/chunking.go cuts the same way). gRPC serialises each
// message before Send returns, so body may be reused afterwards.
func sendChunks(st stream, body []byte, eos bool, msg func([]byte, bool) *extprocv3.ProcessingResponse) error {
	for {
		n := min(len(body), MaxChunkBytes)
		last := n == len(body)
		if err := st.Send(msg(body[:n:n], eos && last)); err != nil {
			return err
		}
		if last {
			return nil
		}
		body = body[n:]
	}
}

// immediateResponse ends a request with the error's HTTP status and an
// OpenAI-style JSON error body; a 429 with Retry-After (retryAfter), a
// 405 with its StatusError's Allow.
func immediateResponse(err error) *extprocv3.ProcessingResponse {
	code, typ, errCode := errorStatus(err)
	details := "picker_error"
	if errCode != "" {
		details = "picker_" + errCode
	}
	set := []*corev3.HeaderValueOption{{
		Header: &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/json")},
	}}
	if ra := retryAfter(err, code); ra != "" {
		set = append(set, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "retry-after", RawValue: []byte(ra)}})
	}
	if a := allowOf(err, code); a != "" {
		set = append(set, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "allow", RawValue: []byte(a)}})
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(code)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: set},
			Body:    errorBody(err.Error(), typ, errCode, errorParam(err)),
			Details: details,
		},
	}}
}

// replyResponse sends a Router's own answer (Pick.Reply) to the client.
func replyResponse(r *Reply) *extprocv3.ProcessingResponse {
	im := &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(r.Status)},
		Body:    r.Body,
		Details: "picker_reply",
	}
	if r.ContentType != "" {
		im.Headers = &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
			Header: &corev3.HeaderValue{Key: "content-type", RawValue: []byte(r.ContentType)},
		}}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: im}}
}

// validStatus reports whether status is one Envoy's StatusCode enum
// names (an ImmediateResponse with another fails validation).
func validStatus(status int) bool {
	_, ok := typev3.StatusCode_name[int32(status)]
	return ok && status >= 200 && status <= 599
}

// checkHeaders checks a Pick's Headers (see Pick.Headers).
func checkHeaders(hs []Header) error {
	for _, h := range hs {
		if !validHeaderName(h.Name) {
			return fmt.Errorf("picker: the router set header %q, which is not a header name it may set", h.Name)
		}
		if strings.ContainsAny(h.Value, "\r\n\x00") {
			return fmt.Errorf("picker: the router set header %s to %q, which holds CR, LF or NUL", h.Name, h.Value)
		}
	}
	return nil
}

// validHeaderName reports whether name is an RFC 9110 token that is
// neither a pseudo-header nor host (which Envoy's default mutation rules
// refuse).
func validHeaderName(name string) bool {
	if name == "" || equalFold(name, "host") {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

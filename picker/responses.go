package picker

import (
	"strconv"

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
func requestHeadersResponse(dest string, hasBody bool, bodyLen int) *extprocv3.ProcessingResponse {
	set := make([]*corev3.HeaderValueOption, 1, 2)
	set[0] = &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: DestinationKey, RawValue: []byte(dest)}}
	if hasBody && bodyLen > 0 {
		set = append(set, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{
			Key: "Content-Length", RawValue: strconv.AppendInt(nil, int64(bodyLen), 10)}})
	}
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{
				Response: &extprocv3.CommonResponse{
					ClearRouteCache: true,
					HeaderMutation:  &extprocv3.HeaderMutation{SetHeaders: set},
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
// OpenAI-style JSON error body.
func immediateResponse(err error) *extprocv3.ProcessingResponse {
	code, typ, errCode := errorStatus(err)
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode(code)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
				Header: &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/json")},
			}}},
			Body:    errorBody(err.Error(), typ, errCode),
			Details: "picker_" + errCode,
		},
	}}
}

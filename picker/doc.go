// Package picker serves the gateway's routing as an endpoint picker for
// Envoy: an ext_proc (envoy.service.ext_proc.v3.ExternalProcessor) gRPC
// server that follows the Gateway API Inference Extension's endpoint picker
// protocol (GIE docs/proposals/004-endpoint-picker-protocol; message
// handling after GIE v1.5.0's pkg/epp/handlers). Envoy, configured as in
// docs/picker.md, asks it where each request goes and sends the request to
// that endpoint itself; the picker never proxies.
//
// The routing decision comes from a Router. GatewayRouter is one over a
// *gateway.Gateway, with a key function (BodyKey, or the HTTP gateway's);
// any other can be plugged in.
//
// # Message sequence
//
// For each HTTP request Envoy opens one Process stream and sends, in
// FULL_DUPLEX_STREAMED body mode:
//
//  1. request_headers. With end_of_stream (a request without a body) the
//     picker picks at once with a nil body.
//  2. request_body chunks, which the picker accumulates until one has
//     end_of_stream (or request_trailers arrive), up to
//     Options.MaxBodyBytes (beyond: immediate 413).
//  3. The picker calls Router.Pick and answers with a headers response
//     (clear_route_cache; header x-gateway-destination-endpoint; the same
//     value in dynamic metadata envoy.lb / x-gateway-destination-endpoint;
//     Content-Length set to the body's length when there is a body), then
//     the body unchanged as streamed_response chunks of at most
//     MaxChunkBytes (62,000), end_of_stream on the last, then a trailers
//     response if the request had trailers.
//  4. response_headers: answered unchanged. For a response that is not an
//     event stream (SSE), they are the first token.
//  5. response_body chunks, echoed as streamed_response chunks. The first
//     non-empty chunk of an SSE response is its first token; end_of_stream
//     ends the request (Tracker.Done, with the latency from the request
//     headers to the first token). response_trailers end it too. A
//     Tracker that is a HeadTracker is given the chunks, before Done, up
//     to MaxResponseHead bytes in all or until it has enough.
//
// A stream that ends before the response does (the client went away,
// Envoy could not reach the endpoint) reports Done with an error, so no
// load stays booked. A message out of this order fails the stream with
// InvalidArgument.
//
// # Errors
//
// Router errors become immediate responses: ErrNoEndpoint 503, ErrShed
// 429, ErrBadRequest 400, ErrUnknownModel 404, others 500; a body over
// MaxBodyBytes 413. Bodies are OpenAI error objects, as the HTTP gateway's.
// Every 429 carries Retry-After. A *StatusError chooses the status, type,
// code, param, Retry-After and a 405's Allow itself (the HTTP gateway's
// Router answers exactly as the HTTP gateway does).
//
// # Router answers beyond an endpoint
//
// A Pick's Headers are set on (or, empty, removed from) the request Envoy
// sends upstream, in the same headers response (a disaggregated model's
// x-prefiller-host-port). A Pick's Reply answers the client from the
// picker, as an immediate response, with no endpoint (a model list).
//
// Package pickertest plays Envoy's side of the protocol for tests.
//
// # Subset hint
//
// Filter metadata envoy.lb.subset_hint / x-gateway-destination-endpoint-subset,
// a list of "ip:port" strings or one comma-separated string, restricts the
// pick to those endpoints (PickRequest.Subset). An empty hint, or one none
// of whose endpoints is eligible, gets 503.
//
// # Bounds
//
// A stream still in its request phase Options.RequestTimeout after it
// opened is answered 408; a routed stream with no response headers
// Options.ResponseTimeout after routing ends with DeadlineExceeded (its
// request Done with an error). The streams hold at most
// Options.MaxBufferedBytes together, StreamBytes each and their request
// bodies being read: a body past it is answered 503, a stream opening
// past it ends with RESOURCE_EXHAUSTED. GRPCOptions sets
// MaxConcurrentStreams, keepalive enforcement and the handshake and idle
// deadlines on the *grpc.Server; LimitListener bounds its connections.
// Stats counts them. docs/picker.md ("Security") has the measured figures.
//
// # Health
//
// Register also registers the gRPC health service, SERVING for "" and for
// ServiceName until SetServing(false).
//
// # TLS
//
// The Server is served over whatever transport the *grpc.Server has. For
// TLS, as GIE's own picker serves by default, pass
// grpc.Creds(credentials.NewTLS(TLSConfig(get))) with get a
// KeyPair.GetCertificate (PEM files, re-read by KeyPair.Reload) or one
// returning a SelfSigned certificate. For mutual TLS, so that only the
// holder of a client certificate from given CAs (Envoy) can open streams,
// pass MutualTLSConfig(get, cas, sans) instead, with cas from
// LoadClientCAs (a PEM bundle, re-read by ClientCAs.Reload).
package picker

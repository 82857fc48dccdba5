package keys

import (
	"bytes"
	"fmt"

	"github.com/examlops/gateway/internal/jsonscan"
)

// This file decides which answers a front streams from the engine for a
// client that did not ask for a stream, and rewrites their bodies: the
// HTTP gateway (httpgw/upstream.go) and the picker (picker/upstream.go,
// for the requests picker/fleetpick marks with Pick.Assemble) both do, so
// that they learn a request's first token (the end of its prefill) when
// it comes rather than when the whole answer is generated, and both give
// the client the non-streamed JSON answer assembled from the stream
// (internal/sseagg).

// StreamMembers are the members a streamed-upstream request body ends
// with.
const StreamMembers = `"stream":true,"stream_options":{"include_usage":true}`

// StreamUpstream reports whether the answer of a request of kind, read as
// req from body, may be streamed from the engine and assembled for its
// client: a chat or completions request whose client did not ask for a
// stream. Bodies asking for beam search, best_of or prompt_logprobs, which
// vLLM refuses to stream, are left alone, and so are those whose answer is one token
// (max_tokens or max_completion_tokens 1): its first token is its end, so
// streaming would tell the front nothing sooner and only cost the
// stream's overhead. Bodies asking for several choices (an integer "n"
// above 1) are left alone too, so that the client gets the engine's own
// answer to them: an engine's support for several choices streamed need
// not match its support for them answered whole, and the first token of a
// stream of several choices is the first of only one of them.
func StreamUpstream(kind Endpoint, req *Request, body []byte) bool {
	return req != nil && !req.Stream && req.MaxTokens != 1 && req.N <= 1 &&
		(kind == Chat || kind == Completions) &&
		!bytes.Contains(body, []byte(`"use_beam_search"`)) && !bytes.Contains(body, []byte(`"best_of"`)) &&
		!bytes.Contains(body, []byte(`"prompt_logprobs"`))
}

// StreamBody returns a new body: the JSON object body with StreamMembers
// appended. A body that may name "stream" or "stream_options" has them
// removed first (jsonscan.Rewrite), so that no member is repeated: engines
// reading JSON with Python's json module (or Go's encoding/json) would
// take the last, but stricter readers (serde's derived structs) refuse
// repeated fields. One spelled with escapes ("\u0073tream") stays, and
// the last member counts. Only a body naming them is read whole: another
// one, which the front has parsed, is copied with StreamMembers before its
// closing brace. The error, for a body that is not one JSON
// object, wraps jsonscan.ErrSyntax (not reached for a body Parse
// accepted). body is not modified.
func StreamBody(body []byte) ([]byte, error) {
	b := bytes.TrimSpace(body)
	if len(b) < 2 || b[0] != '{' || b[len(b)-1] != '}' {
		return nil, fmt.Errorf("%w: the body is not a JSON object", jsonscan.ErrSyntax)
	}
	if bytes.Contains(b, []byte(`"stream`)) {
		return jsonscan.Rewrite(b, func(name []byte) bool { return string(name) == "stream" || string(name) == "stream_options" }, StreamMembers)
	}
	out := make([]byte, 0, len(b)+len(StreamMembers)+1)
	out = append(out, b[:len(b)-1]...)
	if len(bytes.TrimSpace(b[1:len(b)-1])) > 0 {
		out = append(out, ',')
	}
	out = append(out, StreamMembers...)
	return append(out, '}'), nil
}

package httpgw

import (
	"errors"
	"fmt"

	"github.com/examlops/gateway/internal/jsonscan"
)

// This file rewrites request bodies for prefill/decode disaggregation,
// following vLLM's NixlConnector protocol as llm-d's pd-sidecar v0.7.1
// drives it (pkg/sidecar/proxy/connector_nixlv2.go, runNIXLProtocolV2):
//
//   - the prefill request is the client's body with "stream": false, no
//     "stream_options", "max_tokens" and "max_completion_tokens" 1, and
//     "kv_transfer_params" asking for a remote decode; and, unlike the
//     sidecar's, no "min_tokens", which vLLM refuses above max_tokens
//     (SamplingParams._verify_args): a request with min_tokens 2 or more
//     would get 400 split and its answer co-located;
//   - the decode request is the client's body (streamed or not, its
//     limits untouched) with the prefill answer's "kv_transfer_params".
//
// Unlike the sidecar, which decodes the body into a map and encodes it
// again, the rewrite works on the top-level members' text: every member
// it does not replace is kept byte for byte and in order, so numbers keep
// their precision and the engine reads what the client wrote. Members it
// replaces are removed wherever they occur (a repeated member included)
// and the new ones appended at the end.

// Member names of the NIXL protocol.
const (
	fieldKVTransferParams    = "kv_transfer_params"
	fieldStreamName          = "stream"
	fieldStreamOptions       = "stream_options"
	fieldMaxTokens           = "max_tokens"
	fieldMaxCompletionTokens = "max_completion_tokens"
	fieldMinTokens           = "min_tokens"
)

// prefillTail is what the prefill request ends with, after the client's
// other members: the members the sidecar sets, in JSON.
const prefillTail = `"stream":false,"max_tokens":1,"max_completion_tokens":1,` +
	`"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,` +
	`"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`

// errPDBody marks a body or answer the P/D rewrite cannot use.
var errPDBody = errors.New("not a JSON object")

// topMembers returns the members of the JSON object b, which must be the
// whole document.
func topMembers(b []byte) ([]jsonscan.Member, error) {
	ms, err := jsonscan.Members(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errPDBody, err)
	}
	return ms, nil
}

// rewrite returns the object b without the members named in drop, with
// tail (members in JSON, without braces) appended (jsonscan.Rewrite).
func rewrite(b []byte, drop func(name []byte) bool, tail string) ([]byte, error) {
	out, err := jsonscan.Rewrite(b, drop, tail)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errPDBody, err)
	}
	return out, nil
}

// prefillBody returns the prefill request for a client body.
func prefillBody(body []byte) ([]byte, error) {
	return rewrite(body, func(name []byte) bool {
		switch string(name) {
		case fieldStreamName, fieldStreamOptions, fieldMaxTokens, fieldMaxCompletionTokens, fieldMinTokens, fieldKVTransferParams:
			return true
		}
		return false
	}, prefillTail)
}

// decodeBody returns the decode request for a client body, given the
// prefill answer's kv_transfer_params (a JSON object).
func decodeBody(body, kvParams []byte) ([]byte, error) {
	return rewrite(body, func(name []byte) bool { return string(name) == fieldKVTransferParams },
		`"`+fieldKVTransferParams+`":`+string(kvParams))
}

// answerKVParams returns the kv_transfer_params object of a prefill
// answer (the last one, if repeated). ok is false when the answer is not
// a JSON object or has no such member that is an object.
func answerKVParams(answer []byte) (kv []byte, ok bool) {
	ms, err := topMembers(answer)
	if err != nil {
		return nil, false
	}
	for i := len(ms) - 1; i >= 0; i-- {
		if ms[i].Name == fieldKVTransferParams {
			if len(ms[i].Raw) > 0 && ms[i].Raw[0] == '{' {
				return ms[i].Raw, true
			}
			return nil, false
		}
	}
	return nil, false
}

package httpgw

import (
	"net/http"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/keys"
)

// Header names the gateway reads to build a request's prefix key, as the
// picker reads them (keys.HeaderSessionID, keys.HeaderRAGContext).
const (
	// HeaderSessionID names the conversation a request belongs to. It
	// takes precedence over the body's "user" field.
	HeaderSessionID = keys.HeaderSessionID
	// HeaderRAGContext names the retrieved context a prompt embeds.
	HeaderRAGContext = keys.HeaderRAGContext
)

// appendKey appends the prefix key of req to dst (keys.Request.AppendKey),
// its session and RAG context read from hdr.
func appendKey(h *keys.Hasher, dst gateway.Key, req *inferenceRequest, hdr http.Header) gateway.Key {
	return req.AppendKey(h, dst, hdr.Get(HeaderSessionID), hdr.Get(HeaderRAGContext))
}

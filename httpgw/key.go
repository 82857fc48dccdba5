package httpgw

import (
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

package httpgw

import (
	"net/http"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/internal/fronttest"
	"github.com/examlops/gateway/keys"
)

// Names the tests use for what moved to internal/front (shared with the
// endpoint picker's Router) and internal/fronttest.
type (
	apiError      = front.APIError
	errorBody     = front.ErrorBody
	wordTokenizer = fronttest.WordTokenizer
	// The control plane's (package fleet).
	Stats          = fleet.Stats
	EngineStats    = fleet.EngineStats
	EngineLoad     = fleet.EngineLoad
	EngineAdapters = fleet.EngineAdapters
)

var (
	wordTokens  = fronttest.WordTokens
	eventFrames = fronttest.EventFrames
	storedEvent = fronttest.StoredEvent
	freeTCP     = fronttest.FreeTCP
	words       = fronttest.Words
	chatBody    = fronttest.ChatBody
)

const (
	endpointChat        = keys.Chat
	endpointCompletions = keys.Completions
	endpointResponses   = keys.Responses
)

type endpointKind = keys.Endpoint

// parseRequest is front.Parse.
func parseRequest(kind keys.Endpoint, body []byte) (*keys.Request, error) {
	return front.Parse(kind, body)
}

// appendKey appends req's approximate key, its session and RAG context
// read from hdr, as both fronts key it (front.Keyer).
func appendKey(h *keys.Hasher, dst gateway.Key, req *keys.Request, hdr http.Header) gateway.Key {
	return req.AppendKey(h, dst, hdr.Get(HeaderSessionID), hdr.Get(HeaderRAGContext))
}

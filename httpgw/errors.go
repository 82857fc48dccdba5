package httpgw

import (
	"errors"

	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/front"
)

// Sentinel errors of the HTTP gateway. Errors are wrapped with context, so
// test them with errors.Is; messages start with "gateway:".
var (
	// ErrBadRequest reports a request body that is not a valid OpenAI
	// request: malformed JSON or a missing field.
	ErrBadRequest = front.ErrBadRequest
	// ErrBodyTooLarge reports a request body over Options.MaxBodyBytes.
	ErrBodyTooLarge = errors.New("gateway: request body too large")
	// ErrModelNotFound reports a request for a model the configuration
	// does not name.
	ErrModelNotFound = fleet.ErrModelNotFound
	// ErrNoReplicas reports a configured model without replicas.
	ErrNoReplicas = front.ErrNoReplicas
	// ErrUpstream reports an engine that failed before sending a response.
	ErrUpstream = errors.New("gateway: upstream failure")
	// ErrInvalidOptions reports an Options field out of range.
	ErrInvalidOptions = errors.New("gateway: invalid options")
)

package httpgw

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/examlops/gateway/fleet"
)

// Sentinel errors of the HTTP gateway. Errors are wrapped with context, so
// test them with errors.Is; messages start with "gateway:".
var (
	// ErrBadRequest reports a request body that is not a valid OpenAI
	// request: malformed JSON or a missing field.
	ErrBadRequest = errors.New("gateway: bad request")
	// ErrBodyTooLarge reports a request body over Options.MaxBodyBytes.
	ErrBodyTooLarge = errors.New("gateway: request body too large")
	// ErrModelNotFound reports a request for a model the configuration
	// does not name.
	ErrModelNotFound = fleet.ErrModelNotFound
	// ErrNoReplicas reports a configured model without replicas.
	ErrNoReplicas = errors.New("gateway: model has no replicas")
	// ErrUpstream reports an engine that failed before sending a response.
	ErrUpstream = errors.New("gateway: upstream failure")
	// ErrInvalidOptions reports an Options field out of range.
	ErrInvalidOptions = errors.New("gateway: invalid options")
)

// apiError is the OpenAI error object.
type apiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// errorBody is the OpenAI error response: {"error": {...}}.
type errorBody struct {
	Error apiError `json:"error"`
}

// Error types and codes used in responses.
const (
	typeInvalidRequest = "invalid_request_error"
	typeNotFound       = "not_found_error"
	typeServer         = "server_error"
	typeUnavailable    = "service_unavailable_error"
)

// writeError writes an OpenAI-style JSON error.
func writeError(w http.ResponseWriter, status int, typ, code, param, msg string) {
	e := apiError{Message: msg, Type: typ}
	if code != "" {
		e.Code = &code
	}
	if param != "" {
		e.Param = &param
	}
	b, _ := json.Marshal(errorBody{Error: e})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// streamErrorEvent is the SSE event that ends a stream whose upstream
// failed mid-way.
func streamErrorEvent(msg string) []byte {
	code := "upstream_error"
	b, _ := json.Marshal(errorBody{Error: apiError{Message: msg, Type: typeServer, Code: &code}})
	out := make([]byte, 0, len(b)+16)
	out = append(out, "data: "...)
	out = append(out, b...)
	out = append(out, "\n\n"...)
	return out
}

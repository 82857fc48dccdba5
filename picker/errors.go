package picker

import (
	"encoding/json"
	"errors"
	"net/http"
)

// Sentinel errors. A Router's errors wrap one of the first four to choose
// the status of the immediate response the client gets; the server's own
// errors wrap them too. Test with errors.Is; messages start with "picker:".
var (
	// ErrNoEndpoint: no endpoint is eligible for the request (none
	// healthy, or none in the subset hint). Answered with 503.
	ErrNoEndpoint = errors.New("picker: no eligible endpoint")
	// ErrShed: the request is refused to shed load. Answered with 429.
	ErrShed = errors.New("picker: request shed")
	// ErrBadRequest: the request is malformed (its body, a header).
	// Answered with 400.
	ErrBadRequest = errors.New("picker: bad request")
	// ErrUnknownModel: the request names a model the Router does not
	// serve. Answered with 404.
	ErrUnknownModel = errors.New("picker: unknown model")
	// ErrBodyTooLarge: the request body exceeds Options.MaxBodyBytes.
	// Answered with 413.
	ErrBodyTooLarge = errors.New("picker: request body too large")
	// ErrInvalidOptions: an Options field is out of range (New).
	ErrInvalidOptions = errors.New("picker: invalid options")
)

// errorStatus maps an error to the HTTP status of its immediate response
// and the OpenAI error type and code of its body.
func errorStatus(err error) (status int, typ, code string) {
	switch {
	case errors.Is(err, ErrNoEndpoint):
		return http.StatusServiceUnavailable, "service_unavailable_error", "no_eligible_endpoint"
	case errors.Is(err, ErrShed):
		return http.StatusTooManyRequests, "rate_limit_error", "shed"
	case errors.Is(err, ErrBadRequest):
		return http.StatusBadRequest, "invalid_request_error", "bad_request"
	case errors.Is(err, ErrUnknownModel):
		return http.StatusNotFound, "not_found_error", "model_not_found"
	case errors.Is(err, ErrBodyTooLarge):
		return http.StatusRequestEntityTooLarge, "invalid_request_error", "body_too_large"
	}
	return http.StatusInternalServerError, "server_error", "picker_error"
}

// errorBody is the OpenAI error object the HTTP gateway answers with, so
// clients see one format whichever way they came in.
func errorBody(msg, typ, code string) []byte {
	type apiError struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	}
	b, err := json.Marshal(struct {
		Error apiError `json:"error"`
	}{apiError{Message: msg, Type: typ, Code: code}})
	if err != nil { // not reached: every field is a string
		return []byte(`{"error":{"message":"picker: error","type":"server_error","param":null,"code":"picker_error"}}`)
	}
	return b
}

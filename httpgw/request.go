package httpgw

import (
	"errors"
	"fmt"

	"github.com/examlops/gateway/keys"
)

// This file reads the routing fields of an OpenAI request body with the
// reader both fronts share (keys.Parse); the body itself is forwarded byte
// for byte.

// inferenceRequest is the part of an OpenAI request the gateway reads
// (keys.Parse); chatMessage one of its messages.
type (
	inferenceRequest = keys.Request
	chatMessage      = keys.Message
)

// endpointKind says which inference endpoint a request came to.
type endpointKind = keys.Endpoint

const (
	endpointChat        = keys.Chat
	endpointCompletions = keys.Completions
	endpointResponses   = keys.Responses
)

// parseRequest reads body with the one OpenAI-body reader both fronts use
// (keys.Parse). Its errors wrap ErrBadRequest; those about one field are
// *requestError naming it.
func parseRequest(kind endpointKind, body []byte) (*inferenceRequest, error) {
	req, err := keys.Parse(kind, body)
	if err != nil {
		var fe *keys.FieldError
		if errors.As(err, &fe) {
			return nil, fieldErr(fe.Field, fe.Msg)
		}
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	return req, nil
}

// decodeRequest reads the routing fields of body without the endpoint's
// checks (keys.Decode), its errors as parseRequest's.
func decodeRequest(body []byte) (*inferenceRequest, error) {
	req, err := keys.Decode(body)
	if err != nil {
		var fe *keys.FieldError
		if errors.As(err, &fe) {
			return nil, fieldErr(fe.Field, fe.Msg)
		}
		return nil, err
	}
	return req, nil
}

// requestError is a bad-request error that names the offending field.
type requestError struct {
	field string
	err   error
}

func (e *requestError) Error() string { return e.err.Error() }
func (e *requestError) Unwrap() error { return e.err }

func fieldErr(field, msg string) error {
	return &requestError{field: field, err: fmt.Errorf("%w: %s", ErrBadRequest, msg)}
}

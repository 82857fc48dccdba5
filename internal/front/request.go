package front

import (
	"errors"
	"fmt"

	"github.com/examlops/gateway/keys"
)

// ErrBadRequest reports a request body that is not a valid OpenAI
// request: malformed JSON or a missing field (httpgw.ErrBadRequest).
var ErrBadRequest = errors.New("gateway: bad request")

// ErrNoReplicas reports a configured model without replicas
// (httpgw.ErrNoReplicas).
var ErrNoReplicas = errors.New("gateway: model has no replicas")

// Parse reads the routing fields of body with the one OpenAI-body reader
// both fronts use (keys.Parse); the body itself is forwarded byte for
// byte. Its errors wrap ErrBadRequest; those about one field are
// *RequestError naming it.
func Parse(kind keys.Endpoint, body []byte) (*keys.Request, error) {
	req, err := keys.Parse(kind, body)
	if err != nil {
		var fe *keys.FieldError
		if errors.As(err, &fe) {
			return nil, FieldError(fe.Field, fe.Msg)
		}
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	return req, nil
}

// Decode reads the routing fields of body without the endpoint's checks
// (keys.Decode), its errors as Parse's.
func Decode(body []byte) (*keys.Request, error) {
	return fieldErrors(keys.Decode(body))
}

// DecodeEmbeddings is Decode for a pass-through body (embeddings,
// tokenize, detokenize), whose "input" is an embeddings input
// (keys.DecodeEmbeddings).
func DecodeEmbeddings(body []byte) (*keys.Request, error) {
	return fieldErrors(keys.DecodeEmbeddings(body))
}

// fieldErrors returns a decoder's result with a *keys.FieldError turned
// into the *RequestError naming its field.
func fieldErrors(req *keys.Request, err error) (*keys.Request, error) {
	var fe *keys.FieldError
	switch {
	case err == nil:
		return req, nil
	case errors.As(err, &fe):
		return nil, FieldError(fe.Field, fe.Msg)
	}
	return nil, err
}

// RequestError is a bad-request error that names the offending field.
type RequestError struct {
	Field string
	err   error
}

func (e *RequestError) Error() string { return e.err.Error() }
func (e *RequestError) Unwrap() error { return e.err }

// FieldError returns a *RequestError about field, wrapping ErrBadRequest.
func FieldError(field, msg string) error {
	return &RequestError{Field: field, err: fmt.Errorf("%w: %s", ErrBadRequest, msg)}
}

// Param is the OpenAI error's param of a Parse or Decode error: the field
// a *RequestError names, "" otherwise.
func Param(err error) string {
	var re *RequestError
	if errors.As(err, &re) {
		return re.Field
	}
	return ""
}

package picker

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/examlops/gateway/internal/front"
)

// Sentinel errors. A Router's errors wrap one of the first four to choose
// the status of the immediate response the client gets; the server's own
// errors wrap them too. Test with errors.Is; messages start with "picker:".
var (
	// ErrNoEndpoint: no endpoint is eligible for the request (none
	// healthy, or none in the subset hint). Answered with 503.
	ErrNoEndpoint = errors.New("picker: no eligible endpoint")
	// ErrShed: the request is refused to shed load. Answered with 429
	// and Retry-After (1 s unless a StatusError says).
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
	// ErrOverloaded: the request body would take the memory held by all
	// streams past Options.MaxBufferedBytes. Answered with 503.
	ErrOverloaded = errors.New("picker: overloaded")
	// ErrRequestTimeout: the stream's request phase outlasted
	// Options.RequestTimeout. Answered with 408.
	ErrRequestTimeout = errors.New("picker: request timeout")
	// ErrInvalidOptions: an Options field is out of range (New).
	ErrInvalidOptions = errors.New("picker: invalid options")
)

// StatusError is a Router error that chooses its immediate response
// itself: the HTTP status and the OpenAI error object's type, code and
// param, so that a Router fronting an HTTP service can answer as that
// service does. Its message is Err's. The sentinels above still match
// through Err (errors.Is), but the response follows the StatusError.
type StatusError struct {
	// Status is the HTTP status, 400 to 599; another is answered with 500.
	Status int
	// Type and Code are the OpenAI error type and code ("" omits the
	// code); Param names the request field at fault ("" for none).
	Type, Code, Param string
	// Err is the error; its text is the response's message. Required.
	Err error
	// RetryAfter is the Retry-After a 429 carries, rounded up to whole
	// seconds: the fleetpick Router's is one scrape interval, as the HTTP
	// gateway answers (front.RetryAfter). Zero: 1 s. Another status
	// carries Retry-After only when it is positive.
	RetryAfter time.Duration
	// Allow, for a 405, is the Allow header: the methods the path
	// accepts ("POST"), which a 405 must carry (RFC 9110). "" sends none.
	Allow string
}

func (e *StatusError) Error() string {
	if e.Err == nil {
		return "picker: error with status " + http.StatusText(e.Status)
	}
	return e.Err.Error()
}

func (e *StatusError) Unwrap() error { return e.Err }

// errorStatus maps an error to the HTTP status of its immediate response
// and the OpenAI error type and code of its body.
func errorStatus(err error) (status int, typ, code string) {
	var se *StatusError
	if errors.As(err, &se) && se.Status >= 400 && se.Status <= 599 && validStatus(se.Status) {
		return se.Status, se.Type, se.Code
	}
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
	case errors.Is(err, ErrOverloaded):
		return http.StatusServiceUnavailable, "service_unavailable_error", "overloaded"
	case errors.Is(err, ErrRequestTimeout):
		return http.StatusRequestTimeout, "invalid_request_error", "request_timeout"
	}
	return http.StatusInternalServerError, "server_error", "picker_error"
}

// retryAfter is the Retry-After header of the immediate response of err
// with status: "" for none. Every 429 has one, and so has a 503 for a
// full stream budget (ErrOverloaded), as the gateway's 503 for a full
// assembly budget: its memory frees as streams end.
func retryAfter(err error, status int) string {
	var d time.Duration
	var se *StatusError
	if errors.As(err, &se) {
		d = se.RetryAfter
	}
	if d <= 0 && status != http.StatusTooManyRequests && !errors.Is(err, ErrOverloaded) {
		return ""
	}
	return front.RetryAfter(d)
}

// allowOf is the Allow header of the immediate response of err with
// status, "" for none: a StatusError's, for a 405.
func allowOf(err error, status int) string {
	var se *StatusError
	if status == http.StatusMethodNotAllowed && errors.As(err, &se) && !strings.ContainsAny(se.Allow, "\r\n\x00") {
		return se.Allow
	}
	return ""
}

// errorParam is the request field a StatusError names, "" if none.
func errorParam(err error) string {
	var se *StatusError
	if errors.As(err, &se) {
		return se.Param
	}
	return ""
}

// errorBody is the OpenAI error object the HTTP gateway answers with, so
// clients see one format whichever way they came in. Empty code and param
// are null.
func errorBody(msg, typ, code, param string) []byte {
	type apiError struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}
	e := apiError{Message: msg, Type: typ}
	if code != "" {
		e.Code = &code
	}
	if param != "" {
		e.Param = &param
	}
	b, err := json.Marshal(struct {
		Error apiError `json:"error"`
	}{e})
	if err != nil { // not reached: every field is a string
		return []byte(`{"error":{"message":"picker: error","type":"server_error","param":null,"code":"picker_error"}}`)
	}
	return b
}

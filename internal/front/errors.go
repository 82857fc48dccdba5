package front

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// APIError is the OpenAI error object.
type APIError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// ErrorBody is the OpenAI error response: {"error": {...}}.
type ErrorBody struct {
	Error APIError `json:"error"`
}

// Error types of the fronts' answers.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeNotFound       = "not_found_error"
	TypeServer         = "server_error"
	TypeUnavailable    = "service_unavailable_error"
	TypeRateLimit      = "rate_limit_error"
)

// WriteError writes an OpenAI-style JSON error; code and param are left
// null when "".
func WriteError(w http.ResponseWriter, status int, typ, code, param, msg string) {
	e := APIError{Message: msg, Type: typ}
	if code != "" {
		e.Code = &code
	}
	if param != "" {
		e.Param = &param
	}
	b, _ := json.Marshal(ErrorBody{Error: e})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// StreamErrorEvent is the SSE event that ends a stream whose upstream
// failed mid-way.
func StreamErrorEvent(msg string) []byte {
	code := "upstream_error"
	b, _ := json.Marshal(ErrorBody{Error: APIError{Message: msg, Type: TypeServer, Code: &code}})
	out := make([]byte, 0, len(b)+16)
	out = append(out, "data: "...)
	out = append(out, b...)
	out = append(out, "\n\n"...)
	return out
}

// WriteJSON writes v as indented JSON (a 500 OpenAI error if it cannot be
// encoded).
func WriteJSON(w http.ResponseWriter, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		WriteError(w, http.StatusInternalServerError, TypeServer, "encode_error", "", "gateway: encode response: "+err.Error())
		return
	}
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b)
}

// RetryAfter is the Retry-After (in seconds) of a front's 429: wait
// rounded up to a second, at least 1. Shed by admission control, refused
// by flow control or for a latency objective no replica is predicted to
// meet, the wait is one scrape interval (fleet.Options.ScrapeInterval),
// when the load the request was refused for is next read; over its
// client's rate, the wait until one would be admitted.
func RetryAfter(wait time.Duration) string {
	return strconv.Itoa(max(1, int((wait+time.Second-1)/time.Second)))
}

package fleetpick

import (
	"errors"
	"net/http"
	"net/url"

	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/picker"
)

// models answers GET /v1/models with the HTTP gateway's own answer
// (front.ServeModels), which the picker sends the client
// (picker.Pick.Reply); another method gets its 405, with Allow.
func (r *Router) models(req *picker.PickRequest) (picker.Pick, error) {
	w := &replyWriter{h: http.Header{}}
	hr := &http.Request{Method: req.Method, URL: &url.URL{Path: "/v1/models"}, Header: http.Header{}, Host: req.Authority}
	front.ServeModels(w, hr, r.fl, r.metrics)
	if w.code == 0 {
		w.code = http.StatusOK
	}
	if w.code == http.StatusMethodNotAllowed {
		// An immediate response with its Allow header (counted above).
		return picker.Pick{}, &picker.StatusError{Status: w.code, Type: front.TypeInvalidRequest, Code: "method_not_allowed",
			Allow: w.h.Get("Allow"), Err: errors.New("gateway: /v1/models accepts GET only")}
	}
	if req.Method == http.MethodHead {
		w.body = nil
	}
	return picker.Pick{Reply: &picker.Reply{Status: w.code, ContentType: w.h.Get("Content-Type"), Body: w.body}}, nil
}

// replyWriter is an http.ResponseWriter that keeps the answer.
type replyWriter struct {
	h    http.Header
	code int
	body []byte
}

func (w *replyWriter) Header() http.Header { return w.h }
func (w *replyWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}
func (w *replyWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	w.body = append(w.body, b...)
	return len(b), nil
}

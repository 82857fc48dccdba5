package picker

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/keys"
)

// Headers BodyKey reads, as the HTTP gateway reads them.
const (
	HeaderSessionID  = "X-Session-ID"
	HeaderRAGContext = "X-RAG-Context"
)

// BodyKey returns a KeyFunc for OpenAI chat and completions bodies. It is
// the picker's own, small key builder, for tests and for using the picker
// before it shares the HTTP gateway's (package httpgw builds its keys in
// one pass without encoding/json, and reads more content forms).
//
// The body must be a JSON object with a non-empty string "model", which,
// if models are given, must be one of them (else ErrUnknownModel). The key
// is, in order: the system (and developer) messages, the session (header
// X-Session-ID, else the body's "user"), header X-RAG-Context, then the
// other messages, each in its role (keys.Segment), or the completions
// "prompt"; with one system message, no conversation and a blockSize of
// keys.TextBlockBytes, that is keys.PrefixKey's key. A message's
// content is its text when it is a string, else its JSON. A request with
// no body gets a one-block key naming its method and path; a body with no
// text, one naming the model.
func BodyKey(blockSize int, models ...string) (KeyFunc, error) {
	h, err := keys.NewHasher(blockSize)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidOptions, err)
	}
	served := map[string]bool{}
	for _, m := range models {
		served[m] = true
	}
	return func(dst gateway.Key, req *PickRequest) (gateway.Key, error) {
		if req.Body == nil {
			return h.AppendSegment(dst, keys.SegmentOther, "\x00"+req.Method+" "+req.Path), nil
		}
		var b struct {
			Model    *string `json:"model"`
			User     string  `json:"user"`
			Messages []struct {
				Role    string          `json:"role"`
				Content json.RawMessage `json:"content"`
			} `json:"messages"`
			Prompt json.RawMessage `json:"prompt"`
		}
		if err := json.Unmarshal(req.Body, &b); err != nil {
			return dst, fmt.Errorf("%w: body is not a valid JSON request: %v", ErrBadRequest, err)
		}
		switch {
		case b.Model == nil:
			return dst, fmt.Errorf("%w: field \"model\" is required", ErrBadRequest)
		case *b.Model == "":
			return dst, fmt.Errorf("%w: field \"model\" is empty", ErrBadRequest)
		case len(served) > 0 && !served[*b.Model]:
			return dst, fmt.Errorf("%w: model %q is not served (models: %s)", ErrUnknownModel, *b.Model, strings.Join(models, ", "))
		}
		var sys strings.Builder
		for _, m := range b.Messages {
			if m.Role == "system" || m.Role == "developer" {
				sys.WriteString(contentText(m.Content))
			}
		}
		session := req.Header.Get(HeaderSessionID)
		if session == "" {
			session = b.User
		}
		start := len(dst)
		dst = h.AppendSegment(dst, keys.SegmentSystem, sys.String())
		dst = h.AppendSegment(dst, keys.SegmentSession, session)
		dst = h.AppendSegment(dst, keys.SegmentRAG, req.Header.Get(HeaderRAGContext))
		for _, m := range b.Messages {
			role := keys.SegmentOther
			switch m.Role {
			case "system", "developer":
				continue
			case "user":
				role = keys.SegmentUser
			case "assistant":
				role = keys.SegmentAssistant
			case "tool", "function":
				role = keys.SegmentTool
			}
			dst = h.AppendSegment(dst, role, contentText(m.Content))
		}
		if len(b.Prompt) > 0 {
			dst = h.AppendSegment(dst, keys.SegmentPrompt, contentText(b.Prompt))
		}
		if len(dst) == start {
			dst = h.AppendSegment(dst, keys.SegmentOther, "\x00"+*b.Model)
		}
		return dst, nil
	}, nil
}

// contentText is a JSON string's text, or else the raw JSON.
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}

package picker

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/examlops/gateway"
)

// Segment tags of BodyKey, so that the same text in two roles hashes
// differently.
const (
	tagUser      uint64 = 0x7069_0001_7573_6572
	tagAssistant uint64 = 0x7069_0002_6173_7374
	tagOther     uint64 = 0x7069_0003_6f74_6872
	tagPrompt    uint64 = 0x7069_0004_7072_6d74
	tagModel     uint64 = 0x7069_0005_6d6f_646c
	tagPath      uint64 = 0x7069_0006_7061_7468
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
// other messages, each tagged by role, or the completions "prompt". A
// message's content is its text when it is a string, else its JSON. A
// request with no body gets a one-block key naming its method and path; a
// body with no text, one naming the model.
func BodyKey(blockSize int, models ...string) (KeyFunc, error) {
	h, err := gateway.NewHasher(blockSize)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidOptions, err)
	}
	served := map[string]bool{}
	for _, m := range models {
		served[m] = true
	}
	return func(dst gateway.Key, req *PickRequest) (gateway.Key, error) {
		if req.Body == nil {
			return h.AppendSegment(dst, tagPath, req.Method+" "+req.Path), nil
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
		dst = h.AppendKey(dst, sys.String(), session, req.Header.Get(HeaderRAGContext))
		for _, m := range b.Messages {
			tag := tagOther
			switch m.Role {
			case "system", "developer":
				continue
			case "user":
				tag = tagUser
			case "assistant":
				tag = tagAssistant
			}
			dst = h.AppendSegment(dst, tag, contentText(m.Content))
		}
		if len(b.Prompt) > 0 {
			dst = h.AppendSegment(dst, tagPrompt, contentText(b.Prompt))
		}
		if len(dst) == start {
			dst = h.AppendSegment(dst, tagModel, *b.Model)
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

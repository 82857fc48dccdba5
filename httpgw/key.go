package httpgw

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/examlops/gateway"
)

// Header names the gateway reads to build a request's prefix key.
const (
	// HeaderSessionID names the conversation a request belongs to. It
	// takes precedence over the body's "user" field.
	HeaderSessionID = "X-Session-ID"
	// HeaderRAGContext names the retrieved context (a document set, a
	// corpus version, a hash of the retrieved passages) that the prompt
	// embeds, so that requests over the same context share a prefix.
	HeaderRAGContext = "X-RAG-Context"
)

// Segment tags, one per kind of segment, so that the same text in two
// roles hashes differently (see gateway.Hasher.AppendSegment).
const (
	tagSystem    uint64 = 0x6777_0001_7379_7374 // "sys"
	tagSession   uint64 = 0x6777_0002_7365_7373 // "sess"
	tagRAG       uint64 = 0x6777_0003_7261_6700 // "rag"
	tagUser      uint64 = 0x6777_0004_7573_6572 // "user"
	tagAssistant uint64 = 0x6777_0005_6173_7374 // "asst"
	tagTool      uint64 = 0x6777_0006_746f_6f6c // "tool"
	tagOther     uint64 = 0x6777_0007_6f74_6872 // other roles
	tagPrompt    uint64 = 0x6777_0008_7072_6d74 // completions prompt
	tagModel     uint64 = 0x6777_0009_6d6f_646c // fallback for an empty prompt
)

// inferenceRequest is the part of an OpenAI chat or completions request
// the gateway reads. Every other field passes through untouched.
type inferenceRequest struct {
	Model    *string         `json:"model"`
	Messages []chatMessage   `json:"messages"`
	Prompt   json.RawMessage `json:"prompt"`
	User     string          `json:"user"`
	Stream   bool            `json:"stream"`
}

// chatMessage is one message of a chat request; Content is kept raw and
// read by messageText.
type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// contentPart is one element of an array-valued message content.
type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// endpointKind says which inference endpoint a request came to.
type endpointKind int

const (
	endpointChat endpointKind = iota
	endpointCompletions
)

func (k endpointKind) String() string {
	if k == endpointCompletions {
		return "completions"
	}
	return "chat"
}

// parseRequest decodes body and checks the fields the endpoint needs. Its
// errors wrap ErrBadRequest and name the field.
func parseRequest(kind endpointKind, body []byte) (*inferenceRequest, error) {
	var req inferenceRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, fmt.Errorf("%w: body is not a valid JSON request: %v", ErrBadRequest, err)
	}
	switch {
	case req.Model == nil:
		return nil, &requestError{field: "model", err: fmt.Errorf("%w: field \"model\" is required", ErrBadRequest)}
	case *req.Model == "":
		return nil, &requestError{field: "model", err: fmt.Errorf("%w: field \"model\" is empty", ErrBadRequest)}
	}
	switch kind {
	case endpointChat:
		if len(req.Messages) == 0 {
			return nil, &requestError{field: "messages", err: fmt.Errorf("%w: field \"messages\" is required and must not be empty", ErrBadRequest)}
		}
	case endpointCompletions:
		if len(req.Prompt) == 0 || bytes.Equal(req.Prompt, []byte("null")) {
			return nil, &requestError{field: "prompt", err: fmt.Errorf("%w: field \"prompt\" is required", ErrBadRequest)}
		}
	}
	return &req, nil
}

// requestError is a bad-request error that names the offending field.
type requestError struct {
	field string
	err   error
}

func (e *requestError) Error() string { return e.err.Error() }
func (e *requestError) Unwrap() error { return e.err }

// session returns the request's session id: the X-Session-ID header, else
// the body's "user" field.
func session(req *inferenceRequest, h http.Header) string {
	if s := h.Get(HeaderSessionID); s != "" {
		return s
	}
	return req.User
}

// appendKey appends the prefix key of req to dst: system messages in
// order, then the session, then the RAG context header, then the rest of
// the conversation (or the completions prompt) in order. Each part is its
// own segment with its own tag. A request with none of these (an empty
// prompt) gets a one-block key naming the model, so that it can still be
// routed.
func appendKey(h *gateway.Hasher, dst gateway.Key, req *inferenceRequest, hdr http.Header) gateway.Key {
	start := len(dst)
	for i := range req.Messages {
		if m := &req.Messages[i]; isSystemRole(m.Role) {
			dst = h.AppendSegment(dst, tagSystem, messageText(m.Content))
		}
	}
	dst = h.AppendSegment(dst, tagSession, session(req, hdr))
	dst = h.AppendSegment(dst, tagRAG, hdr.Get(HeaderRAGContext))
	for i := range req.Messages {
		m := &req.Messages[i]
		if isSystemRole(m.Role) {
			continue
		}
		dst = h.AppendSegment(dst, roleTag(m.Role), messageText(m.Content))
	}
	if len(req.Prompt) > 0 {
		dst = h.AppendSegment(dst, tagPrompt, promptText(req.Prompt))
	}
	if len(dst) == start && req.Model != nil {
		dst = h.AppendSegment(dst, tagModel, "\x00"+*req.Model)
	}
	return dst
}

// isSystemRole reports whether a message role carries instructions that
// open the prompt: "system" or OpenAI's newer "developer".
func isSystemRole(role string) bool { return role == "system" || role == "developer" }

func roleTag(role string) uint64 {
	switch role {
	case "user":
		return tagUser
	case "assistant":
		return tagAssistant
	case "tool", "function":
		return tagTool
	}
	return tagOther
}

// messageText returns the text of a message content: a JSON string as is,
// an array of parts as the concatenation of its text parts (other parts,
// such as images, contribute their raw JSON so that different images give
// different keys), anything else as its raw JSON.
func messageText(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return ""
	}
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s
		}
	case '[':
		var parts []json.RawMessage
		if json.Unmarshal(raw, &parts) == nil {
			var b strings.Builder
			for _, p := range parts {
				var cp contentPart
				if json.Unmarshal(p, &cp) == nil && cp.Type == "text" {
					b.WriteString(cp.Text)
				} else {
					b.Write(p)
				}
			}
			return b.String()
		}
	}
	return string(raw)
}

// promptText returns the text of a completions prompt: a string as is, an
// array of strings joined with newlines, token arrays as their JSON text.
func promptText(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s
		}
	}
	if len(raw) > 0 && raw[0] == '[' {
		var ss []string
		if json.Unmarshal(raw, &ss) == nil {
			return strings.Join(ss, "\n")
		}
	}
	return string(raw)
}

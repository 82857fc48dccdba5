package httpgw

import (
	"errors"
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
	// Model is the "model" field; HasModel is false when it is absent or null.
	Model    string
	HasModel bool
	// Messages are the chat messages, their content reduced to text.
	Messages []chatMessage
	// Prompt is the completions prompt as text; HasPrompt is false when
	// it is absent or null.
	Prompt    string
	HasPrompt bool
	// User is the "user" field.
	User string
	// Stream is the "stream" field.
	Stream bool
}

// chatMessage is one message of a chat request.
type chatMessage struct {
	Role string
	// Text is the content as text (see messageText).
	Text string
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
// errors wrap ErrBadRequest; those about one field are *requestError
// naming it.
func parseRequest(kind endpointKind, body []byte) (*inferenceRequest, error) {
	req, err := decodeRequest(body)
	if err != nil {
		var re *requestError
		if errors.As(err, &re) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: body is not a valid JSON request: %v", ErrBadRequest, err)
	}
	switch {
	case !req.HasModel:
		return nil, fieldErr("model", "field \"model\" is required")
	case req.Model == "":
		return nil, fieldErr("model", "field \"model\" is empty")
	}
	switch kind {
	case endpointChat:
		if len(req.Messages) == 0 {
			return nil, fieldErr("messages", "field \"messages\" is required and must not be empty")
		}
	case endpointCompletions:
		if !req.HasPrompt {
			return nil, fieldErr("prompt", "field \"prompt\" is required")
		}
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

// decodeRequest reads the routing fields of a request body in one pass
// (see jsonscan.go); the body must be one JSON object.
func decodeRequest(body []byte) (*inferenceRequest, error) {
	r := &jsonReader{b: body}
	req := &inferenceRequest{}
	if r.peek() != '{' {
		return nil, r.errorf("the body must be a JSON object")
	}
	err := r.object(func(key string) error {
		var err error
		switch key {
		case "model":
			req.Model, req.HasModel, err = r.optString("model")
		case "stream":
			if r.null() {
				req.Stream = false
				return nil
			}
			if req.Stream, err = r.boolean(); err != nil {
				return fieldErr("stream", "field \"stream\" must be true or false")
			}
		case "user":
			req.User, _, err = r.optString("user")
		case "messages":
			req.Messages = req.Messages[:0]
			if r.null() {
				return nil
			}
			if r.peek() != '[' {
				return fieldErr("messages", "field \"messages\" must be an array")
			}
			err = r.array(func() error {
				m, err := r.message(len(req.Messages))
				req.Messages = append(req.Messages, m)
				return err
			})
		case "prompt":
			if r.null() {
				req.Prompt, req.HasPrompt = "", false
				return nil
			}
			req.Prompt, err = r.prompt()
			req.HasPrompt = true
		default:
			err = r.skip()
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if r.peek() != 0 {
		return nil, r.errorf("data after the JSON object")
	}
	return req, nil
}

// optString reads the value of the top-level field name, which must be a
// string or null; ok is false for null.
func (r *jsonReader) optString(name string) (s string, ok bool, err error) {
	if r.null() {
		return "", false, nil
	}
	if r.peek() != '"' {
		return "", false, fieldErr(name, fmt.Sprintf("field %q must be a string", name))
	}
	s, err = r.str()
	return s, true, err
}

// message reads one chat message (element i of "messages").
func (r *jsonReader) message(i int) (chatMessage, error) {
	var m chatMessage
	if r.peek() != '{' {
		return m, fieldErr(fmt.Sprintf("messages[%d]", i), fmt.Sprintf("messages[%d] must be an object", i))
	}
	err := r.object(func(key string) error {
		var err error
		switch key {
		case "role":
			if r.peek() != '"' {
				return fieldErr(fmt.Sprintf("messages[%d].role", i), fmt.Sprintf("messages[%d].role must be a string", i))
			}
			m.Role, err = r.str()
		case "content":
			m.Text, err = r.content()
		default:
			err = r.skip()
		}
		return err
	})
	return m, err
}

// content reads a message content as text: a string as is, a list of
// parts as its text parts concatenated (other parts, such as images,
// contribute their JSON text so that different images give different
// keys), null as "", anything else as its JSON text.
func (r *jsonReader) content() (string, error) {
	switch r.peek() {
	case '"':
		return r.str()
	case 'n':
		if r.null() {
			return "", nil
		}
	case '[':
		var sb strings.Builder
		err := r.array(func() error {
			r.ws()
			start := r.i
			if r.peek() != '{' {
				return r.skip()
			}
			var typ, text string
			var hasText bool
			err := r.object(func(key string) error {
				var err error
				switch {
				case key == "type" && r.peek() == '"':
					typ, err = r.str()
				case key == "text" && r.peek() == '"':
					text, err = r.str()
					hasText = true
				default:
					err = r.skip()
				}
				return err
			})
			if err != nil {
				return err
			}
			if typ == "text" && hasText {
				sb.WriteString(text)
			} else {
				sb.Write(r.b[start:r.i])
			}
			return nil
		})
		return sb.String(), err
	}
	return r.raw()
}

// prompt reads a completions prompt as text: a string as is, a list of
// strings joined with newlines, anything else (token arrays) as its JSON
// text.
func (r *jsonReader) prompt() (string, error) {
	switch r.peek() {
	case '"':
		return r.str()
	case '[':
		start := r.i
		var parts []string
		allStrings := true
		err := r.array(func() error {
			if allStrings && r.peek() == '"' {
				s, err := r.str()
				parts = append(parts, s)
				return err
			}
			allStrings = false
			return r.skip()
		})
		if err != nil {
			return "", err
		}
		if allStrings {
			return strings.Join(parts, "\n"), nil
		}
		return string(r.b[start:r.i]), nil
	}
	return r.raw()
}

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
			dst = h.AppendSegment(dst, tagSystem, m.Text)
		}
	}
	dst = h.AppendSegment(dst, tagSession, session(req, hdr))
	dst = h.AppendSegment(dst, tagRAG, hdr.Get(HeaderRAGContext))
	for i := range req.Messages {
		m := &req.Messages[i]
		if isSystemRole(m.Role) {
			continue
		}
		dst = h.AppendSegment(dst, roleTag(m.Role), m.Text)
	}
	dst = h.AppendSegment(dst, tagPrompt, req.Prompt)
	if len(dst) == start {
		dst = h.AppendSegment(dst, tagModel, "\x00"+req.Model)
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

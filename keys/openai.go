package keys

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/examlops/gateway/internal/jsonscan"
)

// The one OpenAI-body reader both fronts use (the HTTP gateway and the
// endpoint picker), so a body gives one key whichever front routes it.
//
// It reads the routing fields of a request body in one pass
// (internal/jsonscan), checking the JSON syntax of the whole body; the body
// itself is forwarded byte for byte. The rules are those of an engine
// reading the body with Python's json module: member names match exactly,
// and of repeated members the last one counts, its type included.
// FuzzDecode checks them against encoding/json.

// Request is the part of an OpenAI chat, completions or responses request
// that routing reads. Every other field passes through untouched.
type Request struct {
	// Model is the "model" field; HasModel is false when it is absent or null.
	Model    string
	HasModel bool
	// Messages are the chat messages (or the responses input items), their
	// content reduced to text, an assistant's tool_calls after it.
	Messages []Message
	// Tools is the JSON text of the "tools" member (the tool definitions
	// a chat template renders into the prompt, beside the system prompt
	// in most models' templates), as sent; "" when absent or null, and in
	// a request Parse reads as Completions, whose engine ignores it.
	Tools string
	// ChatTemplateKwargs is the JSON text of the "chat_template_kwargs"
	// member (variables vLLM hands the chat template, such as
	// {"enable_thinking": false}, which may change the rendered prompt
	// wherever the template reads them), as sent; "" when absent, null or
	// an empty object (which vLLM takes as none), and in a request Parse
	// reads as Completions, whose engine ignores it.
	ChatTemplateKwargs string
	// Prompt is the completions prompt as text; HasPrompt is false when
	// it is absent or null.
	Prompt    string
	HasPrompt bool
	// User is the "user" field.
	User string
	// Stream is the "stream" field.
	Stream bool
	// PreviousResponseID is a responses request's "previous_response_id":
	// the conversation it continues.
	PreviousResponseID string
	// MaxTokens is the answer's length limit, as vLLM reads it:
	// "max_completion_tokens" when it is a positive integer, else
	// "max_tokens" when it is an integer; 0 when neither is. A number of integral value (2.0)
	// counts as an integer, as vLLM reads it too.
	MaxTokens int
	// N is the "n" field (how many choices to generate) when it is a
	// non-negative integer (2.0 too, as for MaxTokens); 0 when it is
	// absent or anything else (the engine reads or refuses it).
	N int

	hasInput bool // "input" is present and not null
}

// Message is one message of a chat request.
type Message struct {
	Role string
	// Text is the content as text (see content).
	Text string
}

// Endpoint is the OpenAI endpoint a body was sent to. The zero value is
// Chat.
type Endpoint int

// The endpoints whose bodies Parse reads.
const (
	Chat        Endpoint = iota // /v1/chat/completions: "messages"
	Completions                 // /v1/completions: "prompt"
	Responses                   // /v1/responses: "instructions", "input"
)

// String returns chat, completions or responses.
func (e Endpoint) String() string {
	switch e {
	case Completions:
		return "completions"
	case Responses:
		return "responses"
	}
	return "chat"
}

// FieldError is a Parse error about one field of the body.
type FieldError struct {
	// Field names the field at fault, as "messages[2].role".
	Field string
	// Msg says what is wrong with it.
	Msg string
}

func (e *FieldError) Error() string { return e.Msg }

func fieldErr(field, msg string) error { return &FieldError{Field: field, Msg: msg} }

// ErrSyntax is wrapped by Parse's errors for a body that is not one JSON
// object.
var ErrSyntax = errors.New("body is not a valid JSON request")

// Parse reads the routing fields of body, sent to endpoint e, and checks
// those the endpoint needs: "model" (a non-empty string), and "messages"
// (a non-empty array) for Chat, "prompt" for Completions, "input" for
// Responses. A body that is not one JSON object is an error wrapping
// ErrSyntax; a missing or mistyped field, a *FieldError naming it. The
// Request holds only what the endpoint's engine reads (vLLM's request
// of the endpoint ignores the others): a chat body's messages, tools
// and template arguments, not its "prompt", "instructions" or "input";
// a completions body's prompt alone; a responses body's instructions,
// input, tools and template arguments.
func Parse(e Endpoint, body []byte) (*Request, error) {
	req, err := decode(body, false, e == Chat)
	if err != nil {
		var fe *FieldError
		if errors.As(err, &fe) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", ErrSyntax, err)
	}
	switch {
	case !req.HasModel:
		return nil, fieldErr("model", "field \"model\" is required")
	case req.Model == "":
		return nil, fieldErr("model", "field \"model\" is empty")
	}
	switch e {
	case Chat:
		if len(req.Messages) == 0 {
			return nil, fieldErr("messages", "field \"messages\" is required and must not be empty")
		}
		req.Prompt, req.HasPrompt = "", false // not a member of vLLM's ChatCompletionRequest
	case Completions:
		if !req.HasPrompt {
			return nil, fieldErr("prompt", "field \"prompt\" is required")
		}
		// No chat template renders these: vLLM's CompletionRequest has
		// none of them.
		req.Messages, req.Tools, req.ChatTemplateKwargs = nil, "", ""
	case Responses:
		if !req.hasInput {
			return nil, fieldErr("input", "field \"input\" is required")
		}
	}
	return req, nil
}

// The fields whose type decode checks, in the order their errors
// are reported.
const (
	fieldModel = iota
	fieldMessages
	fieldStream
	fieldUser
	fieldInstructions
	fieldInput
	fieldPrevious
	nFields
)

// requestReader reads one request body.
type requestReader struct {
	r   jsonscan.Reader
	req Request
	// typeErr holds, per field, the type error of its last occurrence
	// (nil if it had none). The member is skipped, so that the rest of
	// the body is still read: a later occurrence may replace it.
	typeErr [nFields]error
	// instructions is a responses request's "instructions", and input its
	// "input" items, joined into Messages at the end (the members may come
	// in any order).
	instructions    string
	hasInstructions bool
	items           []Message
	// The answer's limits as read (ok: an integer), resolved at the end.
	maxTokens, maxCompletion       int
	hasMaxTokens, hasMaxCompletion bool
	// embeddings reads "input" as an embeddings input (DecodeEmbeddings).
	embeddings bool
}

// Decode reads the routing fields of a request body, which must be one
// JSON object, checking their types but requiring none: Parse without the
// endpoint's checks, for bodies of other endpoints (embeddings,
// tokenize; see also DecodeEmbeddings) that name a model or not. Its errors are Parse's, but for
// ErrSyntax, which it does not wrap.
func Decode(body []byte) (*Request, error) {
	return decode(body, false, false)
}

// decode is Decode, reading "input" as an embeddings input when
// embeddings is set (DecodeEmbeddings), and a chat request's body when
// chat is set: its "instructions" and "input", which vLLM's chat
// endpoint ignores, are then not made its messages.
func decode(body []byte, embeddings, chat bool) (*Request, error) {
	d := &requestReader{embeddings: embeddings}
	d.r.Reset(body)
	if d.r.Peek() != '{' {
		return nil, d.r.Errorf("the body must be a JSON object")
	}
	if err := d.r.Object(d.member); err != nil {
		return nil, err
	}
	if !d.r.End() {
		return nil, d.r.Errorf("data after the JSON object")
	}
	for _, err := range d.typeErr {
		if err != nil {
			return nil, err
		}
	}
	switch {
	case d.hasMaxCompletion && d.maxCompletion != 0:
		d.req.MaxTokens = d.maxCompletion
	case d.hasMaxTokens:
		d.req.MaxTokens = d.maxTokens
	}
	if !chat && (d.hasInstructions || d.req.hasInput && !d.embeddings) {
		// A responses request: its instructions open the conversation as a
		// system message, then its input items. (A chat body has neither,
		// and "messages" of a body with both is replaced.)
		msgs := d.req.Messages[:0]
		if d.hasInstructions && d.instructions != "" {
			msgs = append(msgs, Message{Role: "system", Text: d.instructions})
		}
		d.req.Messages = append(msgs, d.items...)
	}
	return &d.req, nil
}

// input reads a responses request's "input": a string (one user message),
// or a list of items, each a message ({"role", "content"}, content a string
// or a list of parts) or another item (a function call or its output),
// kept as its JSON text in the role "tool". null is no input.
func (d *requestReader) input() error {
	r := &d.r
	d.typeErr[fieldInput] = nil
	d.items, d.req.hasInput = d.items[:0], false
	switch r.Peek() {
	case 'n':
		if r.Null() {
			return nil
		}
	case '"':
		s, err := r.String()
		d.items, d.req.hasInput = append(d.items, Message{Role: "user", Text: s}), true
		return err
	case '[':
		d.req.hasInput = true
		i := 0
		return r.Array(func() error {
			defer func() { i++ }()
			if r.Peek() != '{' {
				terr, err := d.badValue(fmt.Sprintf("input[%d]", i), fmt.Sprintf("input[%d] must be an object", i))
				if d.typeErr[fieldInput] == nil {
					d.typeErr[fieldInput] = terr
				}
				return err
			}
			start := r.Offset()
			m, terr, err := d.message("input", i)
			if terr != nil && d.typeErr[fieldInput] == nil {
				d.typeErr[fieldInput] = terr
			}
			if m.Role == "" { // not a message: a call or its output
				m = Message{Role: "tool", Text: string(r.Since(start))}
			}
			d.items = append(d.items, m)
			return err
		})
	}
	var err error
	d.typeErr[fieldInput], err = d.badValue("input", `field "input" must be a string or an array`)
	return err
}

// badValue skips the next value, of the wrong type for field, and returns
// the error saying so: msg, then the value as found (describe).
func (d *requestReader) badValue(field, msg string) (typeErr, err error) {
	r := &d.r
	start := r.Offset()
	if err := r.Skip(); err != nil {
		return nil, err
	}
	return fieldErr(field, msg+", not "+describe(r.Since(start))), nil
}

// describe names a JSON value (raw, its text) for an error: its text when
// short, else its kind.
func describe(raw []byte) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) <= 40 {
		return string(raw)
	}
	switch raw[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	}
	return "a number"
}

// member reads the value of the top-level member name.
func (d *requestReader) member(name string) error {
	r, req := &d.r, &d.req
	var err error
	switch name {
	case "model":
		req.Model, req.HasModel, err = d.optString(fieldModel, name)
	case "user":
		req.User, _, err = d.optString(fieldUser, name)
	case "stream":
		d.typeErr[fieldStream] = nil
		req.Stream = false
		switch r.Peek() {
		case 't', 'f':
			req.Stream, err = r.Bool()
		default:
			if !r.Null() {
				d.typeErr[fieldStream], err = d.badValue(name, `field "stream" must be true or false`)
			}
		}
	case "messages":
		d.typeErr[fieldMessages] = nil
		req.Messages = req.Messages[:0]
		switch {
		case r.Null():
		case r.Peek() != '[':
			d.typeErr[fieldMessages], err = d.badValue(name, `field "messages" must be an array`)
		default:
			err = r.Array(func() error {
				m, terr, err := d.message("messages", len(req.Messages))
				if terr != nil && d.typeErr[fieldMessages] == nil {
					d.typeErr[fieldMessages] = terr
				}
				req.Messages = append(req.Messages, m)
				return err
			})
		}
	case "instructions":
		// A responses request's system prompt: kept as the first message.
		var text string
		var ok bool
		text, ok, err = d.optString(fieldInstructions, name)
		d.instructions, d.hasInstructions = text, ok
	case "input":
		if d.embeddings {
			err = d.embeddingsInput()
		} else {
			err = d.input()
		}
	case "max_tokens", "max_completion_tokens":
		start := r.Offset()
		err = r.Skip()
		n, ok := tokenLimit(r.Since(start))
		if name == "max_tokens" {
			d.maxTokens, d.hasMaxTokens = n, ok
		} else {
			d.maxCompletion, d.hasMaxCompletion = n, ok
		}
	case "n":
		start := r.Offset()
		err = r.Skip()
		req.N, _ = tokenLimit(r.Since(start))
	case "tools":
		req.Tools = ""
		if !r.Null() {
			req.Tools, err = r.Raw()
		}
	case "chat_template_kwargs":
		req.ChatTemplateKwargs = ""
		if !r.Null() {
			req.ChatTemplateKwargs, err = r.Raw()
			if isEmptyObject(req.ChatTemplateKwargs) {
				req.ChatTemplateKwargs = ""
			}
		}
	case "previous_response_id":
		req.PreviousResponseID, _, err = d.optString(fieldPrevious, name)
	case "prompt":
		req.Prompt, req.HasPrompt = "", false
		if !r.Null() {
			req.Prompt, err = d.prompt()
			req.HasPrompt = true
		}
	default:
		err = r.Skip()
	}
	return err
}

// isEmptyObject reports whether raw, the JSON text of one value, is an
// object without members.
func isEmptyObject(raw string) bool {
	raw = strings.TrimLeft(raw, " \t\r\n")
	if raw == "" || raw[0] != '{' {
		return false
	}
	return strings.Trim(raw[1:], " \t\r\n") == "}"
}

// optString reads the value of the top-level member name (field f), which
// must be a string or null; ok is false for null.
func (d *requestReader) optString(f int, name string) (s string, ok bool, err error) {
	d.typeErr[f] = nil
	switch {
	case d.r.Null():
		return "", false, nil
	case d.r.Peek() != '"':
		d.typeErr[f], err = d.badValue(name, fmt.Sprintf("field %q must be a string", name))
		return "", false, err
	}
	s, err = d.r.String()
	return s, true, err
}

// message reads one chat message: element i of the array field
// ("messages", or a responses request's "input"), its text the content
// (see content) followed by the JSON text of its "tool_calls", if any.
// typeErr reports a message that is not an object or whose role is not a
// string.
func (d *requestReader) message(field string, i int) (m Message, typeErr, err error) {
	r := &d.r
	var calls string
	if r.Peek() != '{' {
		typeErr, err = d.badValue(fmt.Sprintf("%s[%d]", field, i), fmt.Sprintf("%s[%d] must be an object", field, i))
		return m, typeErr, err
	}
	err = r.Object(func(key string) error {
		switch key {
		case "role":
			typeErr, m.Role = nil, ""
			var err error
			if r.Peek() != '"' {
				typeErr, err = d.badValue(fmt.Sprintf("%s[%d].role", field, i), fmt.Sprintf("%s[%d].role must be a string", field, i))
				return err
			}
			m.Role, err = r.String()
			return err
		case "content":
			var err error
			m.Text, err = d.content()
			return err
		case "tool_calls":
			// An assistant's calls, which the engine renders into the
			// prompt: kept as their JSON text, after the content.
			if r.Null() {
				calls = ""
				return nil
			}
			var err error
			calls, err = r.Raw()
			return err
		}
		return r.Skip()
	})
	if calls != "" {
		m.Text += calls
	}
	return m, typeErr, err
}

// content reads a message content as text: a string as is, null as "", a
// list of parts as its text parts ({"type": "text", "text": "..."}, or a
// plain string, which vLLM takes as one) concatenated (a responses
// request's "input_text" and "output_text" parts alike), other objects in
// it (images…) as their JSON text so that different images give different
// keys, anything else as its JSON text.
func (d *requestReader) content() (string, error) {
	r := &d.r
	switch r.Peek() {
	case '"':
		return r.String()
	case 'n':
		if r.Null() {
			return "", nil
		}
	case '[':
		var buf [4]string
		parts := buf[:0]
		err := r.Array(func() error {
			part, err := d.part()
			if part != "" {
				parts = append(parts, part)
			}
			return err
		})
		if len(parts) == 1 {
			return parts[0], err // the usual content: no copy
		}
		return strings.Join(parts, ""), err
	}
	return r.Raw()
}

// part reads one element of a content list and returns its text (see
// content).
func (d *requestReader) part() (string, error) {
	r := &d.r
	switch r.Peek() {
	case '"': // a plain text part, as vLLM reads one
		return r.String()
	case '{':
	default:
		return "", r.Skip()
	}
	start := r.Offset()
	var typ, text string
	var hasText bool
	err := r.Object(func(key string) error {
		var err error
		switch key {
		case "type":
			typ = ""
			if r.Peek() != '"' {
				return r.Skip()
			}
			typ, err = r.String()
		case "text":
			text, hasText = "", false
			if r.Peek() != '"' {
				return r.Skip()
			}
			text, err = r.String()
			hasText = true
		default:
			err = r.Skip()
		}
		return err
	})
	if (typ == "text" || typ == "input_text" || typ == "output_text") && hasText {
		return text, err
	}
	return string(r.Since(start)), err
}

// prompt reads a completions prompt as text: a string as is, a list of
// strings joined with newlines, anything else (token arrays) as its JSON
// text.
func (d *requestReader) prompt() (string, error) {
	r := &d.r
	switch r.Peek() {
	case '"':
		return r.String()
	case '[':
		start := r.Offset()
		var parts []string
		allStrings := true
		err := r.Array(func() error {
			if allStrings && r.Peek() == '"' {
				s, err := r.String()
				parts = append(parts, s)
				return err
			}
			allStrings = false
			return r.Skip()
		})
		if err != nil {
			return "", err
		}
		if allStrings {
			return strings.Join(parts, "\n"), nil
		}
		return string(r.Since(start)), nil
	}
	return r.Raw()
}

// tokenLimit reads a JSON value as a token limit: a non-negative integer
// that fits an int, or a number of integral value written with a fraction
// or an exponent (2.0, 1e3), which vLLM's pydantic models read as that
// integer; ok is false for anything else (null, 2.5, a string), which
// leaves the limit to the engine.
func tokenLimit(raw []byte) (n int, ok bool) {
	s := bytes.TrimSpace(raw)
	n, err := strconv.Atoi(string(s))
	if err == nil {
		return max(n, 0), n >= 0
	}
	f, err := strconv.ParseFloat(string(s), 64)
	if err != nil || f < 0 || f != math.Trunc(f) || f >= 1<<53 {
		return 0, false
	}
	return int(f), true
}

package httpgw

import (
	"errors"
	"fmt"
	"strings"

	"github.com/examlops/gateway/internal/jsonscan"
)

// This file reads the routing fields of an OpenAI request body in one pass
// (internal/jsonscan), checking the JSON syntax of the whole body; the
// body itself is forwarded byte for byte. The rules are those of an engine
// reading the body with Python's json module: member names match exactly,
// and of repeated members the last one counts, its type included.
// FuzzDecodeRequest checks them against encoding/json.

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
	// Text is the content as text (see requestReader.content).
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

// The fields whose type decodeRequest checks, in the order their errors
// are reported.
const (
	fieldModel = iota
	fieldMessages
	fieldStream
	fieldUser
	nFields
)

// requestReader reads one request body.
type requestReader struct {
	r   jsonscan.Reader
	req inferenceRequest
	// typeErr holds, per field, the type error of its last occurrence
	// (nil if it had none). The member is skipped, so that the rest of
	// the body is still read: a later occurrence may replace it.
	typeErr [nFields]error
}

// decodeRequest reads the routing fields of a request body, which must be
// one JSON object.
func decodeRequest(body []byte) (*inferenceRequest, error) {
	d := &requestReader{}
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
	return &d.req, nil
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
				d.typeErr[fieldStream] = fieldErr(name, "field \"stream\" must be true or false")
				err = r.Skip()
			}
		}
	case "messages":
		d.typeErr[fieldMessages] = nil
		req.Messages = req.Messages[:0]
		switch {
		case r.Null():
		case r.Peek() != '[':
			d.typeErr[fieldMessages] = fieldErr(name, "field \"messages\" must be an array")
			err = r.Skip()
		default:
			err = r.Array(func() error {
				m, terr, err := d.message(len(req.Messages))
				if terr != nil && d.typeErr[fieldMessages] == nil {
					d.typeErr[fieldMessages] = terr
				}
				req.Messages = append(req.Messages, m)
				return err
			})
		}
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

// optString reads the value of the top-level member name (field f), which
// must be a string or null; ok is false for null.
func (d *requestReader) optString(f int, name string) (s string, ok bool, err error) {
	d.typeErr[f] = nil
	switch {
	case d.r.Null():
		return "", false, nil
	case d.r.Peek() != '"':
		d.typeErr[f] = fieldErr(name, fmt.Sprintf("field %q must be a string", name))
		return "", false, d.r.Skip()
	}
	s, err = d.r.String()
	return s, true, err
}

// message reads one chat message (element i of "messages"). typeErr
// reports a message that is not an object or whose role is not a string.
func (d *requestReader) message(i int) (m chatMessage, typeErr, err error) {
	r := &d.r
	if r.Peek() != '{' {
		return m, fieldErr(fmt.Sprintf("messages[%d]", i), fmt.Sprintf("messages[%d] must be an object", i)), r.Skip()
	}
	err = r.Object(func(key string) error {
		switch key {
		case "role":
			typeErr, m.Role = nil, ""
			if r.Peek() != '"' {
				typeErr = fieldErr(fmt.Sprintf("messages[%d].role", i), fmt.Sprintf("messages[%d].role must be a string", i))
				return r.Skip()
			}
			var err error
			m.Role, err = r.String()
			return err
		case "content":
			var err error
			m.Text, err = d.content()
			return err
		}
		return r.Skip()
	})
	return m, typeErr, err
}

// content reads a message content as text: a string as is, null as "", a
// list of parts as its text parts ({"type": "text", "text": "..."})
// concatenated, other objects in it (images…) as their JSON text so that
// different images give different keys, anything else as its JSON text.
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
	if r.Peek() != '{' {
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
	if typ == "text" && hasText {
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

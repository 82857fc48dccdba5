package keys

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/examlops/gateway/internal/jsonscan"
)

// decodeStd is decode written with encoding/json: the
// reference the one-pass decoder is fuzzed against, and the alternative it
// is benchmarked against. Its rules are those of an engine reading the
// body with Python's json module: member names match exactly (not
// encoding/json's case-insensitive struct fields), and of repeated
// members the last one counts, its type included. Nesting is bounded by
// jsonscan.MaxDepth, as in decode.
func decodeStd(body []byte) (*Request, error) { return decodeStdAs(body, false) }

// decodeStdAs is decodeStd, reading "input" as an embeddings input when
// embeddings is set: the reference of DecodeEmbeddings.
func decodeStdAs(body []byte, embeddings bool) (*Request, error) {
	if depth(body) > jsonscan.MaxDepth {
		return nil, errors.New("nesting too deep")
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, err
	}
	if top == nil {
		return nil, errors.New("not an object") // the body was null
	}
	req := &Request{}
	if raw, ok := top["model"]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &req.Model); err != nil {
			return nil, fieldErr("model", "model must be a string")
		}
		req.HasModel = true
	}
	if raw, ok := top["stream"]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &req.Stream); err != nil {
			return nil, fieldErr("stream", "stream must be a boolean")
		}
	}
	if raw, ok := top["user"]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &req.User); err != nil {
			return nil, fieldErr("user", "user must be a string")
		}
	}
	if raw, ok := top["messages"]; ok && !isNull(raw) {
		var msgs []json.RawMessage
		if err := json.Unmarshal(raw, &msgs); err != nil {
			return nil, fieldErr("messages", "messages must be an array")
		}
		req.Messages = make([]Message, 0, len(msgs))
		for i, raw := range msgs {
			m, err := messageStd(raw)
			if err != nil {
				return nil, fieldErr(fmt.Sprintf("messages[%d]", i), err.Error())
			}
			req.Messages = append(req.Messages, m)
		}
	}
	if raw, ok := top["prompt"]; ok && !isNull(raw) {
		req.Prompt, req.HasPrompt = promptStd(raw), true
	}
	if raw, ok := top["tools"]; ok && !isNull(raw) {
		req.Tools = string(raw)
	}
	if raw, ok := top["chat_template_kwargs"]; ok && !isNull(raw) {
		var members map[string]json.RawMessage
		if json.Unmarshal(raw, &members) != nil || len(members) > 0 {
			req.ChatTemplateKwargs = string(raw) // {} is none
		}
	}
	if raw, ok := top["previous_response_id"]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &req.PreviousResponseID); err != nil {
			return nil, fieldErr("previous_response_id", "previous_response_id must be a string")
		}
	}
	limit := func(name string) (int, bool) {
		raw, ok := top[name]
		if !ok {
			return 0, false
		}
		var f float64
		if json.Unmarshal(raw, &f) != nil || f < 0 || isNull(raw) || f != math.Trunc(f) || f >= 1<<53 {
			var n int // an integer past float64's precision
			if json.Unmarshal(raw, &n) != nil || n < 0 || !isInteger(raw) {
				return 0, false
			}
			return n, true
		}
		return int(f), true
	}
	req.N, _ = limit("n")
	if n, ok := limit("max_completion_tokens"); ok && n != 0 {
		req.MaxTokens = n
	} else if n, ok := limit("max_tokens"); ok {
		req.MaxTokens = n
	}
	var instructions string
	hasInstructions := false
	if raw, ok := top["instructions"]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &instructions); err != nil {
			return nil, fieldErr("instructions", "instructions must be a string")
		}
		hasInstructions = true
	}
	var items []Message
	if raw, ok := top["input"]; ok && !isNull(raw) && embeddings {
		req.hasInput = true
		if err := embeddingsStd(raw); err != nil {
			return nil, err
		}
	} else if ok && !isNull(raw) {
		req.hasInput = true
		var s string
		var list []json.RawMessage
		switch {
		case json.Unmarshal(raw, &s) == nil:
			items = append(items, Message{Role: "user", Text: s})
		case json.Unmarshal(raw, &list) == nil:
			for i, it := range list {
				m, err := messageStd(it)
				if err != nil {
					return nil, fieldErr(fmt.Sprintf("input[%d]", i), err.Error())
				}
				if m.Role == "" {
					m = Message{Role: "tool", Text: string(it)}
				}
				items = append(items, m)
			}
		default:
			return nil, fieldErr("input", "input must be a string or an array")
		}
	}
	if hasInstructions || req.hasInput && !embeddings {
		msgs := req.Messages[:0]
		if instructions != "" {
			msgs = append(msgs, Message{Role: "system", Text: instructions})
		}
		req.Messages = append(msgs, items...)
	}
	return req, nil
}

// embeddingsStd checks an embeddings input: a string, or an array of
// strings, of integers, or of arrays of integers (the first element sets
// which).
func embeddingsStd(raw json.RawMessage) error {
	var s string
	var list []json.RawMessage
	if json.Unmarshal(raw, &s) == nil {
		return nil
	}
	if json.Unmarshal(raw, &list) != nil {
		return fieldErr("input", "input must be a string or an array")
	}
	isInt := func(e json.RawMessage) bool {
		_, err := strconv.ParseInt(string(e), 10, 64)
		return err == nil
	}
	form := func(e json.RawMessage) byte {
		switch e[0] {
		case '"', '[':
			return e[0]
		case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			return '0'
		}
		return 0
	}
	for i, e := range list {
		f := form(e)
		if f == 0 || f != form(list[0]) {
			return fieldErr(fmt.Sprintf("input[%d]", i), "bad element")
		}
		switch f {
		case '0':
			if !isInt(e) {
				return fieldErr(fmt.Sprintf("input[%d]", i), "not an integer")
			}
		case '[':
			var ids []json.RawMessage
			if json.Unmarshal(e, &ids) != nil {
				return fieldErr(fmt.Sprintf("input[%d]", i), "not an array")
			}
			for j, id := range ids {
				if !isInt(id) {
					return fieldErr(fmt.Sprintf("input[%d][%d]", i, j), "not an integer")
				}
			}
		}
	}
	return nil
}

func isNull(raw json.RawMessage) bool { return string(raw) == "null" }

// isInteger reports whether a JSON number is written as an integer (no
// fraction or exponent), as strconv.Atoi reads it.
func isInteger(raw json.RawMessage) bool {
	_, err := strconv.Atoi(string(raw))
	return err == nil
}

func messageStd(raw json.RawMessage) (Message, error) {
	var m Message
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return m, errors.New("not an object")
	}
	if r, ok := fields["role"]; ok {
		if err := json.Unmarshal(r, &m.Role); err != nil || isNull(r) {
			return m, errors.New("role must be a string")
		}
	}
	if c, ok := fields["content"]; ok {
		m.Text = contentStd(c)
	}
	if c, ok := fields["tool_calls"]; ok && !isNull(c) {
		m.Text += string(c)
	}
	return m, nil
}

// contentStd is content's text: a string as is, null as "", a list of
// parts as its text parts ({"type": "text", "text": "..."} or a string,
// other objects as their JSON; other elements nothing), anything else as
// its JSON.
func contentStd(raw json.RawMessage) string {
	var s string
	switch {
	case isNull(raw):
		return ""
	case json.Unmarshal(raw, &s) == nil:
		return s
	}
	var parts []json.RawMessage
	if json.Unmarshal(raw, &parts) != nil {
		return string(raw)
	}
	var sb strings.Builder
	for _, p := range parts {
		if json.Unmarshal(p, &s) == nil && !isNull(p) {
			sb.WriteString(s)
			continue
		}
		var fields map[string]json.RawMessage
		if json.Unmarshal(p, &fields) != nil || fields == nil {
			continue
		}
		var typ, text string
		if json.Unmarshal(fields["type"], &typ) == nil && (typ == "text" || typ == "input_text" || typ == "output_text") && !isNull(fields["type"]) {
			if t, ok := fields["text"]; ok && !isNull(t) && json.Unmarshal(t, &text) == nil {
				sb.WriteString(text)
				continue
			}
		}
		sb.Write(p)
	}
	return sb.String()
}

// promptStd is a prompt's text: a string as is, a list of strings joined
// with newlines, anything else as its JSON.
func promptStd(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) == nil {
		parts := make([]string, len(list))
		for i, e := range list {
			if isNull(e) || json.Unmarshal(e, &parts[i]) != nil {
				return string(raw)
			}
		}
		return strings.Join(parts, "\n")
	}
	return string(raw)
}

// depth returns the deepest nesting of arrays and objects in b, which
// must be valid JSON for the answer to mean anything.
func depth(b []byte) int {
	d, most, inStr := 0, 0, false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case inStr && c == '\\':
			i++
		case c == '"':
			inStr = !inStr
		case inStr:
		case c == '[' || c == '{':
			d++
			most = max(most, d)
		case c == ']' || c == '}':
			d--
		}
	}
	return most
}

// sameRequest compares what decode and decodeStd make of
// body: the same accept/reject decision and the same fields.
func sameRequest(t *testing.T, body []byte) {
	t.Helper()
	sameRequestAs(t, body, false)
	sameRequestAs(t, body, true)
}

// sameRequestAs is sameRequest for Decode, or DecodeEmbeddings when
// embeddings is set.
func sameRequestAs(t *testing.T, body []byte, embeddings bool) {
	t.Helper()
	got, gerr := decode(body, embeddings, false)
	want, werr := decodeStdAs(body, embeddings)
	if (gerr == nil) != (werr == nil) {
		t.Fatalf("body %q (embeddings %v): decode error %v, encoding/json error %v", body, embeddings, gerr, werr)
	}
	if gerr != nil {
		return
	}
	if len(got.Messages) == 0 && len(want.Messages) == 0 {
		got.Messages, want.Messages = nil, nil
	}
	if fmt.Sprintf("%#v", *got) != fmt.Sprintf("%#v", *want) {
		t.Fatalf("body %q (embeddings %v):\n decode %#v\n encoding/json %#v", body, embeddings, *got, *want)
	}
}

// decodeSeeds are request bodies for the differential fuzz: typical ones
// and edge cases of each field.
var decodeSeeds = []string{
	`{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"hi"}],"stream":true,"max_tokens":4}`,
	`{"model":"m","prompt":"once upon a time","user":"u1","temperature":0.5}`,
	`{"model":"m","prompt":["a","b"]}`,
	`{"model":"m","prompt":[1,2,3]}`,
	`{"model":"m","prompt":["a",1]}`,
	`{"model":"m","prompt":{"x":1}}`,
	`{"model":"m","prompt":null}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},"s",{"text":"b","type":"text"}]}]}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":5},{"type":5,"text":"x"},{"type":"text","type":"image","text":"y"}]}]}`,
	`{"model":"m","messages":[{"role":"user","content":{"a":1}},{"role":"tool","content":42}]}`,
	`{"model":"m","messages":[{"role":null,"content":"x"}]}`,
	`{"model":"m","messages":[{"content":"no role"}]}`,
	`{"model":"m","messages":[{"role":"assistant","content":"a","tool_calls":[{"id":"1","function":{"name":"f","arguments":"{}"}}]},{"role":"assistant","tool_calls":[1],"tool_calls":null}]}`,
	`{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"a"}],"tools" : null,"tools":[ 1 , "x" ]}`,
	`{"model":"m","chat_template_kwargs":{"enable_thinking":false},"tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"a"}]}`,
	`{"model":"m","chat_template_kwargs":{"a":1},"messages":[{"role":"user","content":"a"}],"chat_template_kwargs" : null,"chat_template_kwargs":{ "b" : [ 1 ] }}`,
	`{"model":"m","chat_template_kwargs":{"a":1},"chat_template_kwargs":{ }}`, `{"model":"m","chat_template_kwargs":{"a":1},"chat_template_kwargs":{}}`,
	`{"model":"m","chat_template_kwargs":[],"prompt":"p"}`, `{"model":"m","chat_template_kwargs":"x"}`, `{"model":"m","chat_template_kwargs":5}`,
	`{"model":"m","chat_template_kwargs":{"a":{}}}`, "{\"model\":\"m\",\"chat_template_kwargs\":{\t\r\n}}",
	`{"model":"m","messages":[1]}`,
	`{"model":"m","messages":{}}`,
	`{"model":"m","messages":null}`,
	`{"model":5}`,
	`{"model":null}`,
	`{"model":5,"model":"m"}`,
	`{"model":"m","model":5}`,
	`{"Model":"m"}`,
	`{"model":"m","stream":"yes"}`,
	`{"model":"m","stream":null,"user":null}`,
	`{"model":"m","user":7}`,
	`{"model":"m\u00e9\ud83d\ude00\ud800","user":"caf\u00e9"}`,
	"{\"model\":\"m\xff\xfe\",\"user\":\"a\xc3\"}",
	`{"mod\u0065l":"escaped name"}`,
	` { "model" : "spaces" , "prompt" : [ "a" , "b" ] } `,
	`{"model":"m"} trailing`,
	`{"model":"m","instructions":"Be terse.","input":"hi","previous_response_id":"resp_1"}`,
	`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"x"}]},{"type":"function_call","name":"f","arguments":"{}"},{"role":"assistant","content":[{"type":"output_text","text":"b"}]}]}`,
	`{"model":"m","input":[1]}`, `{"model":"m","input":5}`, `{"model":"m","input":null,"instructions":null}`,
	`{"model":"m","instructions":7,"input":"x"}`, `{"model":"m","input":"x","input":[{"role":null}]}`,
	`{"model":"m","messages":[{"role":"user","content":"m"}],"input":"i"}`, `{"model":"m","previous_response_id":3}`,
	`{"model":"m","input":["a","b"]}`, `{"model":"m","input":[1,2,3]}`, `{"model":"m","input":[[1,2],[3],[]]}`, `{"model":"m","input":[]}`,
	`{"model":"m","input":["a",1]}`, `{"model":"m","input":[1,"a"]}`, `{"model":"m","input":[[1,"a"]]}`, `{"model":"m","input":[1.5]}`,
	`{"model":"m","input":[-1,0]}`, `{"model":"m","input":[[1],2]}`, `{"model":"m","input":[99999999999999999999]}`, `{"model":"m","input":[true]}`,
	`{"model":"m","input":[[[1]]]}`, `{"model":"m","input":[1e3]}`, `{"model":"m","input":[null]}`, `{"model":"m","input":"x","input":[1,2]}`,
	`{"model":"m","n":3}`, `{"model":"m","n":3,"n":"x"}`, `{"model":"m","n":-1}`, `{"model":"m","n":2.0}`, `{"model":"m","n":null}`,
	`{"model":"m","n":2.5,"max_tokens":1e3}`, `{"model":"m","n":-0.0,"max_completion_tokens":9007199254740993}`, `{"model":"m","max_tokens":1e400}`, `{"model":"m","max_completion_tokens":0,"max_tokens":3}`,
	`[]`, `null`, `"s"`, `{}`, ``, `{`,
	`{"model":"m","x":` + strings.Repeat("[", jsonscan.MaxDepth) + strings.Repeat("]", jsonscan.MaxDepth) + `}`,
	`{"model":"m","x":` + strings.Repeat("[", jsonscan.MaxDepth-1) + strings.Repeat("]", jsonscan.MaxDepth-1) + `}`,
}

// The one-pass decoder accepts and rejects what the encoding/json
// reference does and extracts the same fields.
func TestDecodeRequestMatchesStd(t *testing.T) {
	for _, body := range decodeSeeds {
		sameRequest(t, []byte(body))
	}
}

// FuzzDecode compares decode with decodeStd on
// mutated request bodies. Its seed corpus is decodeSeeds plus
// testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	for _, body := range decodeSeeds {
		f.Add([]byte(body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		sameRequest(t, body)
		if bytes.Count(body, []byte("\"")) > 0 {
			for _, e := range []Endpoint{Chat, Completions, Responses} {
				_, _ = Parse(e, body) // must not panic
			}
		}
	})
}

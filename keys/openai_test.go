package keys

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// Requests encoded by encoding/json decode to the same fields.
func TestDecodeRequestMatchesEncodingJSON(t *testing.T) {
	type msg struct {
		Role    string `json:"role"`
		Content any    `json:"content"`
	}
	text := rapid.StringMatching(`[a-zA-Z0-9 "\\\n\t<>&é😀\x00-\x1f]{0,40}`)
	rapid.Check(t, func(t *rapid.T) {
		model := rapid.StringMatching(`[a-zA-Z0-9/\-"\\é]{1,20}`).Draw(t, "model")
		user := text.Draw(t, "user")
		stream := rapid.Bool().Draw(t, "stream")
		n := rapid.IntRange(1, 5).Draw(t, "n")
		var msgs []msg
		var want []Message
		for i := range n {
			role := rapid.SampledFrom([]string{"system", "user", "assistant", "tool", "developer"}).Draw(t, "role")
			c := text.Draw(t, "content")
			if rapid.Bool().Draw(t, "parts") {
				split := rapid.IntRange(0, len(c)).Draw(t, "split")
				for split > 0 && split < len(c) && (c[split]&0xC0) == 0x80 {
					split--
				}
				msgs = append(msgs, msg{role, []map[string]any{{"type": "text", "text": c[:split]}, {"text": c[split:], "type": "text"}}})
			} else {
				msgs = append(msgs, msg{role, c})
			}
			want = append(want, Message{Role: role, Text: c})
			_ = i
		}
		body, err := json.Marshal(map[string]any{"model": model, "messages": msgs, "user": user, "stream": stream,
			"temperature": 0.5, "stop": []any{"x", nil, true}, "extra": map[string]any{"nested": []any{1, "two"}}})
		require.NoError(t, err)
		got, err := Decode(body)
		require.NoError(t, err, "%s", body)
		// encoding/json replaces invalid UTF-8 with U+FFFD when encoding,
		// so compare with what it decodes back.
		var back struct {
			Model    string `json:"model"`
			User     string `json:"user"`
			Messages []struct {
				Role    string          `json:"role"`
				Content json.RawMessage `json:"content"`
			} `json:"messages"`
		}
		require.NoError(t, json.Unmarshal(body, &back))
		assert.Equal(t, back.Model, got.Model)
		assert.Equal(t, back.User, got.User)
		assert.Equal(t, stream, got.Stream)
		require.Len(t, got.Messages, len(want))
		for i := range want {
			assert.Equal(t, want[i].Role, got.Messages[i].Role)
			var s string
			if json.Unmarshal(back.Messages[i].Content, &s) != nil {
				var parts []struct{ Text string }
				require.NoError(t, json.Unmarshal(back.Messages[i].Content, &parts))
				s = parts[0].Text + parts[1].Text
			}
			assert.Equal(t, s, got.Messages[i].Text)
		}
	})
}

func TestDecodeRequestFields(t *testing.T) {
	tests := []struct {
		name string
		body string
		want Request
	}{
		{"escapes decode", `{"model":"m\u00e9","messages":[{"role":"user","content":"caf\u00e9 \ud83d\ude00"}]}`,
			Request{Model: "mé", HasModel: true, Messages: []Message{{"user", "café 😀"}}}},
		{"lone surrogate becomes U+FFFD", `{"model":"m","messages":[{"role":"user","content":"a\ud800b"}]}`,
			Request{Model: "m", HasModel: true, Messages: []Message{{"user", "a\uFFFDb"}}}},
		{"null fields", `{"model":"m","user":null,"stream":null,"messages":[{"role":"user","content":null}]}`,
			Request{Model: "m", HasModel: true, Messages: []Message{{"user", ""}}}},
		{"image part keeps its JSON", `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"hi"}]}]}`,
			Request{Model: "m", HasModel: true, Messages: []Message{{"user", `{"type":"image_url","image_url":{"url":"x"}}hi`}}}},
		{"token prompt", `{"model":"m","prompt":[1, 2,3]}`, Request{Model: "m", HasModel: true, Prompt: "[1, 2,3]", HasPrompt: true}},
		{"string list prompt", `{"model":"m","prompt":["a","b"]}`, Request{Model: "m", HasModel: true, Prompt: "a\nb", HasPrompt: true}},
		{"last duplicate wins", `{"model":"a","model":"b","stream":true}`, Request{Model: "b", HasModel: true, Stream: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Decode([]byte(tt.body))
			require.NoError(t, err)
			if tt.want.Messages == nil {
				tt.want.Messages = got.Messages[:0:0]
				if got.Messages == nil {
					tt.want.Messages = nil
				}
			}
			assert.Equal(t, tt.want, *got)
		})
	}
}

// TestItemErrorsNameTheirField: a bad item of a responses "input" is an
// error naming it as "input[i]", as a bad chat message is named
// "messages[i]" (found in review: a responses item's role was reported as
// "messages[i].role", a field the body does not have), and the value
// found; an item that is not an object counts for the indexes after it.
func TestItemErrorsNameTheirField(t *testing.T) {
	requireFieldErrors(t, []fieldErrorCase{
		{`{"model":"m","messages":[{"role":"user","content":"x"},{"role":[1]}]}`, "messages[1].role", "messages[1].role must be a string, not [1]"},
		{`{"model":"m","messages":[5]}`, "messages[0]", "messages[0] must be an object, not 5"},
		{`{"model":"m","input":[{"role":"user","content":"x"},{"role":5}]}`, "input[1].role", "input[1].role must be a string, not 5"},
		{`{"model":"m","input":[5]}`, "input[0]", "input[0] must be an object, not 5"},
		{`{"model":"m","input":[{"role":"user"},"a",{"role":5}]}`, "input[1]", `input[1] must be an object, not "a"`},
		{`{"model":"m","input":[{"role":"user"},{"role":"user"},{"role":5},true]}`, "input[2].role", "input[2].role must be a string, not 5"},
		{`{"model":"m","input":[{"role":"user"},5,{"role":"user"},6]}`, "input[1]", "input[1] must be an object, not 5"},
	})
}

// TestToolCallsAreKeyed: an assistant message's "tool_calls" are part of
// the prompt an engine renders, so two conversations that differ only in
// a call's arguments get different keys from that message on, and a
// message with calls differs from one without (found in review: the calls
// were dropped, so both conversations below had one key, while a
// responses request's function_call items were keyed by their JSON).
func TestToolCallsAreKeyed(t *testing.T) {
	body := func(args string) string {
		return `{"model":"m","messages":[{"role":"user","content":"weather?"},` +
			`{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"w","arguments":"{\"city\":\"` + args + `\"}"}}]},` +
			`{"role":"tool","tool_call_id":"1","content":"sunny"}]}`
	}
	key := func(b string) Key {
		req, err := Parse(Chat, []byte(b))
		require.NoError(t, err, b)
		return req.AppendKey(defaultHasher, nil, "", "")
	}
	paris, london := key(body("Paris")), key(body("London"))
	assert.Equal(t, paris[0], london[0], "the user message is shared")
	assert.NotEqual(t, paris[len(paris)-1], london[len(london)-1], "the calls differ")
	assert.Equal(t, paris, key(body("Paris")))
	noCalls := key(`{"model":"m","messages":[{"role":"user","content":"weather?"},{"role":"assistant","content":null},{"role":"tool","tool_call_id":"1","content":"sunny"}]}`)
	assert.NotEqual(t, paris[len(paris)-1], noCalls[len(noCalls)-1])
	nullCalls := key(`{"model":"m","messages":[{"role":"user","content":"weather?"},{"role":"assistant","content":null,"tool_calls":null},{"role":"tool","tool_call_id":"1","content":"sunny"}]}`)
	assert.Equal(t, noCalls, nullCalls, "null calls are none")
}

// TestToolsAreKeyed: a request's tool definitions ("tools") are rendered
// into the prompt by the chat template, beside the system prompt in most
// models' templates, so they are keyed after the system messages and
// before the conversation: two requests that differ only in their tools
// share the system prompt's blocks and no more (before, "tools" was
// skipped and they had one key); null tools are none; a responses
// request's tools count alike.
func TestToolsAreKeyed(t *testing.T) {
	system := strings.Repeat("You are a helpful agent. ", 20) // several blocks
	body := func(tools string) string {
		return `{"model":"m","tools":` + tools + `,"messages":[{"role":"system","content":"` + system + `"},{"role":"user","content":"weather in Paris?"}]}`
	}
	tool := func(name string) string {
		return `[{"type":"function","function":{"name":"` + name + `","parameters":{"type":"object"}}}]`
	}
	key := func(e Endpoint, b string) Key {
		req, err := Parse(e, []byte(b))
		require.NoError(t, err, b)
		return req.AppendKey(defaultHasher, nil, "", "")
	}
	sys := defaultHasher.AppendSegment(nil, SegmentSystem, system)
	weather, search := key(Chat, body(tool("weather"))), key(Chat, body(tool("search")))
	none, null := key(Chat, `{"model":"m","messages":[{"role":"system","content":"`+system+`"},{"role":"user","content":"weather in Paris?"}]}`), key(Chat, body("null"))
	assert.Equal(t, none, null, "null tools are none")
	for _, k := range []Key{weather, search, none} {
		require.Greater(t, len(k), len(sys))
		assert.Equal(t, sys, k[:len(sys)], "the system prompt's blocks come first")
	}
	assert.NotEqual(t, weather[len(sys)], search[len(sys)], "different tools part after the system prompt")
	assert.NotEqual(t, weather[len(sys)], none[len(sys)], "tools or none")
	assert.Equal(t, weather, key(Chat, body(tool("weather"))))
	resp := func(tools string) Key {
		return key(Responses, `{"model":"m","instructions":"`+system+`","tools":`+tools+`,"input":"weather in Paris?"}`)
	}
	assert.NotEqual(t, resp(tool("weather")), resp(tool("search")), "a responses request's tools")
}

// TestChatTemplateKwargsAreKeyed: vLLM hands a chat request's
// "chat_template_kwargs" to the chat template as variables (merged over
// its tools and add_generation_prompt), so they can change the rendered
// prompt wherever the template reads them: {"enable_thinking": false}
// changes a Qwen3 prompt's end, other templates' system header. They are
// keyed beside the tools, after the system messages and the tools and
// before the conversation: two requests that differ only in them share
// the system prompt's and the tools' blocks and no more (before, the
// member was skipped and they had one key). null and {} are none, as vLLM
// merges them (chat_template_kwargs or {}).
func TestChatTemplateKwargsAreKeyed(t *testing.T) {
	system := strings.Repeat("You are a helpful agent. ", 20) // several blocks
	const tools = `[{"type":"function","function":{"name":"weather","parameters":{"type":"object"}}}]`
	body := func(kwargs string) string {
		return `{"model":"m","chat_template_kwargs":` + kwargs + `,"tools":` + tools + `,"messages":[{"role":"system","content":"` + system + `"},{"role":"user","content":"weather in Paris?"}]}`
	}
	key := func(b string) Key {
		req, err := Parse(Chat, []byte(b))
		require.NoError(t, err, b)
		return req.AppendKey(defaultHasher, nil, "", "")
	}
	head := defaultHasher.AppendSegment(defaultHasher.AppendSegment(nil, SegmentSystem, system), SegmentSystem, tools)
	off, on := key(body(`{"enable_thinking":false}`)), key(body(`{"enable_thinking":true}`))
	none := key(`{"model":"m","tools":` + tools + `,"messages":[{"role":"system","content":"` + system + `"},{"role":"user","content":"weather in Paris?"}]}`)
	assert.NotEqual(t, off, on, "requests differing only in chat_template_kwargs have different keys")
	assert.NotEqual(t, off, none, "chat_template_kwargs or none")
	assert.Equal(t, none, key(body("null")), "null chat_template_kwargs are none")
	assert.Equal(t, none, key(body("{ }")), "empty chat_template_kwargs are none")
	for _, k := range []Key{off, on, none} {
		require.Greater(t, len(k), len(head))
		assert.Equal(t, head, k[:len(head)], "the system prompt's and the tools' blocks come first")
	}
	assert.NotEqual(t, off[len(head)], on[len(head)], "different kwargs part after the tools")
	assert.NotEqual(t, off[len(head)], none[len(head)], "kwargs or none")
	assert.Equal(t, off, key(body(`{"enable_thinking":false}`)))
}

// TestIgnoredTemplateMembersAreNotKeyed: members an endpoint's engine
// ignores do not change its key. vLLM's CompletionRequest has neither
// "tools" nor "chat_template_kwargs" (vllm/entrypoints/openai/protocol.py:
// extra fields are allowed and ignored; no chat template renders a
// completions prompt), so its prompt is the same without them; the exact
// index's tokenization (internal/front.ReadTokenizeInput) drops them too.
// Before, they were keyed as for a chat request, so the same completions
// prompt with and without them had no block in common. A responses
// request's tools and template arguments are rendered (vLLM's
// ResponsesRequest.build_chat_params) and keyed.
func TestIgnoredTemplateMembersAreNotKeyed(t *testing.T) {
	const kwargs, tools = `"chat_template_kwargs":{"enable_thinking":false}`, `"tools":[{"type":"function","function":{"name":"f"}}]`
	key := func(e Endpoint, b string) Key {
		req, err := Parse(e, []byte(b))
		require.NoError(t, err, b)
		return req.AppendKey(defaultHasher, nil, "", "")
	}
	prompt := strings.Repeat("Once upon a time. ", 10)
	plain := key(Completions, `{"model":"m","prompt":"`+prompt+`"}`)
	assert.Equal(t, plain, key(Completions, `{"model":"m",`+kwargs+`,"prompt":"`+prompt+`"}`), "a completions request's chat_template_kwargs")
	assert.Equal(t, plain, key(Completions, `{"model":"m",`+tools+`,"prompt":"`+prompt+`"}`), "a completions request's tools")
	resp := `{"model":"m","instructions":"be brief","input":"` + prompt + `"`
	assert.NotEqual(t, key(Responses, resp+`}`), key(Responses, resp+`,`+kwargs+`}`), "a responses request's chat_template_kwargs are rendered")
	assert.NotEqual(t, key(Responses, resp+`}`), key(Responses, resp+`,`+tools+`}`), "a responses request's tools are rendered")
}

// TestOtherEndpointsMembersAreNotKeyed: a body is keyed by the members
// its endpoint's engine reads. vLLM's ChatCompletionRequest has no
// "prompt", "instructions" or "input", its CompletionRequest no
// "messages" (extra fields are ignored): before, a chat body's
// "instructions" became a system message of its key, its "input"
// replaced its messages, its "prompt" was keyed after them, and a
// completions body's "messages" before its prompt.
func TestOtherEndpointsMembersAreNotKeyed(t *testing.T) {
	key := func(e Endpoint, b string) Key {
		req, err := Parse(e, []byte(b))
		require.NoError(t, err, b)
		return req.AppendKey(defaultHasher, nil, "", "")
	}
	const msgs = `"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"weather in Paris?"}]`
	chat := key(Chat, `{"model":"m",`+msgs+`}`)
	for _, extra := range []string{`"instructions":"be long"`, `"input":"weather in Rome?"`, `"prompt":"weather in Rome?"`} {
		assert.Equal(t, chat, key(Chat, `{"model":"m",`+extra+`,`+msgs+`}`), "a chat body's %s", extra)
		assert.Equal(t, chat, key(Chat, `{"model":"m",`+msgs+`,`+extra+`}`), "a chat body's %s, last", extra)
	}
	const prompt = `"prompt":"Once upon a time"`
	completions := key(Completions, `{"model":"m",`+prompt+`}`)
	for _, extra := range []string{msgs, `"instructions":"be long"`, `"input":"weather in Rome?"`} {
		assert.Equal(t, completions, key(Completions, `{"model":"m",`+extra+`,`+prompt+`}`), "a completions body's %s", extra)
	}
	resp := key(Responses, `{"model":"m","instructions":"be brief","input":"weather in Paris?"}`)
	assert.Equal(t, resp, key(Responses, `{"model":"m",`+msgs+`,"instructions":"be brief","input":"weather in Paris?"}`), "a responses body's messages")
}

// TestTypeErrorsNameTheValue: a field of the wrong type is an error that
// names the field and the value found, as written when it is short, else
// by its kind (found in review: the errors named the field alone).
func TestTypeErrorsNameTheValue(t *testing.T) {
	long := strings.Repeat("x", 50)
	requireFieldErrors(t, []fieldErrorCase{
		{`{"model":5}`, "model", `field "model" must be a string, not 5`},
		{`{"model":"m","stream":"yes"}`, "stream", `field "stream" must be true or false, not "yes"`},
		{`{"model":"m","stream":1}`, "stream", `field "stream" must be true or false, not 1`},
		{`{"model":"m","messages":{"role":"user"}}`, "messages", `field "messages" must be an array, not {"role":"user"}`},
		{`{"model":"m","user":["` + long + `"]}`, "user", `field "user" must be a string, not an array`},
		{`{"model":"m","messages":["` + long + `"]}`, "messages[0]", `messages[0] must be an object, not a string`},
		{`{"model":"m","input":{"` + long + `":1}}`, "input", `field "input" must be a string or an array, not an object`},
		{`{"model":"m","instructions":false}`, "instructions", `field "instructions" must be a string, not false`},
	})
}

// TestAppendKeyOfNoTextAllocatesNothing: the key of a request without
// text, which names its model, is built without allocating when dst has
// room, as AppendKey documents, whatever the model name's length, and is
// the key of the model name's segment (found in review: the name was
// concatenated, an allocation for a name past 31 bytes, such as
// "meta-llama/Meta-Llama-3.1-70B-Instruct").
func TestAppendKeyOfNoTextAllocatesNothing(t *testing.T) {
	for _, model := range []string{"m", "meta-llama/Meta-Llama-3.1-70B-Instruct", strings.Repeat("m", 255), strings.Repeat("m", 300)} {
		req, err := Parse(Chat, []byte(`{"model":"`+model+`","messages":[{"role":"user","content":""}]}`))
		require.NoError(t, err)
		buf := make(Key, 0, 16)
		key := req.AppendKey(defaultHasher, buf, "", "")
		assert.Equal(t, defaultHasher.AppendSegment(nil, SegmentOther, "\x00"+model), key, model)
		if len(model) < 256 {
			assert.Zero(t, testing.AllocsPerRun(10, func() { key = req.AppendKey(defaultHasher, buf[:0], "", "") }), model)
		}
	}
}

// TestPlainStringPartsAreText: a content list's plain string elements are
// text parts, as vLLM reads them (chat_utils: "Handle plain text parts"),
// so ["hello"] is keyed as [{"type":"text","text":"hello"}] and two lists
// of different strings get different keys (found in review: they were
// dropped, so every such message had no text).
func TestPlainStringPartsAreText(t *testing.T) {
	text := func(content string) string {
		req, err := Parse(Chat, []byte(`{"model":"m","messages":[{"role":"user","content":`+content+`}]}`))
		require.NoError(t, err, content)
		return req.Messages[0].Text
	}
	assert.Equal(t, "hello", text(`["hello"]`))
	assert.Equal(t, text(`[{"type":"text","text":"hello"}]`), text(`["hello"]`))
	assert.Equal(t, `hello{"type":"image_url","image_url":{"url":"x"}}world`, text(`["hello",{"type":"image_url","image_url":{"url":"x"}},"world"]`))
	assert.NotEqual(t, text(`["hello"]`), text(`["bye"]`))
}

// TestDecodeMemberNamesAllocateNothing: Decode's allocations do not grow
// with the number of members of a message or of a content part (their
// names are read without being copied to the heap) (found in review: a
// jsonscan change pushed Reader.Object past the inlining budget, and every
// such name was then copied to the heap: BenchmarkDecodeRequest went from
// 11 to 15 allocations for a small chat).
func TestDecodeMemberNamesAllocateNothing(t *testing.T) {
	body := func(n int) []byte {
		var b strings.Builder
		b.WriteString(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"`)
		for i := range n {
			fmt.Fprintf(&b, `,"part_member_%03d":{"nested":%d}`, i, i)
		}
		b.WriteString(`}]`)
		for i := range n {
			fmt.Fprintf(&b, `,"message_member_%03d":%d`, i, i)
		}
		b.WriteString(`}]}`)
		return []byte(b.String())
	}
	allocs := func(b []byte) float64 {
		return testing.AllocsPerRun(20, func() {
			if _, err := Decode(b); err != nil {
				t.Fatal(err)
			}
		})
	}
	assert.Equal(t, allocs(body(1)), allocs(body(100)))
}

// fieldErrorCase is a body Decode refuses, with the field and message of
// its FieldError.
type fieldErrorCase struct{ body, field, msg string }

// requireFieldErrors checks each case's FieldError.
func requireFieldErrors(t *testing.T, cases []fieldErrorCase) {
	t.Helper()
	for _, tc := range cases {
		_, err := Decode([]byte(tc.body))
		var fe *FieldError
		require.ErrorAs(t, err, &fe, tc.body)
		assert.Equal(t, tc.field, fe.Field, tc.body)
		assert.Equal(t, tc.msg, fe.Msg, tc.body)
	}
}

package front

import (
	"encoding/json"
	"testing"

	"github.com/examlops/gateway/keys"
	"github.com/examlops/gateway/kvevents"
	"github.com/stretchr/testify/require"
)

func TestReadTokenizeInput(t *testing.T) {
	for _, tc := range []struct {
		name        string
		kind        keys.Endpoint
		body        string
		want        kvevents.TokenizeRequest
		tokens      []uint32
		unsupported string
	}{
		{"prompt", keys.Completions, `{"model":"m","prompt":"hi there"}`, kvevents.TokenizeRequest{Model: "m", Prompt: "hi there"}, nil, ""},
		{"last prompt counts", keys.Completions, `{"prompt":["a","b"],"prompt":"x"}`, kvevents.TokenizeRequest{Model: "m", Prompt: "x"}, nil, ""},
		{"token ids", keys.Completions, `{"prompt":[1, 2,4294967295]}`, kvevents.TokenizeRequest{Model: "m"}, []uint32{1, 2, 4294967295}, ""},
		{"token id too large", keys.Completions, `{"prompt":[4294967296]}`, kvevents.TokenizeRequest{Model: "m"}, nil, "prompt"},
		{"negative token id", keys.Completions, `{"prompt":[-1]}`, kvevents.TokenizeRequest{Model: "m"}, nil, "prompt"},
		{"fractional token id", keys.Completions, `{"prompt":[1.5]}`, kvevents.TokenizeRequest{Model: "m"}, []uint32{}, "prompt"},
		{"messages verbatim", keys.Chat, `{"messages": [ {"role":"user","content":"x"} ] ,"tools":[{"type":"function"}],"chat_template_kwargs":{"a":1}}`,
			kvevents.TokenizeRequest{Model: "m", Messages: []byte(`[ {"role":"user","content":"x"} ]`), Tools: []byte(`[{"type":"function"}]`), ChatTemplateKwargs: []byte(`{"a":1}`)}, nil, ""},
		{"null tools", keys.Chat, `{"messages":[],"tools":null}`, kvevents.TokenizeRequest{Model: "m", Messages: []byte(`[]`)}, nil, ""},
		{"prompt ignored in chat", keys.Chat, `{"messages":[],"prompt":"x"}`, kvevents.TokenizeRequest{Model: "m", Messages: []byte(`[]`)}, nil, ""},
		{"chat template", keys.Chat, `{"messages":[],"chat_template":"{{x}}"}`, kvevents.TokenizeRequest{Model: "m", Messages: []byte(`[]`)}, nil, "chat_template"},
		{"add_special_tokens true on completions", keys.Completions, `{"prompt":"x","add_special_tokens":true}`, kvevents.TokenizeRequest{Model: "m", Prompt: "x"}, nil, ""},
		{"add_special_tokens true on chat", keys.Chat, `{"messages":[],"add_special_tokens":true}`, kvevents.TokenizeRequest{Model: "m", Messages: []byte(`[]`)}, nil, "add_special_tokens"},
		{"not an object", keys.Chat, `[1]`, kvevents.TokenizeRequest{Model: "m"}, nil, "body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := ReadTokenizeInput(tc.kind, "m", []byte(tc.body))
			require.Equal(t, tc.unsupported, in.Unsupported)
			if tc.unsupported != "" {
				return
			}
			require.Equal(t, tc.want.Prompt, in.Req.Prompt)
			require.Equal(t, string(tc.want.Messages), string(in.Req.Messages))
			require.Equal(t, string(tc.want.Tools), string(in.Req.Tools))
			require.Equal(t, string(tc.want.ChatTemplateKwargs), string(in.Req.ChatTemplateKwargs))
			require.Equal(t, tc.tokens, in.Tokens)
		})
	}
}

// FuzzReadTokenizeInput: any body that parseRequest accepts is read
// without panicking, and what it reads agrees with encoding/json: the
// messages, tools and template arguments are the last members' text, the
// prompt the last member's string.
func FuzzReadTokenizeInput(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hi"}`, `{"model":"m","prompt":[1,2,3]}`, `{"model":"m","prompt":["a",[1]]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[],"chat_template_kwargs":{}}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"messages":[{"role":"system","content":"y"}]}`,
		`{"model":"m","prompt":"x","cache_salt":"s","add_special_tokens":false}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"add_generation_prompt":"yes"}`,
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, body string, chat bool) {
		kind := keys.Completions
		if chat {
			kind = keys.Chat
		}
		if _, err := Parse(kind, []byte(body)); err != nil {
			return
		}
		in := ReadTokenizeInput(kind, "m", []byte(body))
		if in.Unsupported != "" {
			return
		}
		var ref map[string]json.RawMessage
		if err := json.Unmarshal([]byte(body), &ref); err != nil {
			return // encoding/json is stricter on invalid UTF-8 in names; parseRequest's own fuzz compares them
		}
		if kind == keys.Chat {
			require.JSONEq(t, string(ref["messages"]), string(in.Req.Messages))
			for name, got := range map[string][]byte{"tools": in.Req.Tools, "chat_template_kwargs": in.Req.ChatTemplateKwargs} {
				if want, ok := ref[name]; ok && string(want) != "null" {
					require.JSONEq(t, string(want), string(got), name)
				} else {
					require.Empty(t, got, name)
				}
			}
			return
		}
		if in.HasTokens {
			var ids []uint32
			require.NoError(t, json.Unmarshal(ref["prompt"], &ids))
			require.Equal(t, len(ids), len(in.Tokens))
			return
		}
		var p string
		require.NoError(t, json.Unmarshal(ref["prompt"], &p))
		require.Equal(t, p, in.Req.Prompt)
	})
}

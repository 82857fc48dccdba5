package sseagg

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
)

// FuzzAggregate feeds arbitrary bytes to the SSE/JSON chunk parser, split
// in two reads at an arbitrary point: it never panics, fails only with its
// own errors, gives the same result however the bytes are split, and what
// it assembles is valid JSON within its bound.
func FuzzAggregate(f *testing.F) {
	const head = `"id":"c","object":"chat.completion.chunk","created":1,"model":"m"`
	for _, s := range []string{
		sse(`{`+head+`,"choices":[{"index":0,"delta":{"role":"assistant","content":"hi"},"finish_reason":null}]}`,
			`{`+head+`,"choices":[{"index":0,"delta":{"content":" \ud83d"},"logprobs":{"content":[{"token":"x","logprob":-1}]},"finish_reason":"stop"}]}`,
			`{`+head+`,"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`),
		sse(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","type":"function","function":{"name":"f","arguments":"{"}}]}}]}`,
			`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"}"}}]},"finish_reason":"tool_calls"}]}`),
		sse(`{"id":"t","object":"text_completion","choices":[{"index":1,"text":"b","logprobs":{"tokens":["b"],"text_offset":[0]}},{"index":0,"text":"a"}]}`),
		sse(`{"error":{"message":"boom"}}`),
		": comment\r\ndata: {\"choices\":\r\ndata: []}\r\n\r\ndata: [DONE]",
		": comment\rdata: {\"choices\":\rdata: []}\r\rdata: [DONE]\r\r",
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":1}},{\"index\":0,\"delta\":{\"content\":\"s\"}}]}\n\ndata: [DONE]\n\n",
		"data: {\"choices\":null,\"usage\":null,\"x\":[1,{\"y\":null}]}\n\ndata: [DONE]\n\n",
		"data: [DONE]\n\n",
		"",
	} {
		f.Add([]byte(s), uint16(len(s)/2), true)
		f.Add([]byte(s), uint16(0), false)
	}
	f.Fuzz(func(t *testing.T, b []byte, split uint16, chat bool) {
		const limit, lineLimit = 1 << 16, 1 << 12
		run := func(parts ...[]byte) ([]byte, error) {
			g := New(chat, limit, lineLimit)
			for _, p := range parts {
				if err := g.Feed(p); err != nil {
					return nil, err
				}
			}
			return g.Answer()
		}
		whole, err := run(b)
		if err != nil {
			if !errors.Is(err, ErrAggregate) && !errors.Is(err, ErrStreamEvent) {
				t.Fatalf("error %v is neither ErrAggregate nor ErrStreamEvent", err)
			}
		} else {
			if !json.Valid(whole) {
				t.Fatalf("assembled answer is not valid JSON: %q", whole)
			}
			// Each choice costs at most a few hundred bytes of skeleton on
			// top of what the limit counts.
			if len(whole) > 2*limit+1024 {
				t.Fatalf("answer of %d bytes past the bound", len(whole))
			}
			var m map[string]any
			if json.Unmarshal(whole, &m) != nil {
				t.Fatalf("answer is not an object: %q", whole)
			}
		}
		i := int(split) % (len(b) + 1)
		parts, err2 := run(b[:i], b[i:])
		if (err == nil) != (err2 == nil) || !bytes.Equal(whole, parts) {
			t.Fatalf("split at %d changed the result: %q (%v) vs %q (%v)", i, whole, err, parts, err2)
		}
	})
}

package front

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sseAnswer is a chat stream of the given content chunks, as vLLM sends
// it: a role chunk with empty content, the tokens, an empty last delta
// with the finish reason, then, with usage, a chunk with no choices and
// the usage.
func sseAnswer(tokens []string, usage int) string {
	var b strings.Builder
	ev := func(v any) {
		j, _ := json.Marshal(v)
		fmt.Fprintf(&b, "data: %s\n\n", j)
	}
	choice := func(delta map[string]any) map[string]any {
		return map[string]any{"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m",
			"choices": []any{map[string]any{"index": 0, "delta": delta, "logprobs": nil, "finish_reason": nil}}}
	}
	ev(choice(map[string]any{"role": "assistant", "content": ""}))
	for _, t := range tokens {
		ev(choice(map[string]any{"content": t}))
	}
	ev(choice(map[string]any{"content": ""}))
	if usage >= 0 {
		ev(map[string]any{"id": "chatcmpl-1", "choices": []any{}, "usage": map[string]any{"prompt_tokens": 7, "completion_tokens": usage, "total_tokens": 7 + usage}})
	}
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

func meter(sse bool, parts ...string) (int, bool) {
	var m Meter
	m.Reset(sse)
	for _, p := range parts {
		m.Feed([]byte(p))
	}
	return m.Tokens()
}

func TestMeter(t *testing.T) {
	long := strings.Repeat("x", 5000) // beyond the window
	for _, tc := range []struct {
		name      string
		sse       bool
		answer    string
		want      int
		fromUsage bool
	}{
		{"stream with usage", true, sseAnswer([]string{"a", "b", "c"}, 17), 17, true},
		{"stream without usage counts chunks", true, sseAnswer([]string{"a", "b", "c", "d"}, -1), 4, false},
		{"stream of long chunks", true, sseAnswer([]string{long, long, "\"quoted\" \\\"completion_tokens\\\": 5"}, -1), 3, false},
		{"text containing the name is text", true, sseAnswer([]string{`"completion_tokens": 99`}, -1), 1, false},
		{"completions stream", true, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\ndata: [DONE]\n\n", 2, false},
		{"tool calls", true, "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0}]}}]}\n\n", 1, false},
		{"continuous usage: the last", true, "data: {\"usage\":{\"completion_tokens\":1}}\n\ndata: {\"usage\":{\"completion_tokens\":2}}\n\n", 2, true},
		{"whole answer", false, `{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":12,"total_tokens":15}}`, 12, true},
		{"whole answer, spaces", false, `{"usage": {"completion_tokens" :  12 }}`, 12, true},
		{"whole answer after a long text", false, `{"choices":[{"text":"` + long + `"}],"usage":{"completion_tokens":8}}`, 8, true},
		{"whole answer without usage", false, `{"choices":[{"text":"a"}]}`, 0, false},
		{"responses API", true, "event: response.completed\ndata: {\"response\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":21}}}\n\n", 21, true},
		{"not a count", false, `{"usage":{"completion_tokens":null}}`, 0, false},
		{"too large", false, `{"usage":{"completion_tokens":99999999999}}`, 0, false},
	} {
		n, u := meter(tc.sse, tc.answer)
		assert.Equal(t, tc.want, n, tc.name)
		assert.Equal(t, tc.fromUsage, u, tc.name)
		// Fed a byte at a time: the same.
		parts := strings.Split(tc.answer, "")
		n, u = meter(tc.sse, parts...)
		assert.Equal(t, tc.want, n, tc.name+", by bytes")
		assert.Equal(t, tc.fromUsage, u, tc.name+", by bytes")
	}
}

func TestMeterAllocs(t *testing.T) {
	answer := []byte(sseAnswer([]string{"a", "b", strings.Repeat("y", 3000)}, 3))
	m := new(Meter)
	allocs := testing.AllocsPerRun(100, func() {
		m.Reset(true)
		for i := 0; i < len(answer); i += 100 {
			m.Feed(answer[i:min(i+100, len(answer))])
		}
		_, _ = m.Tokens()
	})
	require.Zero(t, allocs)
}

func BenchmarkMeter(b *testing.B) {
	answer := []byte(sseAnswer(strings.Fields(strings.Repeat("tok ", 200)), 200))
	m := new(Meter)
	b.ReportAllocs()
	b.SetBytes(int64(len(answer)))
	for b.Loop() {
		m.Reset(true)
		m.Feed(answer)
		_, _ = m.Tokens()
	}
}

// FuzzMeter: any answer, cut anywhere, counts as it does whole (the
// count does not depend on how the bytes arrive); never a panic; a
// stream of n tokens with usage u counts u.
func FuzzMeter(f *testing.F) {
	f.Add([]byte(sseAnswer([]string{"a", "b"}, 2)), uint16(7), true)
	f.Add([]byte(sseAnswer([]string{"a", "b"}, -1)), uint16(1), true)
	f.Add([]byte(`{"usage":{"completion_tokens":3}}`), uint16(5), false)
	f.Add([]byte(`"\"\\"completion_tokens":1,`), uint16(2), false)
	f.Fuzz(func(t *testing.T, answer []byte, cut uint16, sse bool) {
		whole, wu := meter(sse, string(answer))
		c := int(cut) % (len(answer) + 1)
		n, u := meter(sse, string(answer[:c]), string(answer[c:]))
		if n != whole || u != wu {
			t.Fatalf("cut at %d: %d,%v; whole: %d,%v", c, n, u, whole, wu)
		}
		if whole < 0 {
			t.Fatalf("negative count %d", whole)
		}
		// Appended to any bytes that end outside a string, a usage
		// chunk is what counts.
		if sse {
			tail := "\n\ndata: {\"choices\":[],\"usage\":{\"completion_tokens\":42}}\n\n"
			if !strings.Contains(string(answer), `"`) {
				if n, u := meter(true, string(answer)+tail); n != 42 || !u {
					t.Fatalf("usage after %q: %d,%v", answer, n, u)
				}
			}
		}
	})
}

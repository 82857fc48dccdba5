package sseagg

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sse frames chunks as an engine's stream, [DONE] included.
func sse(chunks ...string) string {
	var b strings.Builder
	for _, c := range chunks {
		b.WriteString("data: " + c + "\n\n")
	}
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

// aggregate feeds stream to a fresh Aggregator in one piece.
func aggregate(t *testing.T, chat bool, stream string) ([]byte, error) {
	t.Helper()
	g := New(chat, 1<<20, 1<<16)
	if err := g.Feed([]byte(stream)); err != nil {
		return nil, err
	}
	return g.Answer()
}

// A chat stream as vLLM sends it (role first, content, reasoning and tool
// calls in pieces, logprobs per token, finish_reason last, then the usage
// chunk) is assembled into vLLM's non-streamed shape.
func TestAggregateChat(t *testing.T) {
	const head = `"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"m","system_fingerprint":"fp"`
	stream := sse(
		`{`+head+`,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
		`{`+head+`,"choices":[{"index":0,"delta":{"reasoning_content":"think "},"logprobs":null,"finish_reason":null}]}`,
		`{`+head+`,"choices":[{"index":0,"delta":{"reasoning_content":"more"},"finish_reason":null}]}`,
		`{`+head+`,"choices":[{"index":0,"delta":{"content":"Hel"},"logprobs":{"content":[{"token":"Hel","logprob":-0.1,"bytes":[72,101,108],"top_logprobs":[]}]},"finish_reason":null}]}`,
		`{`+head+`,"choices":[{"index":0,"delta":{"content":"lo \"q\"\n\ud83d"},"logprobs":{"content":[{"token":"lo","logprob":-0.2,"bytes":null,"top_logprobs":[]}]},"finish_reason":null}]}`,
		`{`+head+`,"choices":[{"index":0,"delta":{"content":"\ude00"},"logprobs":{"content":[]},"finish_reason":null}]}`,
		`{`+head+`,"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"get_","arguments":""}}]}}]}`,
		`{`+head+`,"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"f2","arguments":"{\"x\""}}]}}]}`,
		`{`+head+`,"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"weather","arguments":"{\"city\":"}}]}}]}`,
		`{`+head+`,"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"","function":{"arguments":":1}"}},{"index":0,"function":{"arguments":"\"Paris\"}"}}]}}]}`,
		`{`+head+`,"choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"tool_calls","stop_reason":null}]}`,
		`{`+head+`,"choices":[],"usage":{"prompt_tokens":7,"total_tokens":17,"completion_tokens":10,"prompt_tokens_details":null}}`,
	)
	got, err := aggregate(t, true, stream)
	require.NoError(t, err)
	require.True(t, json.Valid(got), "%s", got)
	assert.JSONEq(t, `{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"m","system_fingerprint":"fp",
		"choices":[{"index":0,"message":{"role":"assistant","content":"Hello \"q\"\n😀","reasoning_content":"think more",
			"tool_calls":[{"id":"call_a","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},
				{"id":"call_b","type":"function","function":{"name":"f2","arguments":"{\"x\":1}"}}]},
			"logprobs":{"content":[{"token":"Hel","logprob":-0.1,"bytes":[72,101,108],"top_logprobs":[]},{"token":"lo","logprob":-0.2,"bytes":null,"top_logprobs":[]}]},
			"finish_reason":"tool_calls","stop_reason":null}],
		"usage":{"prompt_tokens":7,"total_tokens":17,"completion_tokens":10,"prompt_tokens_details":null}}`, string(got))
	// The top level keeps the engine's order, choices where they came.
	assert.True(t, strings.HasPrefix(string(got), `{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"m","system_fingerprint":"fp","choices":[`), "%s", got)
}

// Completions with n=2: choices interleaved and out of order are sorted by
// index; text and each logprobs array are joined.
func TestAggregateCompletions(t *testing.T) {
	const head = `"id":"cmpl-1","object":"text_completion","created":5,"model":"m"`
	lp := func(tok string, off int) string {
		return `{"text_offset":[` + itoa(off) + `],"token_logprobs":[-1.5],"tokens":["` + tok + `"],"top_logprobs":[{"` + tok + `":-1.5}]}`
	}
	stream := sse(
		`{`+head+`,"choices":[{"index":1,"text":"B1","logprobs":`+lp("B1", 0)+`,"finish_reason":null}],"usage":null}`,
		`{`+head+`,"choices":[{"index":0,"text":"A1","logprobs":`+lp("A1", 0)+`,"finish_reason":null}],"usage":null}`,
		`{`+head+`,"choices":[{"index":0,"text":" A2","logprobs":`+lp(" A2", 2)+`,"finish_reason":"length","stop_reason":null}],"usage":null}`,
		`{`+head+`,"choices":[{"index":1,"text":"","logprobs":null,"finish_reason":"stop","stop_reason":"</s>"}],"usage":null}`,
		`{`+head+`,"choices":[],"usage":{"prompt_tokens":3,"total_tokens":6,"completion_tokens":3}}`,
	)
	got, err := aggregate(t, false, stream)
	require.NoError(t, err)
	assert.JSONEq(t, `{"id":"cmpl-1","object":"text_completion","created":5,"model":"m",
		"choices":[
			{"index":0,"text":"A1 A2","logprobs":{"text_offset":[0,2],"token_logprobs":[-1.5,-1.5],"tokens":["A1"," A2"],"top_logprobs":[{"A1":-1.5},{" A2":-1.5}]},"finish_reason":"length","stop_reason":null},
			{"index":1,"text":"B1","logprobs":{"text_offset":[0],"token_logprobs":[-1.5],"tokens":["B1"],"top_logprobs":[{"B1":-1.5}]},"finish_reason":"stop","stop_reason":"</s>"}],
		"usage":{"prompt_tokens":3,"total_tokens":6,"completion_tokens":3}}`, string(got))
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

// However the stream is cut into reads, the answer is the same; CRLF line
// ends, comments, other fields and multi-line data are read as SSE says.
func TestAggregateSplitReads(t *testing.T) {
	stream := ": keep-alive\r\nevent: message\r\nid: 1\r\ndata: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\r\ndata: \"choices\":[{\"index\":0,\"delta\":{\"content\":\"ab\"}}]}\r\n\r\n" +
		"data:{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"c\"},\"finish_reason\":\"stop\"}]}\n\n" +
		"data: [DONE]\n\n"
	want, err := aggregate(t, true, stream)
	require.NoError(t, err)
	assert.JSONEq(t, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"abc"},"logprobs":null,"finish_reason":"stop"}]}`, string(want))
	requireEverySplit(t, stream, string(want))
}

func TestAggregateErrors(t *testing.T) {
	ok := `{"id":"x","choices":[{"index":0,"delta":{"content":"hi"}}]}`
	big := `{"choices":[{"index":0,"delta":{"content":"` + strings.Repeat("y", 200) + `"}}]}`
	tests := []struct {
		name, stream string
		want         error
		msg          string
	}{
		{"error event", sse(ok, `{"error":{"message":"boom","type":"BadRequestError","code":400}}`), ErrStreamEvent, `"message":"boom"`},
		{"no [DONE]", "data: " + ok + "\n\n", ErrAggregate, "ended before its data: [DONE]"},
		{"only [DONE]", sse(), ErrAggregate, "no chunk"},
		{"not JSON", sse(`{"id":`), ErrAggregate, "a chunk"},
		{"not an object", sse(`[1]`), ErrAggregate, "not a JSON object"},
		{"data after the chunk", sse(ok + ` {}`), ErrAggregate, "data after the chunk"},
		{"bad index", sse(`{"choices":[{"index":-1}]}`), ErrAggregate, "choices[].index -1"},
		{"index too large", sse(`{"choices":[{"index":4096}]}`), ErrAggregate, "choices[].index 4096"},
		{"choice not an object", sse(`{"choices":[1]}`), ErrAggregate, "a choice is not an object"},
		{"tool call not an object", sse(`{"choices":[{"delta":{"tool_calls":[1]}}]}`), ErrAggregate, "a tool call is not an object"},
		{"line too long", "data: " + strings.Repeat("x", 300) + "\n\n", ErrAggregate, "an SSE line exceeds 256 bytes"},
		{"event too long", strings.Repeat("data: "+strings.Repeat("x", 100)+"\n", 3) + "\n", ErrAggregate, "an SSE event exceeds 256 bytes"},
		{"answer too large", sse(big, big, big), ErrAggregate, "the answer exceeds 512 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := New(true, 512, 256)
			err := g.Feed([]byte(tt.stream))
			if err == nil {
				_, err = g.Answer()
			}
			require.Error(t, err)
			assert.True(t, errors.Is(err, tt.want), "%v", err)
			assert.Contains(t, err.Error(), tt.msg)
		})
	}
}

// Nothing after [DONE] counts; a last [DONE] without its blank line ends
// the stream too.
func TestAggregateDone(t *testing.T) {
	ok := `{"choices":[{"index":0,"delta":{"content":"hi"}}]}`
	got, err := aggregate(t, true, sse(ok)+"data: {not json}\n\n")
	require.NoError(t, err)
	assert.Contains(t, string(got), `"content":"hi"`)
	got, err = aggregate(t, true, "data: "+ok+"\n\ndata: [DONE]")
	require.NoError(t, err)
	assert.Contains(t, string(got), `"content":"hi"`)
}

// Parts gives the answer with its long values by reference (the
// Aggregator's own buffers, no second copy), equal to Answer; Held counts
// the buffers' capacity, at least the content and the partial line.
func TestPartsAndHeld(t *testing.T) {
	const head = `{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"`
	g := New(true, 1<<24, 1<<20)
	piece := strings.Repeat("x", 8<<10)
	for range 64 {
		require.NoError(t, g.Feed([]byte("data: "+head+piece+`"}}]}`+"\n\n")))
	}
	assert.GreaterOrEqual(t, g.Held(), 64*len(piece), "the content's capacity is held")
	held := g.Held()
	// A partial line held across feeds counts too.
	require.NoError(t, g.Feed([]byte("data: "+head+piece)))
	assert.GreaterOrEqual(t, g.Held(), held+len(piece))
	require.NoError(t, g.Feed([]byte(`"}}]}`+"\n\ndata: [DONE]\n\n")))

	parts, n, err := g.Parts()
	require.NoError(t, err)
	content := &g.choices[0].msg.ms[0]
	require.Len(t, content.full, 65*len(piece)/blockSize, "the content is held in blocks")
	byRef := map[*byte]bool{}
	var joined []byte
	for _, p := range parts {
		joined = append(joined, p...)
		byRef[&p[0]] = true
	}
	for _, b := range content.full {
		assert.True(t, byRef[&b[0]], "a block is in the answer by reference, not copied")
	}
	assert.Equal(t, n, len(joined))
	whole, err := g.Answer()
	require.NoError(t, err)
	assert.Equal(t, string(whole), string(joined))
	var v struct {
		Choices []struct{ Message struct{ Content string } }
	}
	require.NoError(t, json.Unmarshal(whole, &v))
	assert.Equal(t, 65*len(piece), len(v.Choices[0].Message.Content))
}

// Chunks written with white space between tokens, as Python's json.dumps
// writes them by default (llama-cpp-python's server streams so), assemble
// as their compact form does: "index": 0 is an index, and "id": "" leaves
// a tool call's id as it was.
func TestAggregateWhiteSpace(t *testing.T) {
	compact := sse(
		`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"hi","tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"f","arguments":"{"}}]},"finish_reason":null}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"","function":{"arguments":"}"}}]},"finish_reason":"tool_calls"}]}`,
		`{"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`)
	spaced := sse(
		`{"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi", "tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{"}}]}, "finish_reason": null}]}`,
		`{"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "", "function": {"arguments": "}"}}]}, "finish_reason": "tool_calls"}]}`,
		`{"id": "c", "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}}`)
	want, err := aggregate(t, true, compact)
	require.NoError(t, err)
	got, err := aggregate(t, true, spaced)
	require.NoError(t, err)
	assert.JSONEq(t, string(want), string(got))
	assert.Contains(t, string(got), `"id":"call_a"`)
}

// A line ends at CRLF, LF or a lone CR, as the WHATWG event-stream rules
// say, however the stream is cut into reads (a CRLF cut between two reads
// is one line end, not two).
func TestAggregateLineEnds(t *testing.T) {
	events := []string{
		": c",
		`data: {"id":"x","object":"chat.completion.chunk",`,
		`data: "choices":[{"index":0,"delta":{"content":"ab"}}]}`,
		"",
		`data:{"choices":[{"index":0,"delta":{"content":"c"},"finish_reason":"stop"}]}`,
		"",
		"data: [DONE]",
		"",
	}
	want := `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"abc"},"logprobs":null,"finish_reason":"stop"}]}`
	for _, end := range []string{"\n", "\r\n", "\r"} {
		stream := strings.Join(events, end)
		t.Run(fmt.Sprintf("%q", end), func(t *testing.T) { requireEverySplit(t, stream, want) })
	}
	// A CR then an LF in the next read is one line end: the event goes
	// on past it.
	g := New(true, 1<<20, 1<<16)
	for _, p := range []string{"data: {\"choices\":\r", "\ndata: []}\r", "\n\r", "\ndata: [DONE]\r", "\n\r", "\n"} {
		require.NoError(t, g.Feed([]byte(p)))
	}
	_, err := g.Answer()
	require.NoError(t, err)
}

// An object of the stream (a chunk, a choice, a delta, a logprobs object)
// holds at most maxAggMembers distinct members, so that finding a member
// stays cheap: past it the stream fails at once, naming the bound, rather
// than each member costing a scan of all the others (a 430 KB chunk of
// 40,000 members took 12s before; an 8 MiB one would take hours).
func TestAggregateMembersBound(t *testing.T) {
	obj := func(prefix string, n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, `,"%s%d":1`, prefix, i)
		}
		return b.String()
	}
	choice := `"choices":[{"index":0,"delta":{"content":"x"}}]`
	for _, tt := range []struct{ name, chunk string }{
		{"chunk", `{` + choice + obj("k", maxAggMembers+1) + `}`},
		{"choice", `{"choices":[{"index":0` + obj("k", maxAggMembers+1) + `}]}`},
		{"delta", `{"choices":[{"index":0,"delta":{"content":"x"` + obj("k", maxAggMembers+1) + `}}]}`},
		{"logprobs", `{"choices":[{"index":0,"logprobs":{"content":[]` + obj("k", maxAggMembers+1) + `}}]}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := New(true, 1<<24, 1<<22)
			err := g.Feed([]byte(sse(tt.chunk)))
			require.ErrorIs(t, err, ErrAggregate)
			assert.Contains(t, err.Error(), fmt.Sprintf("more than %d members", maxAggMembers))
		})
	}
	// At the bound, and with members repeated, the answer is assembled.
	_, err := aggregate(t, true, sse(`{`+choice+obj("k", maxAggMembers-2)+`}`, `{`+choice+obj("k", maxAggMembers-2)+`}`))
	require.NoError(t, err)
}

// A byte order mark at the start of the stream is ignored, as the WHATWG
// event-stream rules say, however the stream is cut into reads; one
// anywhere else is part of its line.
func TestAggregateBOM(t *testing.T) {
	body := sse(`{"id":"x","choices":[{"index":0,"delta":{"content":"a"}}]}`, `{"choices":[{"index":0,"delta":{"content":"b"}}]}`)
	want, err := aggregate(t, true, body)
	require.NoError(t, err)
	stream := "\ufeff" + body
	requireEverySplit(t, stream, string(want))
	// A second mark, or one after the first line, is not ignored: that
	// line's field is not "data".
	got, err := aggregate(t, true, "\ufeff\ufeff"+body)
	require.NoError(t, err)
	assert.NotContains(t, string(got), `"content":"ab"`)
}

// requireEverySplit checks that stream, fed to a chat Aggregator in two
// reads cut at every byte, assembles into want each time.
func requireEverySplit(t *testing.T, stream, want string) {
	t.Helper()
	for i := 0; i <= len(stream); i++ {
		g := New(true, 1<<20, 1<<16)
		require.NoError(t, g.Feed([]byte(stream[:i])))
		require.NoError(t, g.Feed([]byte(stream[i:])))
		got, err := g.Answer()
		require.NoError(t, err, "split at %d", i)
		require.Equal(t, want, string(got), "split at %d", i)
	}
}

// ForBodies caps its bounds at 1 TiB however large the body bound: one
// past a quarter of the int64 range does not wrap the answer's bound
// (four times it) to a negative number that refuses every answer.
func TestForBodiesHuge(t *testing.T) {
	for _, maxBody := range []int64{1 << 40, 1 << 61, 1 << 62, math.MaxInt64} {
		g := ForBodies(true, maxBody)
		require.NoError(t, g.Feed([]byte(sse(`{"choices":[{"index":0,"delta":{"content":"hi"}}]}`))), "maxBody %d", maxBody)
		_, err := g.Answer()
		require.NoError(t, err, "maxBody %d", maxBody)
		assert.Equal(t, 1<<40, g.limit, "maxBody %d", maxBody)
		assert.Equal(t, 1<<40, g.lineLimit, "maxBody %d", maxBody)
	}
}

// Past indexAfter choices, tool calls and members are found through maps:
// a stream of 20 choices, each with 10 tool calls, and 12 top-level
// members, all named in reverse order in every round, is assembled as a
// scan would assemble it.
func TestAggregateManyIndexes(t *testing.T) {
	const choices, tools, members, rounds = 20, 10, 12, 3
	var chunks []string
	for r := range rounds {
		for i := choices - 1; i >= 0; i-- {
			var tc []string
			for k := tools - 1; k >= 0; k-- {
				tc = append(tc, fmt.Sprintf(`{"index":%d,"id":"call_%d_%d","function":{"name":"%s","arguments":"a%dr%d"}}`,
					k, i, k, map[bool]string{true: "f", false: ""}[r == 0], k, r))
			}
			var top []string
			for j := members - 1; j >= 0; j-- {
				top = append(top, fmt.Sprintf(`"x_%d":%d`, j, r))
			}
			chunks = append(chunks, fmt.Sprintf(`{%s,"choices":[{"index":%d,"delta":{"content":"c%dr%d","tool_calls":[%s]}}]}`,
				strings.Join(top, ","), i, i, r, strings.Join(tc, ",")))
		}
	}
	got, err := aggregate(t, true, sse(chunks...))
	require.NoError(t, err)
	var answer struct {
		Choices []struct {
			Index   int
			Message struct {
				Content   string
				ToolCalls []struct {
					ID       string
					Function struct{ Name, Arguments string }
				} `json:"tool_calls"`
			}
		}
	}
	require.NoError(t, json.Unmarshal(got, &answer), "%s", got)
	var top map[string]any
	require.NoError(t, json.Unmarshal(got, &top))
	for j := range members {
		assert.Equal(t, float64(rounds-1), top[fmt.Sprintf("x_%d", j)], "x_%d", j)
	}
	require.Len(t, answer.Choices, choices)
	for i, c := range answer.Choices {
		assert.Equal(t, i, c.Index)
		assert.Equal(t, fmt.Sprintf("c%dr0c%dr1c%dr2", i, i, i), c.Message.Content)
		require.Len(t, c.Message.ToolCalls, tools)
		for k, tc := range c.Message.ToolCalls {
			assert.Equal(t, fmt.Sprintf("call_%d_%d", i, k), tc.ID)
			assert.Equal(t, "f", tc.Function.Name)
			assert.Equal(t, fmt.Sprintf("a%dr0a%dr1a%dr2", k, k, k), tc.Function.Arguments)
		}
	}
}

package sseagg

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// benchStream is a vLLM-like chat stream of n one-token chunks, then the
// finish and usage chunks.
func benchStream(n int) []byte {
	const head = `{"id":"chatcmpl-0123456789abcdef","object":"chat.completion.chunk","created":1700000000,"model":"meta-llama/Llama-3.1-8B-Instruct"`
	var b strings.Builder
	b.WriteString("data: " + head + `,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	for i := range n {
		fmt.Fprintf(&b, "data: %s,\"choices\":[{\"index\":0,\"delta\":{\"content\":\" tok%d\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n", head, i)
	}
	b.WriteString("data: " + head + `,"choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"length","stop_reason":null}]}` + "\n\n")
	b.WriteString("data: " + head + `,"choices":[],"usage":{"prompt_tokens":20,"total_tokens":` + fmt.Sprint(20+n) + `,"completion_tokens":` + fmt.Sprint(n) + `}}` + "\n\n")
	b.WriteString("data: [DONE]\n\n")
	return []byte(b.String())
}

// BenchmarkAggregate times assembling a 256-token answer from its stream,
// read in 32 KiB pieces as the relay reads it ("aggregate"), against
// finding the stream's lines alone ("scan", the least any reader of the
// stream does). The figure per chunk is ns/op divided by 258.
func BenchmarkAggregate(b *testing.B) {
	stream := benchStream(256)
	feed := func(f func([]byte)) {
		for p := stream; len(p) > 0; {
			n := min(len(p), 32<<10)
			f(p[:n])
			p = p[n:]
		}
	}
	b.Run("aggregate", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(stream)))
		for b.Loop() {
			g := New(true, 32<<20, 8<<20)
			feed(func(p []byte) {
				if err := g.Feed(p); err != nil {
					b.Fatal(err)
				}
			})
			if _, err := g.Answer(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("scan", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(stream)))
		lines := 0
		for b.Loop() {
			feed(func(p []byte) { lines += bytes.Count(p, []byte("\n")) })
		}
		_ = lines
	})
}

// BenchmarkAggregateLookups times events that make the Aggregator find a
// choice, a tool call or a member among the most it holds (4,096 choices,
// 4,096 tool calls of one choice, 256 members), as a hostile engine's
// stream can: the figure to set against BenchmarkAggregate's MB/s.
func BenchmarkAggregateLookups(b *testing.B) {
	var choices, choiceEv, tools, toolEv, members, memberEv strings.Builder
	for i := range maxAggChoices {
		fmt.Fprintf(&choices, "data: {\"choices\":[{\"index\":%d}]}\n\n", i)
	}
	choiceEv.WriteString(`data: {"choices":[`)
	tools.WriteString(`data: {"choices":[{"index":0,"delta":{"tool_calls":[`)
	toolEv.WriteString(`data: {"choices":[{"index":0,"delta":{"tool_calls":[`)
	for i := range maxAggChoices {
		sep := map[bool]string{true: "", false: ","}[i == 0]
		fmt.Fprintf(&choiceEv, `%s{"index":%d}`, sep, maxAggChoices-1)
		fmt.Fprintf(&tools, `%s{"index":%d}`, sep, i)
		fmt.Fprintf(&toolEv, `%s{"index":%d}`, sep, maxAggChoices-1)
	}
	choiceEv.WriteString("]}\n\n")
	tools.WriteString("]}}]}\n\n")
	toolEv.WriteString("]}}]}\n\n")
	// "choices" and 255 members, the last of them looked up again and again.
	members.WriteString(`data: {"choices":[]`)
	memberEv.WriteString(`data: {"m_254":1`)
	for i := range maxAggMembers - 1 {
		fmt.Fprintf(&members, `,"m_%03d":1`, i)
		memberEv.WriteString(`,"m_254":1`)
	}
	members.WriteString("}\n\n")
	memberEv.WriteString("}\n\n")
	for _, bb := range []struct{ name, setup, event string }{
		{"choices", choices.String(), choiceEv.String()},
		{"tool_calls", tools.String(), toolEv.String()},
		{"members", members.String(), memberEv.String()},
	} {
		b.Run(bb.name, func(b *testing.B) {
			g := New(true, 32<<20, 8<<20)
			if err := g.Feed([]byte(bb.setup)); err != nil {
				b.Fatal(err)
			}
			ev := []byte(bb.event)
			b.SetBytes(int64(len(ev)))
			for b.Loop() {
				if err := g.Feed(ev); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

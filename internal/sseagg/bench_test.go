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

package sseagg

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
)

// TestAggregateMemory measures what an Aggregator holds at its bounds: the
// heap in use, after a collection, with the aggregator still alive, once
// it has been fed (a) an answer whose content fills the limit the HTTP
// gateway gives it (4×MaxBodyBytes, 32 MiB by default) and (b) one chunk
// for each of maxAggChoices choices; and (c) what a usual answer holds.
// Run:
//
//	EXA_MEASURE=1 go test ./internal/sseagg -run TestAggregateMemory -v
func TestAggregateMemory(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("measurement: set EXA_MEASURE=1")
	}
	const limit, lineLimit = 32 << 20, 8 << 20
	const head = `{"id":"c","object":"chat.completion.chunk","created":1,"model":"m"`
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	feed := func(g *Aggregator, chunk func(i int) string, n int) (int, error) {
		fed := 0
		for i := range n {
			ev := "data: " + head + `,"choices":[` + chunk(i) + "]}\n\n"
			if err := g.Feed([]byte(ev)); err != nil {
				return fed, err
			}
			fed += len(ev)
		}
		return fed, nil
	}

	piece := strings.Repeat("x", 64<<10)
	before := heap()
	g := New(true, limit, lineLimit)
	fed, err := feed(g, func(int) string { return `{"index":0,"delta":{"content":"` + piece + `"}}` }, limit/len(piece)+8)
	after := heap()
	t.Logf("content to the limit: fed %.1f MiB before %v; heap +%.1f MiB", float64(fed)/(1<<20), err, float64(after-before)/(1<<20))
	runtime.KeepAlive(g)

	before = heap()
	g = New(true, limit, lineLimit)
	fed, err = feed(g, func(i int) string { return fmt.Sprintf(`{"index":%d,"delta":{"content":"x"}}`, i) }, maxAggChoices)
	after = heap()
	t.Logf("%d choices: fed %.1f KiB (err %v); heap +%.1f KiB", maxAggChoices, float64(fed)/(1<<10), err, float64(after-before)/(1<<10))
	runtime.KeepAlive(g)

	// (c) A usual answer: 2,000 tokens of 4 bytes, a chunk each, as vLLM
	// streams them, fed in 32 KiB reads as the gateway does; Held is
	// what the gateway charges (twice) against MaxAssembledBytes.
	tok := "data: " + head + `,"choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}` + "\n\n"
	stream := []byte(strings.Repeat(tok, 2000) + "data: " + head + `,"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2000,"total_tokens":2010}}` + "\n\ndata: [DONE]\n\n")
	g = New(true, limit, lineLimit)
	for i := 0; i < len(stream); i += 32 << 10 {
		if err := g.Feed(stream[i:min(i+32<<10, len(stream))]); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("2,000 tokens: fed %.1f KiB; Held %.1f KiB", float64(len(stream))/(1<<10), float64(g.Held())/(1<<10))
}

// Held covers the live heap of an answer made of many small pieces (many
// choices, many tool calls, many members), whose weight is the
// aggregator's own structures rather than its byte buffers: the gateway
// charges its budget by Held.
func TestHeldCoversStructures(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes what is allocated")
	}
	const head = `{"id":"c","object":"chat.completion.chunk","created":1,"model":"m"`
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	for _, tt := range []struct {
		name  string
		chunk func(i int) string
		n     int
	}{
		{"choices", func(i int) string { return fmt.Sprintf(`{"index":%d,"delta":{"content":"x"}}`, i) }, maxAggChoices},
		{"choices with members", func(i int) string {
			return fmt.Sprintf(`{"index":%d,"delta":{"content":"x","role":"assistant"},"logprobs":{"content":[1]},"finish_reason":"stop","stop_reason":null}`, i)
		}, maxAggChoices},
		{"choices with many members", func(i int) string {
			// Past indexAfter: each choice's members are found through a map.
			var b strings.Builder
			fmt.Fprintf(&b, `{"index":%d,"delta":{"content":"x"}`, i)
			for j := range 24 {
				fmt.Fprintf(&b, `,"member_%d":%d`, j, j)
			}
			return b.String() + "}"
		}, 1024},
		{"tool calls", func(i int) string {
			return fmt.Sprintf(`{"index":0,"delta":{"tool_calls":[{"index":%d,"id":"a","type":"function","function":{"name":"f","arguments":"x"}}]}}`, i)
		}, maxAggChoices},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := heap()
			g := New(true, 32<<20, 8<<20)
			for i := range tt.n {
				if err := g.Feed([]byte("data: " + head + `,"choices":[` + tt.chunk(i) + "]}\n\n")); err != nil {
					t.Fatal(err)
				}
			}
			live := int64(heap()) - int64(before)
			runtime.KeepAlive(g)
			// A tenth of slack: the allocator rounds sizes up to its
			// classes, which Held does not count.
			if int64(g.Held()) < live*9/10 {
				t.Fatalf("Held %d KiB, live heap +%d KiB", g.Held()>>10, live>>10)
			}
			t.Logf("Held %d KiB, live heap +%d KiB", g.Held()>>10, live>>10)
		})
	}
}

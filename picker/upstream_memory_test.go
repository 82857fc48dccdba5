package picker

import (
	"context"
	"io"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// gateStream serves msgs, then signals reached and blocks until more
// messages come on rest (closed: io.EOF). It discards what is sent.
type gateStream struct {
	msgs    []*extprocv3.ProcessingRequest
	reached chan struct{}
	rest    chan *extprocv3.ProcessingRequest
	once    sync.Once
}

func (g *gateStream) Context() context.Context { return context.Background() }
func (g *gateStream) Send(*extprocv3.ProcessingResponse) error {
	return nil
}
func (g *gateStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if len(g.msgs) > 0 {
		m := g.msgs[0]
		g.msgs = g.msgs[1:]
		return m, nil
	}
	g.once.Do(func() { close(g.reached) })
	m, ok := <-g.rest
	if !ok {
		return nil, io.EOF
	}
	return m, nil
}

// TestAssembleMemory measures what answers being assembled hold against
// what the picker charges them (Stats.AssembledBytes): n streams, each
// fed the whole of an answer's stream but its end, held there while the
// heap in use is read after a collection. Run:
//
//	EXA_MEASURE=1 go test ./picker -run TestAssembleMemory -v
func TestAssembleMemory(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("measurement: set EXA_MEASURE=1")
	}
	const head = `{"id":"c","object":"chat.completion.chunk","created":1,"model":"m1"`
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	tok := "data: " + head + `,"choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}` + "\n\n"
	big := "data: " + head + `,"choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", 64<<10) + `"}}]}` + "\n\n"
	for _, tc := range []struct {
		name   string
		n      int
		stream string
	}{
		{"2,000-token answers, a token a chunk", 200, strings.Repeat(tok, 2000)},
		{"4 MiB answers", 20, strings.Repeat(big, 64)},
	} {
		s, err := New(&asmRouter{assemble: AssembleChat, st: &memStream{}}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		streams := make([]*gateStream, tc.n)
		for i := range streams {
			msgs := []*extprocv3.ProcessingRequest{reqHeaders(false, nil), reqBody([]byte(`{"model":"m1","messages":[{"role":"user","content":"hi"}]}`), true),
				respHeaders(false, ":status", "200", "content-type", "text/event-stream")}
			for off := 0; off < len(tc.stream); off += 32 << 10 { // Envoy's reads
				msgs = append(msgs, respBody([]byte(tc.stream[off:min(off+32<<10, len(tc.stream))]), false))
			}
			streams[i] = &gateStream{msgs: msgs, reached: make(chan struct{}), rest: make(chan *extprocv3.ProcessingRequest, 1)}
		}
		// The messages are built first: the heap's growth is then what
		// the exchanges hold (and their goroutines' stacks).
		before := heap()
		for _, g := range streams {
			wg.Add(1)
			go func() { defer wg.Done(); _ = s.serve(g) }()
		}
		for _, g := range streams {
			<-g.reached
		}
		during := heap()
		st := s.Stats()
		for _, g := range streams {
			g.rest <- respBody([]byte("data: [DONE]\n\n"), true)
			close(g.rest)
		}
		wg.Wait()
		t.Logf("%s: %d at once, %.1f KiB of stream each: heap +%.1f KiB each; charged (AssembledBytes) %.1f KiB each, ReservedBytes %.1f MiB in all; after: AssembledBytes %d",
			tc.name, tc.n, float64(len(tc.stream))/1024, float64(int64(during)-int64(before))/1024/float64(tc.n),
			float64(st.AssembledBytes)/1024/float64(tc.n), float64(st.ReservedBytes)/(1<<20), s.Stats().AssembledBytes)
	}
}

// BenchmarkAssemble measures one whole exchange whose non-streamed
// answer, 256 tokens streamed a token a chunk in 32 KiB reads, is
// assembled, against the same stream relayed as it is (Assemble off), both
// served from memory (no gRPC).
//
//	go test ./picker -run '^$' -bench Assemble -benchmem
func BenchmarkAssemble(b *testing.B) {
	const head = `{"id":"c","object":"chat.completion.chunk","created":1,"model":"m1"`
	tok := "data: " + head + `,"choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}` + "\n\n"
	stream := strings.Repeat(tok, 256) + "data: " + head + `,"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":256,"total_tokens":261}}` + "\n\ndata: [DONE]\n\n"
	msgs := []*extprocv3.ProcessingRequest{reqHeaders(false, nil), reqBody([]byte(`{"model":"m1","messages":[{"role":"user","content":"hi"}]}`), true),
		respHeaders(false, ":status", "200", "content-type", "text/event-stream")}
	for off := 0; off < len(stream); off += 32 << 10 {
		end := min(off+32<<10, len(stream))
		msgs = append(msgs, respBody([]byte(stream[off:end]), end == len(stream)))
	}
	for _, a := range []Assembly{AssembleChat, AssembleNone} {
		b.Run(map[Assembly]string{AssembleChat: "assembled", AssembleNone: "relayed"}[a], func(b *testing.B) {
			st := &memStream{ctx: context.Background()}
			s, err := New(&asmRouter{assemble: a, st: st}, Options{})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				st.msgs, st.sent = msgs, st.sent[:0]
				if err := s.serve(st); err != nil {
					b.Fatal(err)
				}
			}
			if s.Stats().ReservedBytes != 0 {
				b.Fatal("reservations left")
			}
		})
	}
}

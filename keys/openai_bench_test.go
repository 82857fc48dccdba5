package keys

import (
	"encoding/json"
	"strings"
	"testing"
)

// decodeBodies are typical requests: a small chat, a chat with a 4 KB
// system prompt, and a RAG request carrying 64 KB of retrieved passages.
func decodeBodies() []struct {
	name string
	body []byte
} {
	passage := "The contract's termination clause (section 14.2) allows either party to end the agreement with ninety days' written notice; \"cause\" is defined in 1.7. "
	rag, _ := json.Marshal(map[string]any{"model": "m1", "stream": true, "max_tokens": 256, "temperature": 0.2,
		"messages": []map[string]any{
			{"role": "system", "content": "Answer from the passages only; cite them as [n]."},
			{"role": "user", "content": []map[string]any{
				{"type": "text", "text": strings.Repeat(passage, 64<<10/len(passage))},
				{"type": "text", "text": "Question: how can the agreement be ended?"},
			}},
		}})
	return []struct {
		name string
		body []byte
	}{
		{"chat-small", benchBody},
		{"chat-sys4k", []byte(chatBody("m1", true, strings.Repeat("You are a helpful assistant for the ACME corporation. ", 4<<10/54),
			"What does clause 14.2 say?", "It covers termination.", "And the notice period?"))},
		{"rag-64k", rag},
	}
}

// BenchmarkDecodeRequest is the A/B of the request decoders: the one-pass
// decoder (jsonscan) against encoding/json with the same rules
// (decodeStd). Run it interleaved, e.g.
//
//	go test -c -o /tmp/keys.test ./keys
//	for i in $(seq 10); do /tmp/keys.test -test.run '^$' -test.bench BenchmarkDecodeRequest -test.benchmem; done > dec.txt
//	benchstat -col /decoder dec.txt
func BenchmarkDecodeRequest(b *testing.B) {
	decoders := []struct {
		name   string
		decode func([]byte) (*Request, error)
	}{{"jsonscan", Decode}, {"encoding-json", decodeStd}}
	for _, in := range decodeBodies() {
		for _, d := range decoders {
			b.Run("body="+in.name+"/decoder="+d.name, func(b *testing.B) {
				b.SetBytes(int64(len(in.body)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := d.decode(in.body); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// chatBody is a chat request body: the first message the system's, then
// user and assistant turns.
func chatBody(model string, stream bool, msgs ...string) string {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var ms []msg
	for i, m := range msgs {
		role := "user"
		switch {
		case i == 0:
			role = "system"
		case i%2 == 0:
			role = "assistant"
		}
		ms = append(ms, msg{role, m})
	}
	b, _ := json.Marshal(map[string]any{"model": model, "messages": ms, "stream": stream, "max_tokens": 4})
	return string(b)
}

// benchBody is a small chat request, as the HTTP gateway's benchmarks send.
var benchBody = []byte(`{"model":"m1","max_tokens":1,"messages":[{"role":"system","content":"You are a terse assistant that answers in one word."},{"role":"user","content":"Say one word."}]}`)

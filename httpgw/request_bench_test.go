package httpgw

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
// (decodeRequestStd). Run it interleaved, e.g.
//
//	go test -c -o /tmp/gw.test ./httpgw
//	for i in $(seq 10); do /tmp/gw.test -test.run '^$' -test.bench BenchmarkDecodeRequest -test.benchmem; done > dec.txt
//	benchstat -col /decoder dec.txt
func BenchmarkDecodeRequest(b *testing.B) {
	decoders := []struct {
		name   string
		decode func([]byte) (*inferenceRequest, error)
	}{{"jsonscan", decodeRequest}, {"encoding-json", decodeRequestStd}}
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

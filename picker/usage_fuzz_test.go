package picker

import (
	"encoding/json"
	"testing"
)

// FuzzUsageScan: any bytes, cut anywhere, scan to the same count as
// whole (and never panic); an answer encoding/json writes around any text
// scans to its usage's count.
func FuzzUsageScan(f *testing.F) {
	f.Add([]byte(`{"usage":{"completion_tokens":7}}`), uint32(7), uint(3))
	f.Add([]byte(`"completion_tokens":`), uint32(0), uint(0))
	f.Add([]byte("data: {\"output_tokens\" : 12}\n\n"), uint32(1<<31-1), uint(9))
	f.Add([]byte(`\"completion_tokens\":5`), uint32(42), uint(100))
	f.Fuzz(func(t *testing.T, data []byte, n uint32, cut uint) {
		c := int(cut % uint(len(data)+1))
		var whole, parts usageScan
		whole.feed(data)
		parts.feed(data[:c])
		parts.feed(data[c:])
		if whole.tokens() != parts.tokens() || whole.tokens() < 0 {
			t.Fatalf("whole %d, cut at %d %d", whole.tokens(), c, parts.tokens())
		}
		want := int(n % (usageMax + 1))
		var answer struct {
			Text  string `json:"text"`
			Usage struct {
				Prompt     int `json:"prompt_tokens"`
				Completion int `json:"completion_tokens"`
			} `json:"usage"`
			Tail string `json:"tail"`
		}
		answer.Text, answer.Tail = string(data), string(data)
		answer.Usage.Prompt, answer.Usage.Completion = len(data), want
		b, err := json.Marshal(answer)
		if err != nil {
			t.Fatal(err)
		}
		var u usageScan
		u.feed(b)
		if u.tokens() != want {
			t.Fatalf("%s: %d tokens, want %d", b, u.tokens(), want)
		}
	})
}

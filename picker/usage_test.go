package picker

import (
	"testing"
)

// TestUsageScan: the output token count is the last "completion_tokens"
// or "output_tokens" key's plain integer value, however the body is cut;
// the same bytes inside a string, a details object, or a value that is
// not a plain integer count nothing.
func TestUsageScan(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		want int
	}{
		{"chat", `{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":7,"total_tokens":10}}`, 7},
		{"spaces", "{\"usage\": {\"completion_tokens\" :\n 12 }}", 12},
		{"responses", `{"usage":{"input_tokens":1,"output_tokens":4,"output_tokens_details":{"reasoning_tokens":0}}}`, 4},
		{"details only", `{"completion_tokens_details":{"reasoning_tokens":3}}`, 0},
		{"in a string", `{"content":"\"completion_tokens\": 99","usage":{"completion_tokens":2}}`, 2},
		{"only in a string", `{"content":"say \"completion_tokens\":99 please"}`, 0},
		{"a value", `{"x":"completion_tokens","y":5}`, 0},
		{"stream, last wins", "data: {\"usage\":{\"completion_tokens\":1}}\n\ndata: {\"usage\":{\"completion_tokens\":3}}\n\ndata: [DONE]\n\n", 3},
		{"negative", `{"completion_tokens":-1}`, 0},
		{"fraction", `{"completion_tokens":3.5}`, 0},
		{"exponent", `{"completion_tokens":1e3}`, 0},
		{"too large", `{"completion_tokens":99999999999}`, 0},
		{"largest", `{"completion_tokens":2147483647}`, 2147483647},
		{"string value", `{"completion_tokens":"7"}`, 0},
		{"cut off", `{"completion_tokens":7`, 0},
		{"not json", "\x00\xff\"\"\"completion_tokens\"\"::1,", 0},
		{"empty", ``, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for cut := 0; cut <= len(tc.body); cut++ {
				var u usageScan
				u.feed([]byte(tc.body[:cut]))
				u.feed([]byte(tc.body[cut:]))
				if got := u.tokens(); got != tc.want {
					t.Fatalf("cut at %d: %d tokens, want %d", cut, got, tc.want)
				}
			}
		})
	}
}

// TestUsageScanAllocs: scanning allocates nothing.
func TestUsageScanAllocs(t *testing.T) {
	body := []byte(`{"usage":{"prompt_tokens":3,"completion_tokens":7}}`)
	var u usageScan
	if n := testing.AllocsPerRun(100, func() { u.feed(body) }); n != 0 {
		t.Fatalf("%v allocations per scan", n)
	}
}

package keys

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStreamUpstream(t *testing.T) {
	for _, tc := range []struct {
		kind Endpoint
		body string
		want bool
	}{
		{Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, true},
		{Completions, `{"model":"m","prompt":"p"}`, true},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`, false},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":false}`, true},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`, false},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":1}`, false},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`, true},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"n":2}`, false},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"n":1}`, true},
		// vLLM's pydantic models read an integral number as an integer.
		{Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"n":2.0}`, false},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"n":2e0}`, false},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1.0}`, false},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"n":1.0}`, true},
		// vLLM takes max_completion_tokens or, when it is 0 or null, max_tokens.
		{Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":0,"max_tokens":1}`, false},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":null,"max_tokens":1}`, false},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":5,"max_tokens":1}`, true},
		{Completions, `{"model":"m","prompt":"p","best_of":2}`, false},
		{Completions, `{"model":"m","prompt":"p","use_beam_search":true}`, false},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"prompt_logprobs":1}`, false},
		{Responses, `{"model":"m","input":"i"}`, false},
	} {
		req, err := Parse(tc.kind, []byte(tc.body))
		require.NoError(t, err, tc.body)
		assert.Equal(t, tc.want, StreamUpstream(tc.kind, req, []byte(tc.body)), tc.body)
	}
	assert.False(t, StreamUpstream(Chat, nil, nil), "no request read")
}

func TestStreamBody(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"model":"m"}`, `{"model":"m",` + StreamMembers + `}`},
		{" {\"model\":\"m\"} \n", `{"model":"m",` + StreamMembers + `}`},
		{`{}`, `{` + StreamMembers + `}`},
		{`{"model":"m","stream":false}`, `{"model":"m",` + StreamMembers + `}`},
		{`{"stream":false,"model":"m","stream_options":{"include_usage":false},"stream":null}`, `{"model":"m",` + StreamMembers + `}`},
		// A value naming "stream" is read whole, and kept as written.
		{`{"model":"m","prompt":"\"stream\": 1.50"}`, `{"model":"m","prompt":"\"stream\": 1.50",` + StreamMembers + `}`},
	} {
		got, err := StreamBody([]byte(tc.in))
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, string(got), tc.in)
	}
	for _, bad := range []string{``, `{`, `[]`, `"x"`, `{"stream":}`, `{"stream":1}x}`} {
		_, err := StreamBody([]byte(bad))
		assert.Error(t, err, "%q", bad)
	}
}

// FuzzStreamBody checks that a body StreamBody accepts becomes a JSON
// object asking for a stream with usage, keeping every other member.
func FuzzStreamBody(f *testing.F) {
	for _, s := range []string{`{"model":"m","messages":[{"role":"user","content":"hi"}]}`, `{"stream":false,"model":"m"}`, `{}`, ` {"a":1} `,
		`{"stream_options":{"include_usage":false},"x":[1,2]}`, `{"a":"\"stream"}`, `[]`, `{`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		in := append([]byte(nil), body...)
		out, err := StreamBody(body)
		assert.Equal(t, string(in), string(body), "body modified")
		if err != nil {
			return
		}
		var before map[string]any
		if json.Unmarshal(body, &before) != nil {
			return // the fast path does not check a body without "stream": the front has parsed it
		}
		var after map[string]any
		require.NoError(t, json.Unmarshal(out, &after), "%q -> %q", body, out)
		assert.Equal(t, true, after["stream"])
		assert.Equal(t, map[string]any{"include_usage": true}, after["stream_options"])
		for k, v := range before {
			if k != "stream" && k != "stream_options" {
				assert.Equal(t, v, after[k], "member %q", k)
			}
		}
	})
}
